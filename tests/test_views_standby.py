"""Where people see a warm standby: ``status NAME`` (the rollout's standby
and each node's kept slot and release), the dashboard's batch boxes, the
web page's node facts and ``plan``; a rollout without standby shows none of it."""

from __future__ import annotations

from reconciler.spec.rollout_status import to_record
from reconciler.text import plan, status_text
from reconciler.text.dashboard import render_dashboard
from reconciler.text.web_rollout import model_facts_section
from tests.engine_world import World
from tests.test_engine_releases import _pass
from tests.test_plan_artifacts import WIDE, planned


def _rollout(keep: str | None) -> World:
    world = World(2)
    world.rollout(live=True, batch_size=1, standby=keep)
    world.step(at=0)
    _pass(world, "n1", 10)
    return world


def test_status_detail_shows_the_standby_and_each_nodes_slot() -> None:
    world = _rollout("untilSoaked")
    text = " ".join(status_text.render_detail(world.status(), world.now).split())
    assert "standby each node switches slots with no time out of service" in text
    assert "(untilSoaked)" in text
    assert "slot a release sent" in text
    world.succeed("n1")
    world.step(at=20)
    text = " ".join(status_text.render_detail(world.status(), world.now).split())
    assert "slot a released at 2026-12-01T09:00:20Z" in text


def test_dashboard_and_web_page_show_kept_and_released_slots() -> None:
    world = _rollout("untilCompleted")
    status = world.status()
    dashboard = render_dashboard({"r": status})
    assert "slots: 1 kept warm" in dashboard
    facts = model_facts_section(to_record(status)["nodes"])
    assert "slot a, kept warm" in facts
    _pass(world, "n2", 30)
    assert world.phase() == "completed"
    world.fail("n1", error="stop_failed: exit 1")
    world.step(at=40)
    status = world.status()
    facts = model_facts_section(to_record(status)["nodes"])
    assert "slot a: release failed: stop_failed: exit 1" in facts
    assert "slot a, release sent (job release-" in facts  # n2's, not answered yet
    text = " ".join(status_text.render_detail(status, world.now).split())
    assert "slot a: release failed: stop_failed: exit 1; slot a may still run" in text


def test_a_rollout_without_standby_shows_nothing_of_slots() -> None:
    world = _rollout(None)
    status = world.status()
    assert "slot" not in status_text.render_detail(status, world.now)
    assert "slots:" not in render_dashboard({"r": status})
    assert model_facts_section(to_record(status)["nodes"]) == ""


def test_plan_shows_the_standby() -> None:
    text = plan.render_text(planned(WIDE + "  standby: {keepPrevious: untilCompleted}\n"))
    assert "the previous slot stays warm until the rollout ends (untilCompleted)" in text
    assert "standby" not in plan.render_text(planned(WIDE))
