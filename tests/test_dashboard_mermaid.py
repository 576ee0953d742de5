"""The dashboard's Mermaid diagram as mermaid.js reads it: every diagram
parses with mermaid's own parser (``tests/mermaid``: mermaid and jsdom from
npm, run by node), the rollouts come in the table's order, rollout boxes
are neutral, and a failed node marks its batch as failed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_dashboard import ALL, CANARY

from reconciler.text.dashboard import render_dashboard
from tests.kit.documents import make_status

HERE = Path(__file__).parent / "mermaid"


def mermaid(diagram: str) -> dict[str, Any]:
    """What mermaid's parser makes of ``diagram``."""
    node = shutil.which("node")
    if node is None or not (HERE / "node_modules" / "mermaid").is_dir():
        reason = "mermaid's parser is not installed (cd tests/mermaid && npm ci)"
        if os.environ.get("CI"):
            pytest.fail(reason + ": .ci/run installs it")
        pytest.skip(reason)
    result = subprocess.run(
        [node, str(HERE / "parse.mjs")],
        input=diagram,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"mermaid cannot parse:\n{diagram}\n{result.stderr}"
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def diagram_of(page: str) -> str:
    return page.split("```mermaid\n")[1].split("```")[0]


def test_the_diagram_parses_in_table_order_with_neutral_rollout_boxes() -> None:
    page = render_dashboard(ALL)
    parsed = mermaid(diagram_of(page))

    table_order = re.findall(r"^\| \[([a-z0-9-]+)\]", page, re.M)
    titles = [s["title"].split(":")[0] for s in parsed["subgraphs"]]
    assert titles == [name for name in table_order if name in ("llama-canary", "qwen-wide")]
    between = [link for link in parsed["links"] if link["stroke"] == "invisible"]
    assert between == [{"start": "r1", "end": "r2", "stroke": "invisible"}]
    boxes = {b["id"]: b for b in parsed["boxes"]}
    for subgraph in parsed["subgraphs"]:
        assert boxes[subgraph["id"]]["styles"] == [
            "fill:#ffffff",
            "stroke:#d0d7de",
            "color:#24292f",
        ]
    assert set(parsed["classes"]) == {"done", "running", "held", "failed", "unknown", "pending"}


def test_a_failed_node_in_a_held_batch_marks_the_batch_failed() -> None:
    parsed = mermaid(diagram_of(render_dashboard({"llama-canary": CANARY})))

    [held_batch] = [b for b in parsed["boxes"] if b["id"] == "r1b4"]
    assert held_batch["classes"] == ["failed"]
    assert "✗1 failed" in held_batch["text"]


def test_a_held_batch_without_failures_is_held_and_a_huge_rollout_parses() -> None:
    planned = make_status(
        "planned", "paused", [("a", 1, "succeeded"), ("b", 2, "pending")], hold="pause_after_batch"
    )
    planned = replace(
        planned,
        batches=tuple(replace(b, state="running") for b in planned.batches[:1])
        + planned.batches[1:],
    )
    nodes = [(f"n{i:05d}", i, "succeeded" if i <= 4000 else "pending") for i in range(1, 10001)]
    nodes[4000] = ("n04001", 4001, "dispatched")
    huge = make_status("huge", "running", nodes)
    parsed = mermaid(diagram_of(render_dashboard({"planned": planned, "huge": huge})))

    classes = {b["id"]: b["classes"] for b in parsed["boxes"]}
    assert classes["r1b1"] == ["held"]
    assert len(parsed["subgraphs"]) == 2
    assert [b for b in parsed["boxes"] if b["id"].startswith("r2b")] and len(parsed["boxes"]) < 12
