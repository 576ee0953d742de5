"""Notification events read from status changes (docs/operating.md):
which changes are events, their keys and delivery ids, what is still true
on start, and the bodies."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from reconciler.spec.documents import parse_file
from reconciler.spec.rollout_status import (
    Hold,
    NodeRecord,
    RollbackNode,
    RollbackRecord,
    RolloutStatus,
)
from reconciler.text.notification_events import (
    delivery_id,
    fleet_events,
    json_body,
    rollout_events,
    slack_text,
    standing_fleet_events,
    standing_rollout_events,
)

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
RUNNING = RolloutStatus(
    "web",
    phase="running",
    nodes=(NodeRecord("web-1", 1, "dispatched"), NodeRecord("web-2", 1, "dispatched")),
)
HELD = replace(
    RUNNING,
    phase="paused",
    hold=Hold("health_failed", "health check failed on web-1: disk full; ...", T0, ("web-1",), 1),
)


def sha256_of(*key: str) -> str:
    return hashlib.sha256(json.dumps(list(key), separators=(",", ":")).encode()).hexdigest()


def test_a_hold_that_opens_is_one_event_keyed_by_rollout_since_and_reason() -> None:
    (event,) = rollout_events(RUNNING, HELD, "c1")

    assert (event.name, event.rollout, event.nodes) == ("hold", "web", ("web-1",))
    assert event.delivery_id == sha256_of("hold", "web", "2026-12-01T09:00:00Z", "health_failed")


def test_nodes_joining_an_open_hold_are_the_same_event_not_a_new_one() -> None:
    joined = replace(
        HELD,
        hold=replace(HELD.hold, nodes=("web-1", "web-2"), node_count=2),  # type: ignore[arg-type]
    )
    assert rollout_events(HELD, joined, "c2") == []
    assert rollout_events(HELD, HELD, "c2") == []


def test_a_new_hold_after_a_resume_is_a_new_event_with_a_new_id() -> None:
    later = replace(HELD, hold=replace(HELD.hold, since=T0 + timedelta(minutes=5)))  # type: ignore[arg-type]
    (first,) = rollout_events(RUNNING, HELD, "c1")
    (second,) = rollout_events(RUNNING, later, "c3")
    assert first.delivery_id != second.delivery_id


def test_the_delivery_id_does_not_depend_on_the_commit_or_the_pass() -> None:
    (a,) = rollout_events(RUNNING, HELD, "c1")
    (b,) = rollout_events(None, HELD, "c9")
    (c,) = standing_rollout_events(HELD, T0 + timedelta(days=3), "c7")
    assert a.delivery_id == b.delivery_id == c.delivery_id


def test_reaching_a_terminal_phase_is_one_event_keyed_by_rollout_and_phase() -> None:
    done = replace(RUNNING, phase="completed", finished_at=T0, message="all 2 nodes succeeded")
    (event,) = rollout_events(RUNNING, done, "c4")
    assert event.name == "completed" and event.delivery_id == delivery_id(
        ("completed", "web", "completed")
    )
    assert rollout_events(done, done, "c5") == []


def test_a_failed_rollout_names_the_nodes_that_did_not_succeed() -> None:
    failed = replace(
        RUNNING,
        phase="failed",
        finished_at=T0,
        nodes=(NodeRecord("web-1", 1, "failed"), NodeRecord("web-2", 1, "succeeded")),
    )
    (event,) = rollout_events(RUNNING, failed, "c4")
    assert (event.name, event.nodes) == ("failed", ("web-1",))


def test_a_finished_rollback_request_is_keyed_by_its_id() -> None:
    record = RollbackRecord(
        "r1", "alice", T0, "done", nodes=(RollbackNode("web-1", "rolled_back"),)
    )
    restoring = replace(HELD, rollbacks=(replace(record, state="restoring"),))
    done = replace(HELD, rollbacks=(record,))

    events = rollout_events(restoring, done, "c6")

    assert [(e.name, e.nodes) for e in events] == [("rolled_back", ("web-1",))]
    assert events[0].delivery_id == sha256_of("rolled_back", "web", "request", "r1")


def test_on_start_open_holds_and_endings_of_the_last_hour_are_still_true() -> None:
    now = T0 + timedelta(hours=2)
    recent = replace(RUNNING, name="a", phase="completed", finished_at=now - timedelta(minutes=59))
    old = replace(RUNNING, name="b", phase="aborted", finished_at=now - timedelta(minutes=61))

    assert [e.name for e in standing_rollout_events(HELD, now, "c")] == ["hold"]
    assert [e.name for e in standing_rollout_events(recent, now, "c")] == ["completed"]
    assert standing_rollout_events(old, now, "c") == []
    assert standing_rollout_events(RUNNING, now, "c") == []


def test_fleet_events_are_keyed_by_node_state_and_since() -> None:
    before = {"n1": ("ok", T0), "n2": ("offline", T0)}
    after = {"n1": ("drift", T0 + timedelta(minutes=1)), "n2": ("offline", T0)}

    (event,) = fleet_events(before, after, "c")

    assert (event.name, event.nodes, event.rollout) == ("node_drift", ("n1",), None)
    assert event.delivery_id == sha256_of("node_drift", "n1", "drift", "2026-12-01T09:01:00Z")
    assert {e.name for e in standing_fleet_events(after, "c")} == {"node_drift", "node_offline"}


def test_the_json_body_has_the_fields_section_13_names() -> None:
    (event,) = rollout_events(RUNNING, HELD, "c1")
    body = json_body(event)
    assert list(body) == [
        "event", "deliveryId", "rollout", "phase", "hold", "nodes", "message", "commit",
        "dashboard",
    ]  # fmt: skip
    assert body["hold"]["reason"] == "health_failed" and body["commit"] == "c1"
    assert body["dashboard"] == "status/README.md"


def test_the_slack_text_says_rollout_what_nodes_and_what_next_in_two_lines() -> None:
    (event,) = rollout_events(RUNNING, HELD, "c1")
    first, second = slack_text(event).splitlines()
    assert "web" in first and "health_failed" in first and "web-1" in first
    assert "disk full" in second and "status/README.md" in second
    done = replace(RUNNING, phase="completed", finished_at=T0, message="all 2 nodes succeeded")
    (ended,) = rollout_events(RUNNING, done, "c4")
    assert slack_text(ended).splitlines()[0] == "*web* completed: all 2 nodes succeeded"


def test_agent_text_reaches_slack_as_text_never_as_a_mention_or_a_link() -> None:
    """An agent's error ends up in a hold message; Slack would read ``<!channel>``
    as a mention and ``<url|text>`` as a link unless ``&``, ``<`` and ``>`` are
    escaped as its formatting rules ask."""
    hostile = "apply failed: <!channel> see <https://evil.example|Click here> & retry"
    held = replace(HELD, hold=replace(HELD.hold, message=hostile))
    (event,) = rollout_events(RUNNING, held, "c1")
    text = slack_text(event)
    assert "<" not in text and ">" not in text
    assert "&lt;!channel&gt; see &lt;https://evil.example|Click here&gt; &amp; retry" in text
    assert text.startswith("*web* is on hold (health_failed) on web-1\n")


def test_the_commented_receiver_of_the_example_settings_is_valid() -> None:
    """example-repo/reconciler.yaml shows a chat receiver as comments (the
    demo and ``init`` copy it); without the comment marks it is valid."""
    example = Path(__file__).resolve().parent.parent / "example-repo" / "reconciler.yaml"
    text = example.read_text()
    start = text.index("  # notifications:\n")
    end = text.index("\n\n", start)
    block = re.sub(r"(?m)^  # ", "  ", text[start:end])
    parsed = parse_file("reconciler.yaml", (text[:start] + block + text[end:]).encode())
    assert parsed.problems == ()
    assert parsed.settings is not None
    (receiver,) = parsed.settings.notifications
    assert (receiver.name, receiver.format, receiver.rollouts) == (
        "ops-chat",
        "slack",
        ("llama-*",),
    )
