"""The web page's first paint (docs/web.md): how long the server takes to
render it and how many bytes it sends, with 5,000 rollouts in the table
and with a 1,000-node rollout shown in full; then how long a headless
chromium takes to load and paint that HTML, against an empty page.

Statuses are made by the engine itself (started rollouts, their first
batch dispatched); the 1,000-node rollout's nodes carry an out-of-service
time each, so its plot has 1,000 dots.

    .venv/bin/python bench/first_paint.py
    .venv/bin/python bench/first_paint.py --rollouts 500 --nodes 100
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from _common import Row, announce, emit, row

from reconciler.engine.step import RolloutInput, step_fleet
from reconciler.protocol.observations import Observations
from reconciler.spec.rollout_status import RolloutStatus
from reconciler.text import plan
from reconciler.text.web_answers import StatusView, answers_for

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
ROWS: list[Row] = []


def best_of(label: str, action: Callable[[], object], repeat: int = 3) -> object:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = action()
        best = min(best, time.perf_counter() - start)
    ROWS.append(row(f"first paint: {label}, best of {repeat}", best * 1000, "ms"))
    return result


def big_rollout(nodes: int) -> RolloutStatus:
    files: dict[str, bytes] = {
        f"nodes/n{i:05d}.yaml": (
            "apiVersion: reconciler/v1\nkind: Node\n"
            f"metadata: {{name: n{i:05d}}}\n"
            f"spec: {{agent: 'http://10.0.{i // 250}.{i % 250}:8710', labels: {{group: big}}}}\n"
        ).encode()
        for i in range(nodes)
    }
    files["rollouts/big.yaml"] = (
        b"apiVersion: reconciler/v1\nkind: Rollout\nmetadata: {name: big}\nspec:\n"
        b"  target: {runtime: hermes, provider: ollama, model: llama3.1-8b}\n"
        b"  selector: {group: big}\n  batchSize: 50\n  live: true\n"
    )
    docs = plan.parse_tree(files)
    inputs = [RolloutInput("big", docs.rollouts["big"], True, (), None, "c" * 40, "c" * 40, 0)]
    status = step_fleet(inputs, docs.fleet, docs.settings, Observations(), NOW).statuses["big"]
    timed = tuple(
        replace(n, timings={}, out_of_service=5.0 + (i % 37)) for i, n in enumerate(status.nodes)
    )
    return replace(status, nodes=timed)


def chromium_paint(html: bytes, folder: Path) -> float:
    """Seconds for a plain headless chromium to load ``html`` and screenshot it."""
    page = folder / "page.html"
    page.write_bytes(html)
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    start = time.perf_counter()
    subprocess.run(
        [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={folder / 'profile'}", "--window-size=1280,900",
         f"--screenshot={folder / 'shot.png'}", page.as_uri()],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=1000)
    args = parser.parse_args()
    announce(f"first paint: {args.rollouts} rollouts, one of {args.nodes} nodes")
    big = big_rollout(args.nodes)
    small = big_rollout(1)
    statuses = {f"r{i:05d}": replace(small, name=f"r{i:05d}") for i in range(args.rollouts - 1)}
    statuses["big"] = big
    view = StatusView("c" * 40, statuses, None)

    answers = best_of(f"render every row of {args.rollouts} rollouts", lambda: answers_for(view))
    assert answers is not None
    table = best_of(f"the page with {args.rollouts} rollouts", lambda: answers.page())
    detail = best_of(
        f"the page with a {args.nodes}-node rollout in full", lambda: answers.page("big")
    )
    assert isinstance(table, bytes) and isinstance(detail, bytes)
    ROWS.append(row(f"first paint: page bytes, {args.rollouts} rollouts", len(table), "B"))
    ROWS.append(row(f"first paint: page bytes, {args.nodes}-node rollout", len(detail), "B"))
    if shutil.which("chromium") or Path("/usr/bin/chromium").exists():
        with tempfile.TemporaryDirectory() as folder:
            empty = chromium_paint(answers_for(StatusView(None, {}, None)).page(), Path(folder))
            for label, html in (("rollouts", table), ("node rollout in full", detail)):
                took = min(chromium_paint(html, Path(folder)) for _ in range(2))
                ROWS.append(
                    row(f"first paint: chromium load and screenshot, {label}", took * 1000, "ms",
                        empty * 1000, "empty page")
                )  # fmt: skip
    emit(ROWS)


if __name__ == "__main__":
    sys.exit(main())
