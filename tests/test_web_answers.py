"""The read API's answers and events made from views (docs/web.md): what
is new between two views becomes one event each, with ids that depend on
what they say only; a view with nothing new gives nothing; the list reuses
what did not change and stays what it would be made afresh."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from reconciler.spec.fleet_status import FleetNode, FleetStatus
from reconciler.spec.rollout_status import RolloutStatus, TransitionRecord
from reconciler.text.web_answers import StatusView, answers_for, events_between
from tests.kit.web import check_answer

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
STARTED = TransitionRecord(T0, "pending", "running", "started", "c1")
PAUSED = TransitionRecord(T0.replace(minute=5), "running", "paused", "operator_paused", "c2")


def _view(commit: str, *statuses: RolloutStatus, fleet: FleetStatus | None = None) -> StatusView:
    return StatusView(commit, {s.name: s for s in statuses}, fleet)


def test_a_new_transition_and_a_fleet_change_are_one_event_each_after_the_commit_event() -> None:
    before = _view(
        "a" * 40,
        RolloutStatus("web", "running", transitions=(STARTED,)),
        RolloutStatus("db", "completed"),
        fleet=FleetStatus((FleetNode("n1", "ok", T0),)),
    )
    after = _view(
        "b" * 40,
        RolloutStatus("web", "paused", transitions=(STARTED, PAUSED)),
        RolloutStatus("db", "completed"),
        fleet=FleetStatus((FleetNode("n1", "offline", T0.replace(minute=6)),)),
    )

    events = events_between(before, after)

    assert [e.kind for e in events] == ["commit", "transition", "fleet"]
    assert events[0].data == {"commit": "b" * 40, "rollouts": ["web"], "fleet": True}
    assert events[1].data == {
        "rollout": "web",
        "from": "running",
        "to": "paused",
        "reason": "operator_paused",
        "commit": "c2",
        "time": "2026-12-01T09:05:00Z",
    }
    assert events[2].data["node"] == "n1"
    assert (events[2].data["from"], events[2].data["to"]) == ("ok", "offline")
    for event in events:
        check_answer("api-event", dict(event.data))
    # The same news from another pair of views has the same ids.
    assert [e.id for e in events_between(before, after)] == [e.id for e in events]
    frame = events[1].frame().decode()
    assert frame.startswith(f"id: {events[1].id}\nevent: transition\ndata: {{")
    assert frame.endswith("}\n\n")


def test_a_view_with_nothing_new_gives_no_event() -> None:
    status = RolloutStatus("web", "running", transitions=(STARTED,))
    assert events_between(_view("a" * 40, status), _view("b" * 40, status)) == []


def test_the_list_reuses_unchanged_entries_and_equals_one_made_afresh() -> None:
    web = RolloutStatus("web", "running", transitions=(STARTED,))
    first = answers_for(_view("a" * 40, web, RolloutStatus("db", "pending")))
    second_view = _view("b" * 40, web, RolloutStatus("db", "pending", message="now"))

    second = answers_for(second_view, first)

    assert second.summaries["web"] is first.summaries["web"]
    assert second.rollouts == answers_for(second_view).rollouts
    listing = json.loads(second.rollouts)
    check_answer("api-rollouts", listing)
    assert [r["name"] for r in listing] == ["db", "web"]
    assert listing[1]["updatedAt"] == "2026-12-01T09:00:00Z"
    assert json.loads(second.fleet) == {"kind": "FleetStatus", "nodes": None}
