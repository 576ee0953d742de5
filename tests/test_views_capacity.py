"""``spreadBy`` and ``failureBudget`` as people read them: ``plan`` shows
the batches with each node's label value, ``status NAME`` the spread and
the budget, and the dashboard's diagram stays a handful of boxes
(docs/capacity.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_plan import json_plan, run_plan

from reconciler.spec.model import SpreadBy
from reconciler.text.dashboard import render_dashboard
from reconciler.text.status_text import render_detail
from tests.engine_world import World
from tests.kit.documents import node_yaml
from tests.kit.git import commit, git, make_repo

ZONES = ["a", "a", "b", "b", "c", "c"]
NODES = {
    f"nodes/gpu-{k}.yaml": node_yaml(
        f"gpu-{k}", labels=f"{{role: wide, zone: {zone}}}", maintenance=None
    )
    for k, zone in enumerate(ZONES, start=1)
} | {"nodes/gpu-7.yaml": node_yaml("gpu-7", labels="{role: wide}", maintenance=None)}

SPREAD = (
    "apiVersion: reconciler/v1\nkind: Rollout\nmetadata: {name: spread}\nspec:\n"
    "  target: {runtime: hermes, provider: ollama, model: llama3.1-8b}\n"
    "  selector: {role: wide}\n"
    "  batchSize: 3\n"
    "  spreadBy: {label: zone, maxPerBatch: 1}\n"
    "  onFailure: observe\n"
    "  failureBudget: 1\n"
)


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    root = make_repo(tmp_path / "fleet", NODES)
    git("checkout", "--quiet", "-b", "change", cwd=root)
    return root


def test_plan_shows_the_spread_batches_with_each_nodes_label_value(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit(fleet, {"rollouts/spread.yaml": SPREAD}, "add spread")

    code, out = run_plan(fleet, capsys, "text")

    assert code == 0
    assert "7 node(s) in 3 batch(es) of 3, 3, 1" in out
    assert "batch 1 (3): gpu-1 (zone a), gpu-3 (zone b), gpu-5 (zone c)" in out
    assert "batch 2 (3): gpu-2 (zone a), gpu-4 (zone b), gpu-6 (zone c)" in out
    assert "batch 3 (1): gpu-7 (no zone)" in out
    assert "spreadBy zone: at most 1 node(s) of one zone in a batch" in out
    assert "failureBudget 1: holds once more nodes than that end failed" in out
    [added] = json_plan(fleet, capsys)["added"]
    assert added["batches"] == [
        ["gpu-1", "gpu-3", "gpu-5"],
        ["gpu-2", "gpu-4", "gpu-6"],
        ["gpu-7"],
    ]
    assert added["labels"]["gpu-7"] == "" and added["labels"]["gpu-2"] == "a"


def spread_world(nodes: int = 6) -> World:
    w = World([f"n{i}" for i in range(1, nodes + 1)])
    for i in range(1, nodes + 1):
        w.set_node(f"n{i}", labels={"zone": f"z{i % 3}"})
    return w


def test_status_shows_the_spread_and_the_budget_as_it_is_spent() -> None:
    w = spread_world()
    w.rollout(batch_size=3, spread_by=SpreadBy("zone", 1), on_failure="observe", failure_budget=1)
    w.step(0)
    w.fail("n1")
    w.step(5)

    detail = render_detail(w.status(), w.now)

    assert "  spread    by zone, at most 1 per value in a batch" in detail
    assert "  budget    failureBudget 1: 1 failed node(s) allowed, 1 so far" in detail
    assert "batchSize 3: sizes 3, 3" in detail


def test_the_dashboard_draws_a_large_spread_rollout_as_a_handful_of_boxes() -> None:
    w = spread_world(600)
    w.rollout(batch_size=3, spread_by=SpreadBy("zone", 1))
    w.step(0)

    dashboard = render_dashboard(w.statuses)

    boxes = re.findall(r'\["batch', dashboard)
    assert 1 <= len(boxes) <= 6
    assert "batches 2-200 · 3 nodes each" in dashboard
