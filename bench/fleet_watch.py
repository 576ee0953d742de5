"""Fleet watch: one sweep of every node's heartbeat (docs/operating.md),
and what a sweep does to the passes that run meanwhile.

Starts ``reconciler sim-fleet`` with N nodes as a subprocess (every job
hangs, so a live rollout keeps jobs in flight) and, in this process, the
real ``Daemon`` on a bare repository whose N node files point at it, with
a live rollout of ``--batch`` nodes started. Then:

1. sweeps alone: ``FleetWatch.sweep`` of all N nodes (the daemon's own
   ``AgentClient``: its keep-alive connections and concurrency cap), wall
   time and this process's CPU time, which include deciding (desired
   state, the rules over N sightings, the changed fleet files rendered),
   also timed apart;
2. passes alone: ``run_pass`` reading the rollout's in-flight jobs, one
   every ``--gap`` seconds, as a running rollout's passes come;
3. the same passes while a sweep runs in the background.

    .venv/bin/python bench/fleet_watch.py                  # 10,000 nodes
    .venv/bin/python bench/fleet_watch.py --quick          # 1,000 nodes
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from _common import emit, make_bare, median, node_text, rollout_text, row

from reconciler.daemon.agent_client import AgentClient
from reconciler.daemon.loop import Daemon
from reconciler.engine.fleet import desired_state, next_fleet
from reconciler.git.store import GitStore
from reconciler.protocol.signing import generate_key, load_private_key
from reconciler.spec.fleet_status import fleet_to_record
from reconciler.spec.safe_yaml import dump_yaml

WALL_TARGET = 5.0  # seconds for a sweep of 10,000 nodes
CPU_TARGET = 1.0  # daemon CPU seconds for the same
PASS_SLOWDOWN_TARGET = 1.10  # passes during a sweep within 10% of their usual time


def start_fleet(tmp: Path, nodes: int, pub: Path) -> tuple[subprocess.Popen[str], str]:
    script = tmp / "behaviour.yaml"
    script.write_text("default: hang\n")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "reconciler", "sim-fleet",
            "--nodes", str(nodes),
            "--state-dir", str(tmp / "sim"),
            "--trust-key", str(pub),
            "--behaviour", str(script),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise SystemExit(f"sim-fleet did not start: {line!r}")
    return proc, "http://" + line.split()[-1]


def names(count: int) -> list[str]:
    return [f"sim-{i:04d}" for i in range(1, count + 1)]


APPLYING: list[float] = []  # passes that applied a finished sweep


def timed_passes(daemon: Daemon, count: int, gap: float) -> list[float]:
    """Passes one ``gap`` apart; those that apply a finished sweep are kept
    apart in ``APPLYING`` (they run after a sweep, not during one)."""
    times = []
    for _ in range(count):
        applies = daemon.fleet_watch.pending() is not None
        start = time.perf_counter()
        daemon.run_pass()
        (APPLYING if applies else times).append(time.perf_counter() - start)
        time.sleep(gap)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=200, help="jobs in flight for the passes")
    parser.add_argument("--sweeps", type=int, default=5)
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.2, help="seconds between passes")
    parser.add_argument("--quick", action="store_true", help="1,000 nodes, fewer runs")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.sweeps, args.passes, args.batch = 1000, 3, 10, 100

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        private, public = generate_key(tmp / "keys")
        fleet, url = start_fleet(tmp, args.nodes, public)
        try:
            all_names = names(args.nodes)
            files = {f"nodes/{n}.yaml": node_text(n, url, {"role": "gpu"}) for n in all_names}
            chosen = "[" + ", ".join(all_names[: args.batch]) + "]"
            files["rollouts/bench.yaml"] = rollout_text(
                "bench", selector={"role": "gpu"}, batch=args.batch, live="true"
            ).replace(b"  selector: {role: gpu}\n", f"  nodeIds: {chosen}\n".encode())
            bare = tmp / "fleet.git"
            make_bare(bare, files)
            client = AgentClient(load_private_key(private), concurrency=64)
            daemon = Daemon(GitStore.open(str(bare), "main"), client)
            first = daemon.run_pass()  # starts the rollout: args.batch jobs, all hanging
            print(f"first pass: {first.jobs_sent} jobs sent, {first.transitions} transitions")
            watch = daemon.fleet_watch
            pairs = [(url, n) for n in all_names]
            client.read_heartbeats(pairs[:200])  # warm up: connections and code paths

            # 1. sweeps alone
            walls, cpus = [], []
            sweep = None
            for _ in range(args.sweeps):
                cpu0 = time.process_time()
                sweep = watch.sweep(pairs)
                cpus.append(time.process_time() - cpu0)
                walls.append(sweep.seconds)
            assert sweep is not None
            answered = sum(1 for s in sweep.sightings if s.heartbeat is not None)
            statuses = daemon.soft.reading.last_readable.values()
            decide_cpu = []
            for _ in range(3):
                cpu0 = time.process_time()
                fleet_status = next_fleet(
                    None,
                    sweep.sightings,
                    desired_state(statuses),
                    120,
                    datetime.now(UTC).replace(microsecond=0),
                )
                dump_yaml(fleet_to_record(fleet_status))
                decide_cpu.append(time.process_time() - cpu0)
            print(
                f"sweep of {args.nodes:,} nodes ({answered:,} answered): wall "
                f"{median(walls):.2f}s, CPU {median(cpus):.2f}s; decide + render "
                f"{median(decide_cpu) * 1000:.0f} ms CPU"
            )

            # 2. passes alone, then 3. the same passes during sweeps
            alone = timed_passes(daemon, args.passes, args.gap)
            during: list[float] = []
            sweep_walls: list[float] = []
            while len(during) < args.passes:
                done = threading.Event()
                result: list[float] = []

                def background(done: threading.Event, result: list[float]) -> None:
                    result.append(watch.sweep(pairs).seconds)
                    done.set()

                thread = threading.Thread(target=background, args=(done, result))
                thread.start()
                time.sleep(args.gap / 2)
                while not done.is_set() and len(during) < args.passes:
                    during += timed_passes(daemon, 1, args.gap)
                thread.join()
                sweep_walls += result
            print(
                f"passes reading {args.batch} jobs in flight: median {median(alone) * 1000:.1f} ms "
                f"alone, {median(during) * 1000:.1f} ms during a sweep; sweeps with passes "
                f"every {args.gap}s took {median(sweep_walls):.2f}s"
            )
            client.close()
        finally:
            fleet.terminate()
            fleet.wait(timeout=10)

    tag = f"fleet watch {args.nodes:,} nodes"
    scale = args.nodes / 10_000
    emit(
        [
            row(f"{tag}: sweep wall time", median(walls), "s", WALL_TARGET * scale, "target <"),
            row(
                f"{tag}: sweep daemon CPU (read + decide)",
                median(cpus),
                "s",
                CPU_TARGET * scale,
                "target <",
            ),
            row(f"{tag}: of which deciding and rendering", median(decide_cpu) * 1000, "ms"),
            row(f"{tag}: pass ({args.batch} jobs in flight), median", median(alone) * 1000, "ms"),
            row(
                f"{tag}: the same pass during a sweep, median",
                median(during) / median(alone),
                "x",
                PASS_SLOWDOWN_TARGET,
                "target <",
            ),
            row(f"{tag}: sweep wall time with passes meanwhile", median(sweep_walls), "s"),
            row(
                f"{tag}: the pass applying a sweep, median",
                median(APPLYING) / median(alone),
                "x",
            ),
        ]
    )


if __name__ == "__main__":
    main()
