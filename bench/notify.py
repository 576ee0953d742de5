"""Notifications off the critical path: pass times with a receiver that
never answers against pass times with no receiver (docs/operating.md).

    .venv/bin/python bench/notify.py            # 200 rollouts x 10 nodes, 5 runs
    .venv/bin/python bench/notify.py --quick

The daemon runs in this process (``Daemon`` with a ``GitStore`` on a bare
repository), the simulated fleet is a real process on 127.0.0.1. Each run
pushes the rollouts in one commit and times every pass until none is
active: half of them hold after their first batch (``pauseAfter: [1]``, a
``hold`` event each), the other half complete (a ``completed`` event
each); batchSize 1, so each rollout takes several passes. Each run has two
fresh repositories with their own rollout names (so job ids differ), one
per side, and their daemons pass in turn (the order swapped every round),
so both sides see the same load on a shared machine:

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
from dataclasses import dataclass, field
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


@dataclass
class Side:
    name: str
    daemon: Daemon
    notifier: Notifier
    metrics: Metrics
    durations: list[float] = field(default_factory=list)
    active: bool = True

    def timed_pass(self) -> None:
        start = time.perf_counter()
        outcome = self.daemon.run_pass()
        self.durations.append(time.perf_counter() - start)
        self.active = outcome.active

    def counts(self) -> dict[str, float]:
        found = {
            what: self.metrics.registry.get_sample_value(
                f"reconciler_notifications_{what}_total", {"receiver": "hanging"}
            )
            or 0.0
            for what in ("sent", "failed", "dropped")
        }
        found["queued"] = float(sum(w.queue.qsize() for w in self.notifier.workers.values()))
        return found

    def close(self) -> None:
        self.notifier.close(timeout=0.1)
        self.daemon.client.close()


def make_side(
    root: Path,
    sim: SimFleetProcess,
    key: Path,
    name: str,
    run: int,
    rollouts: int,
    hook: str,
    log: EventLog,
) -> Side:
    """A repository with ``rollouts`` rollouts just pushed, and its daemon
    (with the hanging receiver configured for side ``hanging``)."""
    nodes = rollouts * GROUP
    files = {
        f"nodes/n{i:05d}.yaml": node_text(f"n{i:05d}", sim.url, {"group": f"g{(i - 1) // GROUP}"})
        for i in range(1, nodes + 1)
    }
    if name == "hanging":
        files["reconciler.yaml"] = SETTINGS
    bare = root / f"{name}-{run}.git"
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
    prefix = f"{name[0]}{run}"
    commit_files(
        pygit2.Repository(str(bare)),
        {
            f"rollouts/{prefix}-{i:04d}.yaml": rollout_text(
                f"{prefix}-{i:04d}", selector={"group": f"g{i}"}, batch=1, **extra[i % 2]
            )
            for i in range(rollouts)
        },
        f"{rollouts} rollouts",
    )
    return Side(name, daemon, notifier, metrics)


def interleaved(sides: list[Side]) -> None:
    """Passes on both sides in turn (the order swapped each round, so both
    see the same load on a shared machine), until neither is active."""
    deadline = time.monotonic() + 600
    turn = 0
    while any(side.active for side in sides):
        for side in sides if turn % 2 == 0 else sides[::-1]:
            if side.active:
                side.timed_pass()
        turn += 1
        if time.monotonic() > deadline:
            raise RuntimeError("rollouts not done in 10 minutes")
        time.sleep(0.1)


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
    ratios: list[float] = []
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
                sides = [
                    make_side(root, sim, private, name, run, args.rollouts, hook, log)
                    for name in ("none", "hanging")
                ]
                try:
                    interleaved(sides)
                finally:
                    for side in sides:
                        side.close()
                none_side, hanging_side = sides
                counts = hanging_side.counts()
                ratios.append(median(hanging_side.durations) / median(none_side.durations))
                for side in sides:
                    passes[side.name] += side.durations
                    print(
                        f"run {run + 1} {side.name}: {len(side.durations)} passes, median "
                        f"{median(side.durations) * 1e3:.1f} ms, "
                        f"p95 {p95(side.durations) * 1e3:.1f} ms",
                        flush=True,
                    )
                print(f"run {run + 1}: ratio {ratios[-1]:.3f}; receiver {counts}", flush=True)
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
            f"notify {tag}: hanging / none, pass median, median of {args.runs} runs",
            median(ratios),
            "x",
            1.10,
            "target <",
        ),
        row(f"notify {tag}: hanging / none, all passes pooled", hanging / none, "x"),
        row(f"notify {tag}: events waiting for the hanging receiver", counts["queued"], "events"),
    ]
    emit(rows)
    sys.stdout.flush()
    os._exit(0)  # agent client threads need not be joined


if __name__ == "__main__":
    main()
