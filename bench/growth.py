"""Growth: a rollout's status files and the status commit as its node count
grows (100, 1,000, 10,000 nodes by default).

    .venv/bin/python bench/growth.py [--sizes 100,1000,10000] [--commits 15]

For each size, the engine starts a dry-run rollout (batches of a tenth of
the nodes, selected by a label) and nodes of the first batch then succeed one at a time; each
step is written the way the daemon writes it (``status.changed_files``,
``dump_yaml``, ``GitStore.commit`` into a bare repository, compare-and-swap
of the branch). Sizes alternate within each round, so load on the machine
hits them alike.

Prints, per size: bytes of all the rollout's status files, the commit that
writes the whole status (the start), and the median commit of one node's
transition (the common case: the main file and one node page). Target:
both linear in the node count or better; the growth rows set the growth of
each figure against the growth of the node count (ratio under 1: better
than linear).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from _common import Row, announce, emit, make_bare, median, row

from reconciler.engine.step import RolloutInput, step_fleet
from reconciler.git.store import GitStore
from reconciler.protocol.observations import JobObservation, Observations
from reconciler.spec.model import Fleet, Node, RolloutSpec, Settings, Target
from reconciler.spec.rollout_status import RolloutStatus, changed_files, status_files
from reconciler.spec.safe_yaml import dump_yaml
from reconciler.spec.times import format_time

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
COMMIT = "c" * 40


class Rollout:
    """One rollout of ``size`` nodes, stepped by the engine, committed by a GitStore."""

    def __init__(self, root: Path, size: int) -> None:
        names = [f"n{i:05d}" for i in range(1, size + 1)]
        label = (("fleet", "bench"),)
        self.fleet = Fleet(tuple(Node(n, "http://127.0.0.1:9", label) for n in names))
        # A selector: nodeIds would be frozen into the main file, which every
        # transition rewrites (10,000 names: ~150 kB per commit).
        self.spec = RolloutSpec(
            name="grow",
            target=Target("hermes", "ollama", "llama3.1-8b"),
            selector=label,
            batch_size=max(1, size // 10),
        )
        bare = root / f"grow-{size}.git"
        make_bare(bare, {"README.md": b"growth bench\n"})
        self.store = GitStore.open(str(bare), "main")
        self.status: RolloutStatus | None = None
        self.jobs: dict[str, JobObservation] = {}
        self.pending: list[str] = []  # job ids sent and not answered
        self.now = T0

    def step(self) -> RolloutStatus:
        inp = RolloutInput("grow", self.spec, True, (), self.status, COMMIT, COMMIT, 0)
        result = step_fleet([inp], self.fleet, Settings(), Observations(jobs=self.jobs), self.now)
        self.pending += [job.job_id for job in result.effects]
        new = result.statuses["grow"]
        return new

    def commit(self, new: RolloutStatus) -> tuple[float, int]:
        """Write ``new`` as the daemon does; (seconds, bytes written)."""
        start = time.perf_counter()
        write, gone = changed_files(self.status, new)
        changes: dict[str, bytes | None] = {path: dump_yaml(data) for path, data in write.items()}
        changes.update(dict.fromkeys(gone))
        tip = self.store.tip("main")
        self.store.commit("main", tip, changes, "status: grow\n")
        seconds = time.perf_counter() - start
        self.status = new
        return seconds, sum(len(d) for d in changes.values() if d is not None)

    def one_node_succeeds(self) -> float:
        self.now += timedelta(seconds=1)
        job = self.pending.pop(0)
        self.jobs[job] = JobObservation(job, "succeeded", finished_at=format_time(self.now))
        seconds, _ = self.commit(self.step())
        return seconds

    def total_bytes(self) -> int:
        assert self.status is not None
        return sum(len(dump_yaml(d)) for d in status_files(self.status).values())


def measure(sizes: list[int], commits: int, rounds: int) -> list[Row]:
    start_s: dict[int, list[float]] = {n: [] for n in sizes}
    step_s: dict[int, list[float]] = {n: [] for n in sizes}
    size_b: dict[int, int] = {}
    with tempfile.TemporaryDirectory(prefix="bench-growth-") as tmp:
        for r in range(rounds):
            rollouts = {n: Rollout(Path(tmp) / f"r{r}", n) for n in sizes}
            order = sizes if r % 2 == 0 else sizes[::-1]
            for n in order:
                seconds, _ = rollouts[n].commit(rollouts[n].step())
                start_s[n].append(seconds)
            for _ in range(commits):
                for n in order:
                    step_s[n].append(rollouts[n].one_node_succeeds())
            for n in sizes:
                size_b[n] = rollouts[n].total_bytes()
    rows: list[Row] = []
    base = sizes[0]
    for n in sizes:
        print(
            f"{n:>6,} nodes: status files {size_b[n] / 1e3:,.0f} kB ({size_b[n] / n:.0f} B/node), "
            f"start commit {median(start_s[n]) * 1e3:.1f} ms, one transition "
            f"{median(step_s[n]) * 1e3:.2f} ms (median of {len(step_s[n])})",
            flush=True,
        )
        rows += [
            row(f"growth {n:,} nodes: status files", size_b[n] / 1e3, "kB"),
            row(
                f"growth {n:,} nodes: commit writing the whole status",
                median(start_s[n]) * 1e3,
                "ms",
            ),
            row(
                f"growth {n:,} nodes: commit of one node transition", median(step_s[n]) * 1e3, "ms"
            ),
        ]
    for n in sizes[1:]:
        grew = n / base
        rows += [
            row(
                f"growth {base:,} -> {n:,} nodes: status size",
                size_b[n] / size_b[base],
                "x",
                grew,
                "linear",
            ),
            row(
                f"growth {base:,} -> {n:,} nodes: whole-status commit",
                median(start_s[n]) / median(start_s[base]),
                "x",
                grew,
                "linear",
            ),
            row(
                f"growth {base:,} -> {n:,} nodes: one-transition commit",
                median(step_s[n]) / median(step_s[base]),
                "x",
                grew,
                "linear",
            ),
        ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--commits", type=int, default=15, help="one-node commits per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="100, 1,000 nodes; 1 round")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.commits, args.rounds = "100,1000", 5, 1
    sizes = [int(s) for s in args.sizes.split(",")]
    announce(f"growth: status files and commits for rollouts of {args.sizes} nodes")
    emit(measure(sizes, args.commits, args.rounds))


if __name__ == "__main__":
    main()
