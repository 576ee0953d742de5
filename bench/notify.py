"""Notifications off the critical path: pass times with a receiver that
never answers against pass times with no receiver (DESIGN.md section 13).

    .venv/bin/python bench/notify.py            # 200 rollouts x 10 nodes, 5 runs
    .venv/bin/python bench/notify.py --quick

The daemon runs in this process (``Daemon`` with a ``GitStore`` on a bare
repository), the simulated fleet is a real process on 127.0.0.1. Each run
pushes the rollouts in one commit and times every pass until none is
active: half of them hold after their first batch (``pauseAfter: [1]``, a
``hold`` event each), the other half complete (a ``completed`` event
each); batchSize 1, so each rollout takes several passes. The two sides alternate within each run, each on a fresh repository
with its own rollout names (so job ids differ):

- ``none``: no ``spec.notifications``;
- ``hanging``: one json receiver whose address accepts TCP connections and
  never answers (a listening socket nobody reads), so every delivery waits
  for its timeout while its events queue up.

Target: pass times with the hanging receiver within 10% of those without.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pygit2
from _common import (
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
from reconciler.daemon.loop import Daemon
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.notifications import Notifier
from reconciler.git.store import GitStore
from reconciler.protocol.signing import generate_key, load_private_key

GROUP = 10  # nodes per rollout
SETTINGS = (
    b"apiVersion: reconciler/v1\nkind: Settings\nspec:\n"
    b"  notifications:\n    - {name: hanging, urlEnv: BENCH_HOOK}\n"
)


def one_side(
    root: Path,
    sim: SimFleetProcess,
    key: Path,
    side: str,
    run: int,
    rollouts: int,
    hook: str,
    log: EventLog,
) -> tuple[list[float], dict[str, float]]:
    """Pass durations from the push until no rollout is active, and the
    receiver's counters (sent, failed, dropped, queued)."""
    nodes = rollouts * GROUP
    files = {
        f"nodes/n{i:05d}.yaml": node_text(f"n{i:05d}", sim.url, {"group": f"g{(i - 1) // GROUP}"})
        for i in range(1, nodes + 1)
    }
    if side == "hanging":
        files["reconciler.yaml"] = SETTINGS
    bare = root / f"{side}-{run}.git"
    make_bare(bare, files)
    metrics = Metrics()
    notifier = Notifier([], metrics=metrics, log=log)
    daemon = Daemon(
        GitStore.open(str(bare), "main"),
        AgentClient(load_private_key(key), concurrency=64),
        log=log,
        metrics=metrics,
        notifier=notifier,
        environ={"BENCH_HOOK": hook},
    )
    daemon.run_pass()  # the empty dashboard, and the receivers configured
    extra = {0: {"pauseAfter": "[1]"}, 1: {}}
    commit_files(
        pygit2.Repository(str(bare)),
        {
            f"rollouts/{side[0]}{run}-{i:04d}.yaml": rollout_text(
                f"{side[0]}{run}-{i:04d}", selector={"group": f"g{i}"}, batch=1, **extra[i % 2]
            )
            for i in range(rollouts)
        },
        f"{rollouts} rollouts",
    )
    durations: list[float] = []
    deadline = time.monotonic() + 600
    while True:
        start = time.perf_counter()
        outcome = daemon.run_pass()
        durations.append(time.perf_counter() - start)
        if not outcome.active:
            break
        if time.monotonic() > deadline:
            raise RuntimeError("rollouts not done in 10 minutes")
        time.sleep(0.1)
    counts = {
        what: metrics.registry.get_sample_value(
            f"reconciler_notifications_{what}_total", {"receiver": "hanging"}
        )
        or 0.0
        for what in ("sent", "failed", "dropped")
    }
    counts["queued"] = float(sum(w.queue.qsize() for w in notifier.workers.values()))
    notifier.close(timeout=0.1)
    daemon.client.close()
    return durations, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--delay", type=float, default=0.2, help="agent answer delay (s)")
    parser.add_argument("--quick", action="store_true", help="50 rollouts, 2 runs")
    args = parser.parse_args()
    if args.quick:
        args.rollouts, args.runs = 50, 2
    announce(
        f"notify: {args.rollouts} rollouts x {GROUP} nodes, {args.runs} runs, "
        "no receiver vs a receiver that never answers"
    )
    passes: dict[str, list[float]] = {"none": [], "hanging": []}
    counts: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-notify-"))
        root = Path(tmp)
        private, public = generate_key(root / "keys")
        names = [f"n{i:05d}" for i in range(1, args.rollouts * GROUP + 1)]
        sim = SimFleetProcess(root / "sim", names, public, args.delay)
        listener = socket.create_server(("127.0.0.1", 0), backlog=1024)  # never accepted
        hook = f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
        try:
            log_file = stack.enter_context(open(root / "daemon.log", "a"))
            log = EventLog(stream=log_file)
            for run in range(args.runs):
                order = ("none", "hanging") if run % 2 == 0 else ("hanging", "none")
                for side in order:
                    durations, found = one_side(
                        root, sim, private, side, run, args.rollouts, hook, log
                    )
                    passes[side] += durations
                    if side == "hanging":
                        counts = found
                    print(
                        f"run {run + 1} {side}: {len(durations)} passes, median "
                        f"{median(durations) * 1e3:.1f} ms, p95 {p95(durations) * 1e3:.1f} ms"
                        + (f"; receiver {found}" if side == "hanging" else ""),
                        flush=True,
                    )
        finally:
            listener.close()
            sim.stop()
    none, hanging = median(passes["none"]), median(passes["hanging"])
    tag = f"{args.rollouts} rollouts x {GROUP}"
    rows: list[Any] = [
        row(f"notify {tag}: pass median, no receiver", none * 1e3, "ms"),
        row(f"notify {tag}: pass median, hanging receiver", hanging * 1e3, "ms"),
        row(f"notify {tag}: pass p95, no receiver", p95(passes["none"]) * 1e3, "ms"),
        row(f"notify {tag}: pass p95, hanging receiver", p95(passes["hanging"]) * 1e3, "ms"),
        row(
            f"notify {tag}: hanging / none, pass median",
            hanging / none,
            "x",
            1.10,
            "target <",
        ),
        row(f"notify {tag}: events waiting for the hanging receiver", counts["queued"], "events"),
    ]
    emit(rows)
    sys.stdout.flush()
    os._exit(0)  # agent client threads need not be joined


if __name__ == "__main__":
    main()
