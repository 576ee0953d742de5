"""End to end at scale: one dry-run rollout over a whole generated fleet,
driven by the real daemon process against the simulated fleet.

    .venv/bin/python bench/fleet.py                      # 10,000 nodes, batchSize 1,000
    .venv/bin/python bench/fleet.py --nodes 1000 --batch 100 --runs 1
    .venv/bin/python bench/fleet.py --artifacts --runs 1 --with-parts   # CPU per job / its parts

Per run: a bare repository with N node files is generated, the sim fleet
serves N nodes that succeed after ``--delay`` seconds, and
``python -m reconciler run --repo BARE --key KEY --interval 0.2s`` is
started and left to make its first (empty) pass. Then a rollout commit is
written into the bare repository and the clock runs until its committed
status says ``completed``.

Figures (median over ``--runs`` runs):

- wall time from the rollout commit to the committed ``completed``;
- daemon CPU seconds over that time (/proc/PID/stat, user + system), and
  the simulated fleet's (one process serving every node);
- daemon peak memory (VmHWM from /proc/PID/status, read before it exits:
  includes start-up and parsing all node files);
- status commits the daemon made for the rollout;
- repository growth: bytes under ``objects/`` after the rollout minus
  before it, as the daemon left them (loose objects) and after ``git gc``
  (both sides gc'd);
- daemon overhead per node: (wall time - batches x delay) / nodes, i.e.
  everything that is not the simulated health wait.

Targets: overhead under 1 ms per node, peak memory under 300 MB, repository
growth under 5 MB.

``--artifacts``: the rollout's target has a model artifact, so every node is
staged (a stage job, answered after ``--delay`` too) before its apply, with
``stage: {ahead: 1, maxConcurrent: BATCH}``. Staging the next batch overlaps
the current batch's apply, so only the first batch's stage adds a wait: the
overhead is (wall time - (batches + 1) x delay) / nodes. Target: under 0.5 ms.

``--with-parts``: before and after each run, the parts every job needs
measured alone in this process (``bench/job_parts.py``: signing, h11 both ways, parsing
the two answers, checking their signatures), and the daemon's CPU per job
(its CPU over the run / the jobs the simulated fleet executed) against
their sum, with the load average. Target with ``--artifacts``: at most 2.
Each run also prints the daemon's CPU by thread (the main thread runs the
passes; the agent client's thread is the busiest other one).

``--standby``: a live rollout with ``standby: {keepPrevious: untilSoaked}``
(docs/rollouts.md#warm-standby): every simulated node switches slots, and
the daemon sends each its release job as it passes. The run ends when the
rollout is completed and every node's release was executed; the figures
add the release jobs executed and the time from completed to the last one.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import job_parts
import pygit2
from _common import (
    Row,
    SimFleetProcess,
    announce,
    commit_files,
    cpu_seconds,
    dir_bytes,
    emit,
    first_parent_count,
    git,
    machine_busy_seconds,
    make_bare,
    median,
    node_text,
    peak_rss_mb,
    rollout_text,
    row,
    start_daemon,
    status_data,
    wait_for,
)

from reconciler.protocol.evidence import derived_agent_key
from reconciler.protocol.signing import generate_key

COMPLETED = re.compile(rb"^phase: (completed|failed|aborted)$", re.MULTILINE)
# --with-parts: the parts of a job measured alone before and after each run,
# as bench/job_parts.py does (median of its rounds), averaged.
PARTS_JOBS = 10_000
PARTS_ROUNDS = 3
KEY_SEED = "bench-fleet"  # per-node agent keys of the simulated fleet


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of a live process, by
    thread id, the main thread as "main" (Linux /proc; Python 3.11 does not
    name its threads there)."""
    found: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # the thread ended meanwhile
        name = "main" if task.name == str(pid) else task.name
        found[name] = (int(fields[11]) + int(fields[12])) / tick
        found[name + " sys"] = int(fields[12]) / tick
    return found


def one_run(
    root: Path,
    nodes: int,
    batch: int,
    delay: float,
    interval: str,
    timeout: float,
    profile: Path | None = None,
    wall_clock: bool = False,
    artifacts: bool = False,
    standby: bool = False,
) -> dict[str, float]:
    private, public = generate_key(root / "keys")
    names = [f"n{i:05d}" for i in range(1, nodes + 1)]
    # Each simulated node signs its answers and its node file names its key, so
    # the daemon checks every answer, as in production (docs/trust.md).
    sim = SimFleetProcess(root / "sim", names, public, delay, key_seed=KEY_SEED)
    daemon: subprocess.Popen[bytes] | None = None
    spies: list[subprocess.Popen[bytes]] = []
    try:
        bare = root / "fleet.git"
        files = {
            f"nodes/{n}.yaml": node_text(
                n,
                sim.url,
                {"fleet": "bench", "zone": f"z{i % 4}"},
                derived_agent_key(KEY_SEED, n).public_openssh,
            )
            for i, n in enumerate(names)
        }
        make_bare(bare, files)
        git("gc", "-q", cwd=bare)
        daemon = start_daemon(root, bare, private, interval)
        # The first pass writes the (empty) dashboard: the daemon is up and idle.
        repo = pygit2.Repository(str(bare))

        def dashboard() -> bool:
            tip = repo.references["refs/heads/main"].peel(pygit2.Commit)
            return "status" in tip.tree

        wait_for(dashboard, 120, 0.1)
        time.sleep(0.3)
        if profile is not None:
            # Both processes, every thread: the daemon into FILE.N.txt, the
            # simulated fleet into FILE.sim.N.txt. On-CPU samples as collapsed
            # stacks; with --profile-wall, wall-clock samples (idle included)
            # in speedscope's format, whose samples keep their order: a timeline.
            spy_exe = Path(sys.executable).with_name("py-spy")
            form = ["--idle", "--format", "speedscope"] if wall_clock else ["--format", "raw"]
            for pid, out in (
                (daemon.pid, profile),
                (sim.process.pid, profile.with_suffix(".sim" + profile.suffix)),
            ):
                spies.append(subprocess.Popen(
                    [str(spy_exe) if spy_exe.exists() else "py-spy", "record",
                     "--pid", str(pid), "--threads", *form, "--rate", "200",
                     "--output", str(out)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                ))  # fmt: skip
            time.sleep(1.0)
        sim_cpu0 = cpu_seconds(sim.process.pid)
        before = dir_bytes(bare / "objects")
        busy0 = machine_busy_seconds()
        cpu0 = cpu_seconds(daemon.pid)
        threads0 = thread_cpu(daemon.pid)
        started = time.perf_counter()
        text = rollout_text("big", selector={"fleet": "bench"}, batch=batch)
        if artifacts:
            text = staged(text, batch)
        if standby:
            text += b"  live: true\n  standby: {keepPrevious: untilSoaked}\n"
        rollout = commit_files(repo, {"rollouts/big.yaml": text}, "Roll the whole fleet")

        def done() -> bool:
            data = status_data(bare, "big")
            return data is not None and COMPLETED.search(data) is not None

        finished = wait_for(done, timeout)
        released = finished
        if standby:

            def all_released() -> bool:
                executed = sim.stats()["executed"]
                return sum(1 for j in executed if j.startswith("release-")) >= nodes

            released = wait_for(all_released, timeout, 0.2)
        cpu = cpu_seconds(daemon.pid) - cpu0
        threads = {
            name: spent - threads0.get(name, 0.0) for name, spent in thread_cpu(daemon.pid).items()
        }
        sim_cpu = cpu_seconds(sim.process.pid) - sim_cpu0
        # What other work took of the machine meanwhile (this script's polling included).
        other = machine_busy_seconds() - busy0 - cpu - sim_cpu
        peak = peak_rss_mb(daemon.pid)
        data = status_data(bare, "big") or b""
        phase = COMPLETED.search(data)
        if phase is None or phase.group(1) != b"completed":
            raise RuntimeError(
                f"rollout ended {phase.group(1).decode() if phase else '?'}; see the log"
            )
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        if spies:
            spies[0].wait(30)
        tip = git("rev-parse", "main", cwd=bare)
        commits = first_parent_count(bare, tip, rollout)
        loose = dir_bytes(bare / "objects") - before
        git("gc", "-q", cwd=bare)
        packed = dir_bytes(bare / "objects") - before
        wall = finished - started
        batches = -(-nodes // batch) + (1 if artifacts else 0)  # waits not overlapped
        stats = sim.stats()["totals"]
        return {
            "wall": wall,
            "cpu": cpu,
            "peak": peak,
            "commits": commits,
            "loose": loose,
            "packed": packed,
            "overhead": (wall - batches * delay) / nodes,
            "jobs": stats["executed"],
            "sim_cpu": sim_cpu,
            "other": other / (wall * (os.cpu_count() or 1)),
            **{f"thread {name}": spent for name, spent in threads.items() if spent > 0},
            "releases": sum(1 for j in sim.stats()["executed"] if j.startswith("release-")),
            "release_tail": released - finished,
        }
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        sim.stop()
        for spy in spies:
            spy.wait(30)


def staged(rollout: bytes, batch: int) -> bytes:
    """The rollout with an artifact on its target and a stage pipeline."""
    artifact = (
        "artifacts: [{name: weights, url: 'https://mirror.example/w.gguf', "
        f"sha256: {'0f' * 32}, size: 4920734976}}]"
    )
    head, sep, rest = rollout.partition(b"  target: ")
    target, newline, tail = rest.partition(b"\n")
    assert sep and target.endswith(b"}")
    target = target[:-1] + b", " + artifact.encode() + b"}"
    stage = f"  stage: {{ahead: 1, maxConcurrent: {batch}}}\n".encode()
    return head + sep + target + newline + tail + stage


def measure(
    nodes: int,
    batch: int,
    delay: float,
    runs: int,
    interval: str = "0.2s",
    profile: Path | None = None,
    wall_clock: bool = False,
    artifacts: bool = False,
    with_parts: bool = False,
    standby: bool = False,
) -> list[Row]:
    results = []
    for k in range(runs):
        # The parts alone just before the run and just after it: the load moves.
        before = (
            job_parts.measure(PARTS_JOBS, PARTS_ROUNDS, artifacts=artifacts) if with_parts else {}
        )
        with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
            r = one_run(
                Path(tmp),
                nodes,
                batch,
                delay,
                interval,
                timeout=60 + nodes * 0.05,
                profile=profile.with_suffix(f".{k + 1}.txt") if profile else None,
                wall_clock=wall_clock,
                artifacts=artifacts,
                standby=standby,
            )
        print(
            f"run {k + 1}: {r['wall']:.2f} s wall, {r['cpu']:.2f} s daemon CPU, "
            f"{r['peak']:.0f} MB peak, {r['commits']:.0f} commits, "
            f"+{r['loose'] / 1e6:.2f} MB loose / +{r['packed'] / 1e6:.2f} MB after gc, "
            f"{r['overhead'] * 1e3:.3f} ms/node overhead, {r['jobs']} jobs executed, sim fleet CPU {r['sim_cpu']:.2f} s, "
            f"other work {r['other'] * 100:.0f}% of the CPUs",
            flush=True,
        )
        threads = sorted((k for k in r if k.startswith("thread ")), key=lambda k: -r[k])
        print(
            "  daemon CPU by thread: " + ", ".join(f"{k[7:]} {r[k]:.2f} s" for k in threads),
            flush=True,
        )
        if with_parts:
            after = job_parts.measure(PARTS_JOBS, PARTS_ROUNDS, artifacts=artifacts)
            parts = {name: (ms + after[name]) / 2 for name, ms in before.items()}
            r["floor"] = sum(parts.values())
            r["per_job"] = r["cpu"] / r["jobs"] * 1e3
            print(
                f"  per job: daemon CPU {r['per_job']:.3f} ms, its parts alone "
                f"{r['floor']:.3f} ms ("
                + ", ".join(f"{name} {ms:.3f}" for name, ms in parts.items())
                + f"), ratio {r['per_job'] / r['floor']:.2f}; load average "
                f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}",
                flush=True,
            )
        results.append(r)

    def m(key: str) -> float:
        return median([r[key] for r in results])

    batches = -(-nodes // batch) + (1 if artifacts else 0)
    floor = batches * delay
    tag = f"{nodes:,} nodes/{batch:,}" + (", staged" if artifacts else "")
    tag += ", standby" if standby else ""
    target = 0.5 if artifacts else 1.0
    ratio = []
    if with_parts:
        ratio = [
            row(f"fleet {tag}: daemon CPU per job", m("per_job"), "ms"),
            row(f"fleet {tag}: its parts alone (job_parts)", m("floor"), "ms"),
            row(
                f"fleet {tag}: daemon CPU per job / its parts",
                median([r["per_job"] / r["floor"] for r in results]),
                "x",
                2.0,
                "target <",
            ),
        ]
    return [
        *ratio,
        row(f"fleet {tag}: wall to completed", m("wall"), "s", floor, "health waits"),
        row(f"fleet {tag}: daemon CPU", m("cpu"), "s"),
        row(f"fleet {tag}: daemon CPU per node", m("cpu") / nodes * 1e3, "ms"),
        row(f"fleet {tag}: simulated fleet CPU", m("sim_cpu"), "s"),
        row(
            f"fleet {tag}: daemon overhead per node", m("overhead") * 1e3, "ms", target, "target <"
        ),
        row(f"fleet {tag}: daemon peak memory (VmHWM)", m("peak"), "MB", 300.0, "target <"),
        row(f"fleet {tag}: status commits", m("commits"), "commits"),
        row(f"fleet {tag}: repo growth, loose", m("loose") / 1e6, "MB", 5.0, "target <"),
        row(f"fleet {tag}: repo growth, after git gc", m("packed") / 1e6, "MB", 5.0, "target <"),
    ] + (
        [
            row(f"fleet {tag}: release jobs executed", m("releases"), "jobs"),
            row(f"fleet {tag}: completed to last release", m("release_tail"), "s"),
        ]
        if standby
        else []
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--delay", type=float, default=0.5, help="sim fleet answer delay, s")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1,000 nodes, batches of 250, 1 run")
    parser.add_argument(
        "--artifacts", action="store_true", help="a model artifact: every node staged first"
    )
    parser.add_argument(
        "--with-parts",
        action="store_true",
        help="after each run, measure the parts of a job alone (bench/job_parts.py) "
        "and print the daemon's CPU per job against their sum",
    )
    parser.add_argument(
        "--standby", action="store_true", help="live, standby untilSoaked: a release per node"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="record the daemon and the simulated fleet with py-spy (on CPU) into "
        "FILE.N.txt and FILE.N.sim.txt",
    )
    parser.add_argument(
        "--profile-wall",
        action="store_true",
        help="with --profile: wall-clock samples in speedscope's format (a timeline)",
    )
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.batch, args.runs = 1_000, 250, 1
    announce(f"fleet: {args.nodes:,} nodes, batchSize {args.batch:,}, delay {args.delay} s")
    emit(
        measure(
            args.nodes,
            args.batch,
            args.delay,
            args.runs,
            profile=args.profile,
            wall_clock=args.profile_wall,
            artifacts=args.artifacts,
            with_parts=args.with_parts,
            standby=args.standby,
        )
    )


if __name__ == "__main__":
    main()
