"""Reaction latency: from ``git push`` of a new rollout into a local bare
repository to the first job arriving at an agent on 127.0.0.1.

    .venv/bin/python bench/reaction.py [--pushes 20]

The daemon is the real process (``reconciler run --repo BARE --key KEY``,
default ``--interval``), so what wakes it is its branch watcher, not a
timer. The agents are the simulated fleet, served from a thread of this
process with the real protocol (signature checks included), so the moment
a job's POST arrives is read from the same clock that timed the push.

Each round, in a clone: pull the daemon's status commits, add
``rollouts/rK.yaml`` naming one node, commit, then time ``git push`` until
that node receives its job. The next round starts once that rollout has
completed, so every push meets an idle daemon. Median and p95 over the
pushes; the push alone (``git push`` returning) is printed too.

The simulated nodes sign their answers (per-node keys from a seed) and the
node files carry the matching ``agentKey``, so the daemon checks every
answer as it does in production (docs/trust.md); ``--unsigned`` for the
version 1 setup.

Target: median under 300 ms (issue 16 asks for under 50 ms). For reference, Flux polls its sources every
minute by default, and Argo CD every 2 to 3 minutes (180 s, plus jitter).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import (
    TARGET_FLOW,
    Row,
    announce,
    emit,
    git,
    git_env,
    make_bare,
    median,
    node_text,
    p95,
    row,
    start_daemon,
    status_data,
)

from reconciler.node.http_server import Request, Response
from reconciler.protocol.evidence import derived_agent_key
from reconciler.protocol.signing import generate_key, load_trusted_keys
from reconciler.simulation.fleet import SimFleet, serve

FLUX_POLL_S = 60.0  # Flux source-controller: GitRepository .spec.interval, commonly 1m
ARGO_POLL_S = 180.0  # Argo CD: timeout.reconciliation default 180s (+ up to 60s jitter)
COMPLETED = re.compile(rb"^phase: completed$", re.MULTILINE)


class Agents:
    """The simulated fleet on a thread of its own event loop, noting when
    each job POST arrives (``time.perf_counter``)."""

    def __init__(
        self, root: Path, names: list[str], trust_key: Path, seed: str | None = None
    ) -> None:
        self.fleet = SimFleet(
            names=names,
            trusted=load_trusted_keys([trust_key]),
            state_dir=root / "sim",
            runtimes=["hermes"],
            key_seed=seed,
        )
        self.arrivals: dict[str, float] = {}  # node -> first job POST
        handle = self.fleet.handle

        def noting(request: Request) -> Response | asyncio.Future[Response]:
            if request.method == "POST" and request.path.endswith("/jobs"):
                node = request.path.split("/")[3]
                self.arrivals.setdefault(node, time.perf_counter())
            return handle(request)

        self.fleet.handle = noting  # type: ignore[method-assign]
        self._ready = threading.Event()
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="agents", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def ready(address: str) -> None:
                self.url = f"http://{address}"
                self._ready.set()

            await serve(self.fleet, "127.0.0.1", 0, ready=ready, stop=self._stop)

        asyncio.run(main())

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)


def wait_for(check: Any, timeout: float, pause: float = 0.002) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not reached in {timeout:.0f}s")
        time.sleep(pause)


KEY_SEED = "bench-reaction"


def measure(pushes: int, interval: str, signed: bool = True) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="bench-reaction-") as tmp:
        root = Path(tmp)
        private, public = generate_key(root / "keys")
        names = [f"n{i:03d}" for i in range(1, pushes + 1)]
        seed = KEY_SEED if signed else None
        agents = Agents(root, names, public, seed)
        daemon: subprocess.Popen[bytes] | None = None
        try:
            bare = root / "fleet.git"
            make_bare(
                bare,
                {
                    f"nodes/{n}.yaml": node_text(
                        n,
                        agents.url,
                        {"role": "web"},
                        derived_agent_key(seed, n).public_openssh if seed else None,
                    )
                    for n in names
                },
            )
            work = root / "work"
            git("clone", "-q", str(bare), str(work), cwd=root)
            daemon = start_daemon(root, bare, private, interval)
            wait_for(lambda: git("ls-tree", "main", "status/", cwd=bare) != "", 60, 0.05)
            latencies: list[float] = []
            push_only: list[float] = []
            for k, node in enumerate(names):
                git("pull", "-q", "--ff-only", cwd=work)
                path = work / "rollouts" / f"r{k:03d}.yaml"
                path.parent.mkdir(exist_ok=True)
                path.write_text(
                    "apiVersion: reconciler/v1\nkind: Rollout\n"
                    f"metadata: {{name: r{k:03d}}}\n"
                    f"spec:\n  target: {TARGET_FLOW}\n  nodeIds: [{node}]\n"
                )
                git("add", "rollouts", cwd=work)
                git("commit", "-q", "-m", f"Roll {node}", cwd=work)
                time.sleep(0.2)  # the daemon is idle, waiting on its watcher
                start = time.perf_counter()
                subprocess.run(
                    ["git", "push", "-q", "origin", "main"], cwd=work, env=git_env(), check=True
                )
                pushed = time.perf_counter()
                wait_for(lambda node=node: node in agents.arrivals, 30)
                latencies.append(agents.arrivals[node] - start)
                push_only.append(pushed - start)
                name = f"r{k:03d}"
                wait_for(
                    lambda name=name: COMPLETED.search(status_data(bare, name) or b"") is not None,
                    30,
                    0.02,
                )
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)
        finally:
            if daemon is not None and daemon.poll() is None:
                daemon.kill()
                daemon.wait()
            agents.close()
    print(
        "push -> first job, ms: "
        + ", ".join(f"{x * 1e3:.0f}" for x in latencies)
        + f"\n(git push itself: median {median(push_only) * 1e3:.0f} ms)",
        flush=True,
    )
    m, p = median(latencies) * 1e3, p95(latencies) * 1e3
    return [
        row("reaction: push to first job, median", m, "ms", 300.0, "target <"),
        row("reaction: push to first job, p95", p, "ms", 300.0, "target <"),
        row("reaction: git push alone, median", median(push_only) * 1e3, "ms"),
        row("reaction: median vs Flux default poll (1 min)", m, "ms", FLUX_POLL_S * 1e3, "Flux"),
        row(
            "reaction: median vs Argo CD default poll (3 min)",
            m,
            "ms",
            ARGO_POLL_S * 1e3,
            "Argo CD",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=20)
    parser.add_argument("--interval", default="5s", help="the daemon's --interval (default 5s)")
    parser.add_argument("--quick", action="store_true", help="5 pushes")
    parser.add_argument("--unsigned", action="store_true", help="answers unsigned, as in version 1")
    args = parser.parse_args()
    if args.quick:
        args.pushes = 5
    how = "unsigned answers" if args.unsigned else "signed answers"
    announce(f"reaction: {args.pushes} pushes, daemon --interval {args.interval}, {how}")
    emit(measure(args.pushes, args.interval, signed=not args.unsigned))


if __name__ == "__main__":
    main()
