"""What the operator's views cost: the dashboard, the status table, reading
status files from Git, and ``plan`` on a large fleet.

Statuses are made by the engine itself (started rollouts with their first
batch dispatched), so the records have real sizes.

    .venv/bin/python bench/operator_views.py
    .venv/bin/python bench/operator_views.py --nodes 10000 --rollouts 50
"""

from __future__ import annotations

import argparse
import os
import pty
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from _common import Row, emit, row

from reconciler.engine.step import RolloutInput, step_fleet
from reconciler.git.branch import open_branch
from reconciler.protocol.observations import Observations
from reconciler.readers.status_reader import StatusCache, read_snapshot
from reconciler.spec.rollout_status import RolloutStatus, status_files
from reconciler.spec.safe_yaml import dump_yaml
from reconciler.text import plan
from reconciler.text.dashboard import render_dashboard
from reconciler.text.status_text import render_detail, render_table

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
ROWS: list[Row] = []  # every figure printed, for bench/all.py


def timed(label: str, action: Callable[[], object], repeat: int = 3) -> object:
    best = float("inf")
    result: object = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = action()
        best = min(best, time.perf_counter() - start)
    print(f"{label:<58} {best * 1000:9.1f} ms")
    ROWS.append(row(f"views: {label}, best of {repeat}", best * 1000, "ms"))
    return result


def fleet_files(nodes: int, rollouts: int) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for i in range(nodes):
        files[f"nodes/n{i:05d}.yaml"] = (
            "apiVersion: reconciler/v1\nkind: Node\n"
            f"metadata: {{name: n{i:05d}}}\n"
            f"spec: {{agent: 'http://10.0.{i // 250}.{i % 250}:8710', "
            f"labels: {{group: g{i % rollouts}}}}}\n"
        ).encode()
    for r in range(rollouts):
        files[f"rollouts/r{r:03d}.yaml"] = (
            "apiVersion: reconciler/v1\nkind: Rollout\n"
            f"metadata: {{name: r{r:03d}}}\n"
            "spec:\n"
            "  target: {runtime: hermes, provider: ollama, model: llama3.1-8b}\n"
            f"  selector: {{group: g{r}}}\n"
            "  batchSize: 10\n"
            "  live: true\n"
        ).encode()
    return files


def started(files: dict[str, bytes]) -> dict[str, RolloutStatus]:
    docs = plan.parse_tree(files)
    inputs = [
        RolloutInput(name, spec, True, (), None, "c" * 40, "c" * 40, 0)
        for name, spec in docs.rollouts.items()
    ]
    step = step_fleet(inputs, docs.fleet, docs.settings, Observations(), NOW)
    return dict(step.statuses)


def git(cwd: Path, *args: str) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "bench@example.com",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "bench@example.com",
    }
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--rollouts", type=int, default=20)
    args = parser.parse_args()

    files = fleet_files(args.nodes, args.rollouts)
    statuses = started(files)
    print(f"{args.nodes} nodes, {args.rollouts} running rollouts of {args.nodes // args.rollouts}")

    timed("render_dashboard (status/README.md)", lambda: render_dashboard(statuses))
    timed("render_table (status)", lambda: render_table(statuses, NOW))
    one = next(iter(statuses.values()))
    timed(f"render_detail (status NAME, {len(one.nodes)} nodes)", lambda: render_detail(one, NOW))

    big_files = fleet_files(10000, 1)
    big = started(big_files)
    timed("render_dashboard, one rollout of 10,000 nodes", lambda: render_dashboard(big))
    timed("render_detail, one rollout of 10,000 nodes", lambda: render_detail(big["r000"], NOW))

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "fleet"
        repo.mkdir()
        git(repo, "init", "-q", "-b", "main")
        for path, data in files.items():
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_bytes(data)
        for status in statuses.values():
            for path, record in status_files(status).items():
                (repo / path).parent.mkdir(parents=True, exist_ok=True)
                (repo / path).write_bytes(dump_yaml(record))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "fleet")
        source = open_branch(str(repo), "main")
        timed(f"read {len(statuses)} status files from the branch", lambda: read_snapshot(source))
        cache = StatusCache()
        read_snapshot(source, cache)
        timed("re-read with the watch cache, nothing changed", lambda: read_snapshot(source, cache))

    base = plan.Tree("b" * 40, files)
    extra = dict(files)
    extra["rollouts/new.yaml"] = (
        b"apiVersion: reconciler/v1\nkind: Rollout\nmetadata: {name: new}\nspec:\n"
        b"  target: {runtime: hermes, provider: ollama, model: qwen2}\n  selector: {}\n"
        b"  batchSize: 100\n  live: true\n  allowOverlap: true\n"
    )
    head = plan.Tree("h" * 40, extra)
    result = timed(
        "make_plan (parse both trees, step both, compare)",
        lambda: plan.make_plan(base, head, statuses, now=NOW),
        repeat=2,
    )
    assert isinstance(result, plan.Plan) and result.added

    watch_latency(statuses)
    emit(ROWS)


def watch_latency(statuses: dict[str, RolloutStatus], pushes: int = 5) -> None:
    """From a push of a status commit into a bare origin to the redraw of
    ``status --watch`` (a real process on a pty, reading the origin of a clone)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        seed = root / "seed"
        seed.mkdir()
        git(seed, "init", "-q", "-b", "main")
        one = next(iter(statuses.values()))
        for path, record in status_files(one).items():
            (seed / path).parent.mkdir(parents=True, exist_ok=True)
            (seed / path).write_bytes(dump_yaml(record))
        git(seed, "add", "-A")
        git(seed, "commit", "-q", "-m", "status")
        git(root, "clone", "-q", "--bare", str(seed), str(root / "fleet.git"))
        git(root, "clone", "-q", str(root / "fleet.git"), str(root / "mine"))
        git(seed, "remote", "add", "origin", str(root / "fleet.git"))
        master, slave = pty.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "reconciler", "status", "--watch", "--repo", str(root / "mine")],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**os.environ, "TERM": "xterm"},
            # Ctrl-C as in a terminal's foreground, even when the bench was
            # started in the background, where SIGINT is ignored and inherited.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        os.close(slave)
        screen = b""

        def read_until(marker: bytes, timeout: float = 20.0) -> None:
            nonlocal screen
            deadline = time.monotonic() + timeout
            while marker not in screen:
                ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    raise SystemExit(f"no redraw showing {marker!r}")
                screen += os.read(master, 65536)

        try:
            read_until(b"Ctrl-C")
            latencies = []
            for k in range(pushes):
                (seed / "status" / "marker.txt").write_text(str(k))
                git(seed, "add", "-A")
                git(seed, "commit", "-q", "-m", f"status {k}")
                tip = subprocess.run(
                    ["git", "-C", str(seed), "rev-parse", "HEAD"], capture_output=True, text=True
                ).stdout.strip()
                screen = b""
                start = time.perf_counter()
                git(seed, "push", "-q", "origin", "main")
                read_until(tip[:10].encode())
                latencies.append(time.perf_counter() - start)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=10)
            os.close(master)
        latencies.sort()
        print(
            f"{'status --watch: push to redraw (median of ' + str(pushes) + ')':<58} "
            f"{latencies[len(latencies) // 2] * 1000:9.1f} ms  (includes the git push)"
        )
        ROWS.append(
            row(
                "views: status --watch, push to redraw, median",
                latencies[len(latencies) // 2] * 1000,
                "ms",
            )
        )


if __name__ == "__main__":
    main()
