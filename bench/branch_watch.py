"""The branch watch on a local repository: how soon a ref moved into place
wakes ``BranchWatcher.wait``, and what an idle daemon costs in CPU.

    .venv/bin/python bench/branch_watch.py [--samples 300] [--idle 60]

Hint latency, in this process: Git's way of writing a ref (``main.lock``
written, then renamed onto ``refs/heads/main``, alternating between two
commits), timed from just before the rename until ``wait`` returns, then
10 ms of pause so every sample meets a quiet watch. Median and p95.

Idle CPU: ``reconciler run`` (default flags) on a bare repository with no
nodes and no rollouts, left alone for ``--idle`` seconds once its first
pass has committed status; its user and system time from ``/proc`` before
and after, as a percentage of one core.

To compare with another checkout, run it with ``PYTHONPATH=/that/tree``
and this one alternately.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from _common import announce, emit, git, make_bare, median, p95, row, start_daemon

from reconciler.git.watch import BranchWatcher
from reconciler.protocol.signing import generate_key

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def hint_latency(root: Path, samples: int) -> list[float]:
    bare = root / "latency.git"
    first = make_bare(bare, {"README.md": b"fleet\n"})
    tree = git("rev-parse", f"{first}^{{tree}}", cwd=bare)
    second = git("commit-tree", tree, "-p", first, "-m", "second", cwd=bare)
    ref = bare / "refs" / "heads" / "main"
    lock = ref.with_name("main.lock")
    latencies: list[float] = []
    with BranchWatcher.local(bare, ["main"]) as watcher:
        time.sleep(0.2)
        for k in range(samples):
            lock.write_text((second if k % 2 == 0 else first) + "\n")
            start = time.perf_counter()
            os.replace(lock, ref)
            if not watcher.wait(5.0):
                raise RuntimeError(f"no hint within 5 s (sample {k})")
            latencies.append(time.perf_counter() - start)
            time.sleep(0.01)
            while watcher.wait(0.0):
                pass
    return latencies


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def idle_cpu(root: Path, seconds: float) -> float:
    """Percent of one core an idle daemon used over `seconds`."""
    private, _ = generate_key(root / "keys")
    bare = root / "idle.git"
    make_bare(bare, {"README.md": b"fleet\n"})
    daemon = start_daemon(root, bare, private, "5s")
    try:
        deadline = time.monotonic() + 60
        while git("ls-tree", "main", "status/", cwd=bare) == "":
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise RuntimeError("the daemon did not commit status; see daemon.log")
            time.sleep(0.1)
        time.sleep(2.0)  # past its first pass
        before, started = cpu_seconds(daemon.pid), time.monotonic()
        time.sleep(seconds)
        used, elapsed = cpu_seconds(daemon.pid) - before, time.monotonic() - started
    finally:
        daemon.terminate()
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    return used / elapsed * 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--idle", type=float, default=60.0, help="seconds (0: skip)")
    parser.add_argument("--quick", action="store_true", help="50 samples, 10 s idle")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.idle = 50, 10.0
    announce(f"branch watch: {args.samples} ref moves, {args.idle:.0f} s of an idle daemon")
    with tempfile.TemporaryDirectory(prefix="bench-branch-watch-") as tmp:
        root = Path(tmp)
        latencies = hint_latency(root, args.samples)
        rows = [
            row(
                "branch watch: ref renamed -> wait() returned, median",
                median(latencies) * 1e3,
                "ms",
            ),
            row("branch watch: ref renamed -> wait() returned, p95", p95(latencies) * 1e3, "ms"),
        ]
        if args.idle > 0:
            rows.append(
                row("branch watch: idle daemon CPU", idle_cpu(root, args.idle), "% of a core")
            )
    emit(rows)


if __name__ == "__main__":
    main()
