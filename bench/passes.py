"""Many rollouts: what one reconcile pass costs while 1,000 rollouts run at
once, and what an idle pass costs once they are done.

    .venv/bin/python bench/passes.py                 # 1,000 rollouts x 10 nodes
    .venv/bin/python bench/passes.py --quick
    .venv/bin/python bench/passes.py --plain --rollouts 50 --sizes 100,1000 --rounds 3

The daemon runs in this process (``reconciler.daemon.loop.Daemon`` with a
``GitStore`` on a bare repository and an ``AgentClient``), so each
``run_pass()`` is timed on its own; the simulated fleet (10,000 nodes,
answering after ``--delay`` seconds) is a real process on 127.0.0.1.

1. Running: 1,000 dry-run rollouts of 10 nodes each (batchSize 1, the
   default: ten batches each), pushed in one commit, stepped by passes
   0.2 s apart until all complete. Prints the first pass (1,000 starts,
   1,000 jobs), and the median and p95 of all passes while they run. Then idle passes on the
   1,000 finished rollouts.
2. Idle at scale: repositories holding 100, 1,000 and 5,000 finished
   rollouts (in one batch each; statuses made by the engine itself, as a
   daemon would have written them), one daemon each; after its first (cold) pass, idle passes
   are timed alternating between the sizes (nothing changed, nothing parsed
   again, no commit), then passes that each start one new 10-node rollout.

``--plain`` runs every daemon in plain mode (``run --plain``: each pass
reads and steps everything), to show what the shortcuts are worth.

Targets: idle pass under 50 ms; a pass starting one rollout among 5,000
finished under 30 ms: pass cost growing with the rollouts that changed, not
with the number that exist.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pygit2
from _common import (
    Row,
    SimFleetProcess,
    announce,
    commit_files,
    emit,
    make_bare,
    median,
    node_text,
    p95,
    rollout_text,
    row,
)

from reconciler.daemon.agent_client import AgentClient
from reconciler.daemon.logs import EventLog
from reconciler.daemon.loop import Daemon, PassOutcome
from reconciler.engine.step import RolloutInput, step_fleet
from reconciler.git.store import GitStore
from reconciler.protocol.observations import JobObservation, Observations
from reconciler.protocol.signing import generate_key, load_private_key
from reconciler.spec.documents import ParsedFile, assemble, parse_file
from reconciler.spec.rollout_status import RolloutStatus, status_files
from reconciler.spec.safe_yaml import dump_yaml
from reconciler.spec.times import format_time

GROUP = 10  # nodes per rollout
ONE_CHANGE_ROUNDS = 5
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def node_files(count: int, url: str) -> dict[str, bytes]:
    """``n00001`` ... with label ``group: gNNNN``, ten nodes per group."""
    return {
        f"nodes/n{i:05d}.yaml": node_text(f"n{i:05d}", url, {"group": f"g{(i - 1) // GROUP:04d}"})
        for i in range(1, count + 1)
    }


def rollout_files(count: int, groups: int, batch: int, first: int = 0) -> dict[str, bytes]:
    return {
        f"rollouts/r{i:05d}.yaml": rollout_text(
            f"r{i:05d}", selector={"group": f"g{i % groups:04d}"}, batch=batch
        )
        for i in range(first, first + count)
    }


def quiet_log(root: Path) -> EventLog:
    return EventLog(stream=open(root / "daemon.log", "a"))


def make_daemon(bare: Path, key: Path, root: Path, plain: bool = False) -> Daemon:
    store = GitStore.open(str(bare), "main")
    client = AgentClient(load_private_key(key), concurrency=64)
    return Daemon(store, client, log=quiet_log(root), plain=plain)


def settle(daemon: Daemon, timeout: float = 60) -> None:
    """Pass until no rollout is active (untimed)."""
    deadline = time.monotonic() + timeout
    while daemon.run_pass().active:
        if time.monotonic() > deadline:
            raise RuntimeError("rollouts still active")
        time.sleep(0.1)


def timed_pass(daemon: Daemon) -> tuple[float, PassOutcome]:
    start = time.perf_counter()
    outcome = daemon.run_pass()
    return time.perf_counter() - start, outcome


# -- 1. running --------------------------------------------------------------


def running(
    root: Path,
    sim: SimFleetProcess,
    key: Path,
    rollouts: int,
    nodes: int,
    batch: int,
    plain: bool = False,
) -> tuple[list[Row], Daemon]:
    bare = root / "running.git"
    make_bare(bare, node_files(nodes, sim.url))
    daemon = make_daemon(bare, key, root, plain)
    daemon.run_pass()  # the empty dashboard
    repo = pygit2.Repository(str(bare))
    commit_files(repo, rollout_files(rollouts, nodes // GROUP, batch), f"{rollouts} rollouts")
    durations: list[float] = []
    commits = 0
    started = time.perf_counter()
    while True:
        seconds, outcome = timed_pass(daemon)
        durations.append(seconds)
        commits += outcome.commit is not None
        if not outcome.active:
            break
        if time.perf_counter() - started > 600:
            raise RuntimeError("rollouts not done in 10 minutes")
        time.sleep(0.2)
    wall = time.perf_counter() - started
    first, rest = durations[0], durations[1:]
    idle = [timed_pass(daemon) for _ in range(20)]
    assert all(o.commit is None for _, o in idle), "an idle pass committed"
    print(
        f"{rollouts} rollouts x {GROUP} nodes, batchSize {batch}: all completed in {wall:.1f} s, "
        f"{len(durations)} passes, {commits} commits; first pass {first:.2f} s; "
        f"later passes median {median(rest) * 1e3:.0f} ms, p95 {p95(rest) * 1e3:.0f} ms, "
        f"max {max(rest) * 1e3:.0f} ms",
        flush=True,
    )
    tag = f"{rollouts:,} rollouts x {GROUP}"
    rows = [
        row(f"passes {tag}: first pass ({rollouts:,} starts)", first, "s"),
        row(f"passes {tag}: pass while running, median", median(durations) * 1e3, "ms"),
        row(f"passes {tag}: pass while running, p95", p95(durations) * 1e3, "ms"),
        row(f"passes {tag}: wall until all completed", wall, "s"),
        row(
            f"passes {tag}: idle pass once all completed",
            median([s for s, _ in idle]) * 1e3,
            "ms",
            50.0,
            "target <",
        ),
    ]
    return rows, daemon


# -- 2. idle at scale --------------------------------------------------------


def finished_statuses(
    nodes: list[ParsedFile], rollouts: dict[str, bytes], commit: str, author: str
) -> dict[str, RolloutStatus]:
    """Every rollout in ``rollouts`` stepped by the engine to ``completed``,
    each on its own (they may share nodes: they ran one after another)."""
    docs = assemble([*nodes, *(parse_file(p, d) for p, d in rollouts.items())])
    done: dict[str, RolloutStatus] = {}
    for name, spec in sorted(docs.rollouts.items()):
        status: RolloutStatus | None = None
        now = T0
        jobs: dict[str, JobObservation] = {}
        for _ in range(20):
            inp = RolloutInput(name, spec, True, (), status, commit, commit, 1, author)
            step = step_fleet([inp], docs.fleet, docs.settings, Observations(jobs=jobs), now)
            status = step.statuses.get(name, status)
            now += timedelta(seconds=5)
            for job in step.effects:
                jobs[job.job_id] = JobObservation(
                    job.job_id, "succeeded", finished_at=format_time(now)
                )
            if status is not None and status.terminal:
                break
        assert status is not None and status.phase == "completed", (name, status)
        done[name] = status
    return done


def finished_repo(
    root: Path, url: str, count: int, nodes: int, batch: int, parsed: list[ParsedFile] | None = None
) -> tuple[Path, pygit2.Repository]:
    """A bare repository holding ``count`` rollouts and their completed
    statuses. ``parsed``: the node files already parsed (the same for every size)."""
    bare = root / f"finished-{count}.git"
    files = node_files(nodes, url)
    make_bare(bare, files)
    repo = pygit2.Repository(str(bare))
    rollouts = rollout_files(count, nodes // GROUP, batch)
    spec_commit = commit_files(repo, rollouts, f"{count} rollouts")
    author = "Bench Operator <bench@example.com>"
    if parsed is None:
        parsed = [parse_file(p, d) for p, d in files.items()]
    statuses = finished_statuses(parsed, rollouts, spec_commit, author)
    written: dict[str, bytes | None] = {}
    for status in statuses.values():
        for path, record in status_files(status).items():
            written[path] = dump_yaml(record)
    commit_files(repo, written, f"status of {count} finished rollouts")
    return bare, repo


def idle_at_scale(
    root: Path,
    sim: SimFleetProcess,
    key: Path,
    sizes: list[int],
    nodes: int,
    rounds: int,
    plain: bool = False,
) -> list[Row]:
    daemons: dict[int, tuple[Daemon, pygit2.Repository]] = {}
    cold: dict[int, float] = {}
    parsed = [parse_file(p, d) for p, d in node_files(nodes, sim.url).items()]
    for count in sizes:
        # One batch each: how the finished rollouts got there does not matter here.
        bare, repo = finished_repo(root, sim.url, count, nodes, GROUP, parsed)
        daemon = make_daemon(bare, key, root, plain)
        cold[count], outcome = timed_pass(daemon)
        second, again = timed_pass(daemon)
        print(
            f"{count:,} finished rollouts: cold pass {cold[count]:.2f} s "
            f"(commit: {bool(outcome.commit)}), second pass {second * 1e3:.1f} ms "
            f"(commit: {bool(again.commit)})",
            flush=True,
        )
        daemons[count] = (daemon, repo)
    idle: dict[int, list[float]] = {count: [] for count in sizes}
    for k in range(rounds):
        order = sizes if k % 2 == 0 else sizes[::-1]
        for count in order:
            seconds, outcome = timed_pass(daemons[count][0])
            assert outcome.commit is None, "an idle pass committed"
            idle[count].append(seconds)
    # Passes with one change: a new 10-node rollout among the finished ones,
    # sizes alternating; between rounds the new rollouts finish untimed.
    starts: dict[int, list[float]] = {count: [] for count in sizes}
    cpu: dict[int, list[float]] = {count: [] for count in sizes}
    for k in range(ONE_CHANGE_ROUNDS):
        for count in sizes if k % 2 == 0 else sizes[::-1]:
            daemon, repo = daemons[count]
            new = rollout_files(1, nodes // GROUP, GROUP, first=count + k)
            commit_files(repo, new, "one more")
            used = time.process_time()
            seconds, outcome = timed_pass(daemon)
            cpu[count].append(time.process_time() - used)
            assert outcome.commit is not None and outcome.jobs_sent == GROUP, outcome
            starts[count].append(seconds)
        for count in sizes:
            settle(daemons[count][0])
    one = {count: median(starts[count]) for count in sizes}
    rows: list[Row] = []
    base = sizes[0]
    for count in sizes:
        m = median(idle[count])
        print(
            f"{count:>6,} finished: idle pass median {m * 1e3:.1f} ms, p95 "
            f"{p95(idle[count]) * 1e3:.1f} ms over {rounds}; pass starting one new rollout "
            f"median {one[count] * 1e3:.0f} ms over {ONE_CHANGE_ROUNDS}",
            flush=True,
        )
        rows.append(
            row(f"passes: idle pass, {count:,} finished rollouts", m * 1e3, "ms", 50.0, "target <")
        )
    for count in sizes[1:]:
        growth = median(idle[count]) / median(idle[base])
        rows.append(
            row(
                f"passes: idle pass growth, {base:,} -> {count:,} finished",
                growth,
                "x",
                count / base,
                "rollouts grew",
            )
        )
    for count in sizes:
        rows.append(
            row(
                f"passes: pass starting 1 new rollout, {count:,} finished, median",
                one[count] * 1e3,
                "ms",
                30.0 if count == max(sizes) else None,
                "target <" if count == max(sizes) else "",
            )
        )
    for count in sizes:
        # The daemon's CPU (all its threads): steadier than wall time on a shared machine.
        rows.append(
            row(
                f"passes: pass starting 1 new rollout, {count:,} finished, CPU median",
                median(cpu[count]) * 1e3,
                "ms",
            )
        )
    for daemon, _ in daemons.values():
        daemon.client.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1_000)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--sizes", default="100,1000,5000", help="finished rollouts, idle passes")
    parser.add_argument("--rounds", type=int, default=15, help="idle passes per size")
    parser.add_argument(
        "--quick", action="store_true", help="100 rollouts of 1,000 nodes, batchSize 5"
    )
    parser.add_argument(
        "--plain", action="store_true", help="daemons in plain mode (run --plain): no shortcuts"
    )
    args = parser.parse_args()
    if args.quick:
        args.rollouts, args.nodes, args.sizes, args.rounds = 100, 1_000, "10,100,300", 5
        args.batch, args.delay = 5, 0.2
    sizes = [int(s) for s in args.sizes.split(",")]
    announce(
        f"passes: {args.rollouts:,} rollouts x {GROUP} nodes of {args.nodes:,}, "
        f"batchSize {args.batch}, delay {args.delay} s" + (", plain mode" if args.plain else "")
    )
    rows: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="bench-passes-") as tmp:
        root = Path(tmp)
        private, public = generate_key(root / "keys")
        names = [f"n{i:05d}" for i in range(1, args.nodes + 1)]
        sim = SimFleetProcess(root / "sim", names, public, args.delay)
        try:
            found, daemon = running(
                root, sim, private, args.rollouts, args.nodes, args.batch, args.plain
            )
            daemon.client.close()
            rows += found
            rows += idle_at_scale(root, sim, private, sizes, args.nodes, args.rounds, args.plain)
        finally:
            sim.stop()
    emit(rows)
    sys.stdout.flush()
    os._exit(0)  # agent client threads need not be joined


if __name__ == "__main__":
    main()
