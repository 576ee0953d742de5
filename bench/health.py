"""Health checks at scale (docs/health.md): the same live rollout over
a whole simulated fleet, once without checks and once with two agent
checks (http and tcp) and a soak, driven by the real daemon process
against the simulated fleet, whose scripted checks all hold.

    .venv/bin/python bench/health.py                  # 10,000 nodes, batchSize 1,000
    .venv/bin/python bench/health.py --nodes 1000 --batch 250 --runs 1

Per run (the two sides alternate, ``--runs`` times each): from the rollout
commit to the committed ``completed``; daemon overhead per node is (wall
time - batches x (answer delay + soak)) / nodes, i.e. everything that is
not the simulated apply or the soak itself. Target: under 1 ms per node
with checks, about the same as without.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pygit2
from _common import (
    Row,
    SimFleetProcess,
    announce,
    commit_files,
    cpu_seconds,
    emit,
    git,
    make_bare,
    median,
    node_text,
    rollout_text,
    row,
    start_daemon,
    status_data,
    wait_for,
)

from reconciler.protocol.signing import generate_key

ENDED = re.compile(rb"^phase: (completed|failed|aborted)$", re.MULTILINE)
HEALTH = (
    "{soak: %ds, interval: 1s, checks: ["
    "{name: ready, http: {url: 'http://127.0.0.1:8000/ready'}}, "
    "{name: port, tcp: {host: '{node}', port: 8000}}]}"
)


def one_run(
    root: Path, nodes: int, batch: int, delay: float, soak: int, checks: bool, timeout: float
) -> dict[str, float]:
    private, public = generate_key(root / "keys")
    names = [f"n{i:05d}" for i in range(1, nodes + 1)]
    sim = SimFleetProcess(root / "sim", names, public, delay)
    daemon: subprocess.Popen[bytes] | None = None
    try:
        bare = root / "fleet.git"
        make_bare(
            bare, {f"nodes/{n}.yaml": node_text(n, sim.url, {"fleet": "bench"}) for n in names}
        )
        git("gc", "-q", cwd=bare)
        daemon = start_daemon(root, bare, private, "0.2s")
        repo = pygit2.Repository(str(bare))

        def idle() -> bool:
            return "status" in repo.references["refs/heads/main"].peel(pygit2.Commit).tree

        wait_for(idle, 120, 0.1)
        time.sleep(0.3)
        extra = {"live": "true"}
        if checks:
            extra["health"] = HEALTH % soak
        cpu0 = cpu_seconds(daemon.pid)
        started = time.perf_counter()
        text = rollout_text("big", selector={"fleet": "bench"}, batch=batch, **extra)
        commit_files(repo, {"rollouts/big.yaml": text}, "Roll the whole fleet")

        def done() -> bool:
            data = status_data(bare, "big")
            return data is not None and ENDED.search(data) is not None

        finished = wait_for(done, timeout)
        cpu = cpu_seconds(daemon.pid) - cpu0
        phase = ENDED.search(status_data(bare, "big") or b"")
        if phase is None or phase.group(1) != b"completed":
            raise RuntimeError(f"rollout ended {phase.group(1) if phase else '?'}; see the log")
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        wall = finished - started
        batches = -(-nodes // batch)
        floor = batches * (delay + (soak if checks else 0))
        return {"wall": wall, "cpu": cpu, "overhead": (wall - floor) / nodes}
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        sim.stop()


def measure(nodes: int, batch: int, delay: float, soak: int, runs: int) -> list[Row]:
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for k in range(runs):
        for checks in (False, True):
            with tempfile.TemporaryDirectory(prefix="bench-health-") as tmp:
                r = one_run(
                    Path(tmp), nodes, batch, delay, soak, checks, timeout=120 + nodes * 0.05
                )
            side = "2 checks" if checks else "no checks"
            print(
                f"run {k + 1}, {side}: {r['wall']:.2f} s wall, {r['cpu']:.2f} s daemon CPU, "
                f"{r['overhead'] * 1e3:.3f} ms/node overhead",
                flush=True,
            )
            results[checks].append(r)

    def m(checks: bool, key: str) -> float:
        return median([r[key] for r in results[checks]])

    tag = f"{nodes:,} nodes/{batch:,} live"
    without, with_checks = m(False, "overhead") * 1e3, m(True, "overhead") * 1e3
    return [
        row(f"health {tag}: overhead per node, no checks", without, "ms", 1.0, "target <"),
        row(f"health {tag}: overhead per node, 2 checks", with_checks, "ms", 1.0, "target <"),
        row(f"health {tag}: daemon CPU per node, no checks", m(False, "cpu") / nodes * 1e3, "ms"),
        row(f"health {tag}: daemon CPU per node, 2 checks", m(True, "cpu") / nodes * 1e3, "ms"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--delay", type=float, default=0.5, help="sim fleet answer delay, s")
    parser.add_argument("--soak", type=int, default=2, help="soak of the rollout with checks, s")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1,000 nodes, batches of 250, 1 run")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.batch, args.runs = 1_000, 250, 1
    announce(
        f"health: {args.nodes:,} nodes, batchSize {args.batch:,}, delay {args.delay} s, "
        f"soak {args.soak} s"
    )
    emit(measure(args.nodes, args.batch, args.delay, args.soak, args.runs))


if __name__ == "__main__":
    main()
