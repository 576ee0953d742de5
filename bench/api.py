"""The read API of ``run --http`` against a real daemon process
(docs/web.md): how long ``GET /api/v1/rollouts`` takes with thousands of
rollouts, and how long after a status commit its event reaches an open
stream.

A simulated fleet runs every rollout (one node each, dry-run) to
``completed``, so the statuses have real sizes. Latency is wall time of one
request on a kept-alive connection, body read; the event's delay is from
the moment the branch ref moved to the status commit (seen by inotify on
the bare repository's refs) to the moment its ``commit`` event was read.

    .venv/bin/python bench/api.py                 # 5,000 rollouts
    .venv/bin/python bench/api.py --quick         # 200 rollouts
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from _common import (
    BranchMoves,
    Row,
    SimFleetProcess,
    announce,
    emit,
    git,
    make_bare,
    node_text,
    row,
)

from reconciler.protocol.signing import generate_key

TARGET = "{runtime: hermes, provider: ollama, model: llama3.1-8b, profile: default}"
LISTENING = re.compile(r"serving the read API and the page on (http://\S+?)/")


def rollout(name: str, node: str) -> bytes:
    return (
        "apiVersion: reconciler/v1\nkind: Rollout\n"
        f"metadata: {{name: {name}}}\nspec:\n  target: {TARGET}\n"
        f"  nodeIds: [{node}]\n  allowOverlap: true\n"
    ).encode()


def start_daemon(root: Path, bare: Path, key: Path) -> tuple[subprocess.Popen[bytes], str]:
    log = root / "daemon.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "reconciler", "run",
                "--repo", str(bare), "--key", str(key), "--interval", "0.2s",
                "--state-dir", str(root / "state"), "--http", "127.0.0.1:0",
            ],
            stdout=out,
            stderr=out,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = LISTENING.search(log.read_text())
        if found:
            return process, found.group(1)
        time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"the daemon did not serve:\n{log.read_text()[-2000:]}")


def wait_completed(url: str, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = httpx.get(url + "/api/v1/rollouts", timeout=30)
        if answer.status_code == 200:
            done = sum(1 for r in answer.json() if r["phase"] == "completed")
            if done == count:
                return
        time.sleep(0.5)
    raise RuntimeError(f"not every rollout completed in {timeout:.0f}s")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def list_latency(url: str, requests: int) -> tuple[float, float, int]:
    """(p50, p99) in ms of GET /api/v1/rollouts, and the body's size."""
    times = []
    size = 0
    with httpx.Client(timeout=30) as client:
        client.get(url + "/api/v1/rollouts")  # the connection, kept alive
        for _ in range(requests):
            started = time.perf_counter()
            answer = client.get(url + "/api/v1/rollouts")
            times.append((time.perf_counter() - started) * 1000)
            size = len(answer.content)
    return percentile(times, 0.5), percentile(times, 0.99), size


def event_delays(url: str, bare: Path, work: Path, samples: int, nodes: int) -> list[float]:
    """For each of ``samples`` new rollouts pushed, ms from the daemon's
    status commit moving the branch to its ``commit`` event being read."""
    moved: dict[str, float] = {}  # commit -> when the ref showed it
    arrived: dict[str, float] = {}
    stop = threading.Event()
    watch = BranchMoves(bare)
    ref = bare / "refs" / "heads" / "main"

    def watch_ref() -> None:
        while not stop.is_set():
            watch.wait(0.2)
            try:
                tip = ref.read_text().strip()
            except FileNotFoundError:
                continue
            moved.setdefault(tip, time.perf_counter())

    def read_events(stream: httpx.Response) -> None:
        with contextlib.suppress(httpx.HTTPError):  # the stream is closed at the end
            read_lines(stream)

    def read_lines(stream: httpx.Response) -> None:
        fields: dict[str, str] = {}
        for line in stream.iter_lines():
            if stop.is_set():
                return
            if line and not line.startswith(":"):
                key, _, value = line.partition(": ")
                fields[key] = value
                continue
            if fields.get("event") == "commit":
                commit = json.loads(fields["data"])["commit"]
                arrived.setdefault(commit, time.perf_counter())
            fields = {}

    watcher = threading.Thread(target=watch_ref, daemon=True)
    watcher.start()
    with httpx.stream("GET", url + "/api/v1/events", timeout=60) as stream:
        reader = threading.Thread(target=read_events, args=(stream,), daemon=True)
        reader.start()
        pushed: list[str] = []
        for i in range(samples):
            name = f"late-{i:03d}"
            (work / "rollouts" / f"{name}.yaml").write_bytes(rollout(name, f"n{i % nodes:03d}"))
            git("add", "-A", cwd=work)
            git("commit", "-q", "-m", f"Add {name}", cwd=work)
            git("pull", "-q", "--rebase", "origin", "main", cwd=work)
            git("push", "-q", "origin", "main", cwd=work)
            pushed.append(git("rev-parse", "HEAD", cwd=work))
            time.sleep(1.0)  # the pass, its commits and their events
        stop.set()
    watcher.join(5)
    watch.close()
    spec = set(pushed)
    return [(arrived[c] - moved[c]) * 1000 for c in arrived if c in moved and c not in spec]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument(
        "--quick", action="store_true", help="200 rollouts, 200 requests, 5 samples"
    )
    args = parser.parse_args()
    if args.quick:
        args.rollouts, args.requests, args.samples = 200, 200, 5
    announce(f"read API: {args.rollouts} rollouts on {args.nodes} simulated nodes")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp:
        root = Path(tmp)
        key, public = generate_key(root / "keys")
        names = [f"n{i:03d}" for i in range(args.nodes)]
        fleet = SimFleetProcess(root / "sim", names, public, delay=0)
        process: subprocess.Popen[bytes] | None = None
        try:
            files = {f"nodes/{n}.yaml": node_text(n, fleet.url, {"role": "web"}) for n in names}
            files.update(
                {
                    f"rollouts/r{i:05d}.yaml": rollout(f"r{i:05d}", names[i % args.nodes])
                    for i in range(args.rollouts)
                }
            )
            bare = root / "fleet.git"
            make_bare(bare, files)
            process, url = start_daemon(root, bare, key)
            wait_completed(url, args.rollouts, timeout=max(120.0, args.rollouts / 10))
            p50, p99, size = list_latency(url, args.requests)
            rows.append(row("GET /api/v1/rollouts p50", p50, "ms"))
            rows.append(row("GET /api/v1/rollouts p99", p99, "ms", 10.0, "target <"))
            rows.append(row("its body", size / 1024, "KiB"))
            work = root / "work"
            git("clone", "-q", str(bare), str(work), cwd=root)
            delays = event_delays(url, bare, work, args.samples, args.nodes)
            if delays:
                rows.append(row("status commit to event, median", percentile(delays, 0.5), "ms"))
                rows.append(
                    row("status commit to event, max", max(delays), "ms", 100.0, "target <")
                )
                rows.append(row("events timed", len(delays), "commits"))
        finally:
            if process is not None:
                process.terminate()
                process.wait(30)
            fleet.stop()
    emit(rows)


if __name__ == "__main__":
    main()
