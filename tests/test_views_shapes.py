"""Batch sizes, timed pauses and windows as people read them: ``plan``, the
dashboard's Mermaid diagram and ``status NAME`` (docs/rollouts.md)."""

from __future__ import annotations

import zoneinfo
from pathlib import Path

import pytest
from test_plan import json_plan, run_plan

from reconciler.spec.model import Settings, Window
from reconciler.text.dashboard import render_dashboard
from reconciler.text.status_text import render_detail, render_table
from tests.engine_world import World
from tests.kit.documents import node_yaml
from tests.kit.git import commit, git, make_repo
from tests.markdown_render import plain_text

WIDE = {
    f"nodes/gpu-b{i}.yaml": node_yaml(f"gpu-b{i}", labels="{role: wide}", maintenance=None)
    for i in range(1, 6)
}


def grow(extra: str = "") -> str:
    return (
        "apiVersion: reconciler/v1\nkind: Rollout\nmetadata: {name: grow}\nspec:\n"
        "  target: {runtime: hermes, provider: ollama, model: llama3.1-8b}\n"
        "  selector: {role: wide}\n"
        '  batches: [1, "50%"]\n' + extra
    )


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    root = make_repo(tmp_path / "fleet", WIDE)
    git("checkout", "--quiet", "-b", "change", cwd=root)
    return root


def test_plan_shows_the_batch_sizes_a_batches_list_yields(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = "  pauseAfter: [{batch: 1, for: 10m}]\n  ignoreWindows: true\n"
    commit(fleet, {"rollouts/grow.yaml": grow(extra)}, "add grow")

    code, out = run_plan(fleet, capsys, "text")

    assert code == 0
    assert "5 node(s) in 3 batch(es) of 1, 3, 1" in out
    assert "batches [1, 50%]: sizes 1, 3, 1" in out
    assert "batch 2 (3): gpu-b2, gpu-b3, gpu-b4" in out
    assert "holds after batch 1 for 10m, then goes on" in out
    assert "ignoreWindows: grow starts batches whatever the deploy windows" in out
    [added] = json_plan(fleet, capsys)["added"]
    assert [len(b) for b in added["batches"]] == [1, 3, 1]


def test_plan_names_new_windows_and_freezes(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = (
        "apiVersion: reconciler/v1\nkind: Settings\nspec:\n  windows:\n"
        '    - {days: [mon, tue], from: "09:00", to: "17:00", timezone: Europe/Berlin}\n'
        '  freezes:\n    - {from: "2026-12-24T00:00:00Z", to: "2026-12-27T00:00:00Z", '
        "reason: holidays}\n"
    )
    commit(fleet, {"reconciler.yaml": settings}, "windows")

    code, out = run_plan(fleet, capsys, "text")

    assert code == 0
    assert "deploy windows -> mon,tue 09:00-17:00 Europe/Berlin" in out
    assert "freezes -> 2026-12-24T00:00:00Z to 2026-12-27T00:00:00Z (holidays)" in out


def test_dashboard_and_status_show_batch_sizes_and_a_timed_pause() -> None:
    w = World(["a", "b", "c", "d", "e"])
    w.rollout(batches=(1, "50%"), pause_after=(1,), pause_for=((1, 180),))
    w.step(0)
    w.succeed("a")
    w.step(5)

    dashboard = render_dashboard(w.statuses)
    assert '["batch 1 · 1 node<br/>1/1 ok · done"]:::done' in dashboard
    assert '["batches 2-3 · sizes 3, 1<br/>0/4 ok · pending"]:::pending' in dashboard
    assert "pause_after_batch until 2026-12-01 09:03Z" in dashboard
    assert "until 2026-12-01T09:03:05Z" in plain_text(dashboard)  # the hold's message

    detail = render_detail(w.status(), w.now)
    assert "batches [1, 50%]: sizes 1, 3, 1" in detail
    assert "lifts by itself at 2026-12-01T09:03:05Z" in detail


def test_waiting_for_a_window_shows_in_the_table_and_the_detail() -> None:
    berlin = Window(
        frozenset({1}), 14 * 60, 17 * 60, "Europe/Berlin", zoneinfo.ZoneInfo("Europe/Berlin")
    )
    w = World(["a"], settings=Settings(windows=(berlin,)))
    w.rollout()
    w.step(0)

    assert "outside_window until 2026-12-01 13:00Z" in render_table(w.statuses, w.now)
    assert "outside_window until 2026-12-01 13:00Z" in render_dashboard(w.statuses)
    detail = render_detail(w.status(), w.now)
    assert "waiting   outside_window until 2026-12-01 13:00Z" in detail
