"""Notification events as values derived from status (docs/operating.md),
and the bodies that carry them.

An event is a fact that status records, never something the daemon
remembers: ``hold`` is "this rollout has an open hold", keyed by (rollout,
``hold.since``, reason); a terminal event by (rollout, phase);
``rolled_back`` by (rollout, request id) or (rollout, ``policy``); the fleet
watch's events by (node, state, since). The delivery id is the
SHA-256 of the key, so the same event has the same id after a restart, on
another daemon, and in any pass, and a receiver can drop duplicates.

Two ways to find events, both pure:

- ``rollout_events(old, new)``: what a status change made true (the daemon
  applies it to each status it committed);
- ``standing_rollout_events(status, now)`` and ``standing_fleet_events``:
  what is still true on start (open holds, offline or drifted nodes, and
  terminal events of the last hour), delivered again with the same ids.

Must not: send anything, read the clock, or decide about rollouts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from reconciler.spec.model import NOTIFICATION_EVENTS
from reconciler.spec.paths import DASHBOARD_PATH
from reconciler.spec.rollout_status import TERMINAL_PHASES, Hold, RolloutStatus
from reconciler.spec.times import format_time

# Terminal events this recent are delivered again on start (docs/operating.md).
REDELIVER_TERMINAL_WITHIN = timedelta(hours=1)

# Fleet states (docs/operating.md) that are events, by state.
FLEET_EVENT_OF_STATE = {"offline": "node_offline", "drift": "node_drift"}

# What a person can do next after each ending; a hold's own message says it
# for holds (engine.holds.HOLD_MESSAGES).
NEXT_STEP = {
    "completed": "nothing to do",
    "failed": "see which nodes did not succeed with `reconciler status {rollout}`; "
    "a new rollout or a rollbackRequest corrects them",
    "aborted": "jobs already sent still finish; `reconciler status {rollout}` shows every node",
    "rolled_back": "`reconciler status {rollout}` shows each node's outcome",
    "node_offline": "check the node's agent; rollouts that need it hold as unknown",
    "node_drift": "the node's config differs from what rollouts left there; "
    "a new rollout corrects it",
}


@dataclass(frozen=True)
class Event:
    """One notification event. ``key`` is what makes it this event and no
    other (docs/operating.md); everything else describes it."""

    name: str  # one of NOTIFICATION_EVENTS
    key: tuple[str, ...]
    rollout: str | None  # None for fleet events
    phase: str | None
    hold: Hold | None
    nodes: tuple[str, ...]
    message: str
    commit: str  # the status commit that recorded it

    @property
    def delivery_id(self) -> str:
        return delivery_id(self.key)


def delivery_id(key: Iterable[str]) -> str:
    """SHA-256 (hex) of the key's canonical JSON (an array of strings)."""
    text = json.dumps(list(key), separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _hold_event(status: RolloutStatus, commit: str) -> Event:
    hold = status.hold
    assert hold is not None
    return Event(
        name="hold",
        key=("hold", status.name, format_time(hold.since), hold.reason),
        rollout=status.name,
        phase=status.phase,
        hold=hold,
        nodes=hold.nodes,
        message=hold.message,
        commit=commit,
    )


def _terminal_event(status: RolloutStatus, commit: str) -> Event:
    if status.phase == "completed":
        nodes: tuple[str, ...] = ()
    else:  # the nodes that did not succeed, which someone may want to look at
        nodes = tuple(n.name for n in status.nodes if n.state != "succeeded")
    return Event(
        name=status.phase,
        key=(status.phase, status.name, status.phase),
        rollout=status.name,
        phase=status.phase,
        hold=None,
        nodes=nodes,
        message=status.message or status.reason,
        commit=commit,
    )


def _policy_rollback_event(status: RolloutStatus, commit: str) -> Event:
    hold = status.hold
    assert hold is not None
    return Event(
        name="rolled_back",
        key=("rolled_back", status.name, "policy"),
        rollout=status.name,
        phase=status.phase,
        hold=hold,
        nodes=hold.nodes,
        message=hold.message,
        commit=commit,
    )


def _request_rollback_events(
    status: RolloutStatus,
    commit: str,
    old: RolloutStatus | None = None,
    handled_since: datetime | None = None,
) -> list[Event]:
    """Rollback requests that are done, and were not done in ``old`` (and
    were handled at or after ``handled_since``)."""
    done_before = {r.id for r in old.rollbacks if r.state == "done"} if old else set()
    events = []
    for record in status.rollbacks:
        if record.state != "done" or record.id in done_before:
            continue
        if handled_since is not None and record.time < handled_since:
            continue
        restored = tuple(n.name for n in record.nodes if n.outcome == "rolled_back")
        events.append(
            Event(
                name="rolled_back",
                key=("rolled_back", status.name, "request", record.id),
                rollout=status.name,
                phase=status.phase,
                hold=None,
                nodes=restored,
                message=record.message
                or f"rollback request {record.id}: {len(restored)} node(s) restored",
                commit=commit,
            )
        )
    return events


def _is_open_hold(status: RolloutStatus) -> bool:
    return status.hold is not None and status.phase not in TERMINAL_PHASES


def rollout_events(old: RolloutStatus | None, new: RolloutStatus, commit: str) -> list[Event]:
    """The events a status change made true: a hold that opened (a new
    ``since`` or reason; nodes joining an open hold are the same event), a
    terminal phase reached, a rollback done."""
    events: list[Event] = []
    if _is_open_hold(new):
        assert new.hold is not None
        before = old.hold if old is not None and _is_open_hold(old) else None
        if before is None or (before.since, before.reason) != (new.hold.since, new.hold.reason):
            events.append(_hold_event(new, commit))
            if new.hold.reason == "rolled_back":
                events.append(_policy_rollback_event(new, commit))
    if new.phase in TERMINAL_PHASES and (old is None or old.phase != new.phase):
        events.append(_terminal_event(new, commit))
    events.extend(_request_rollback_events(new, commit, old))
    return events


def standing_rollout_events(status: RolloutStatus, now: datetime, commit: str) -> list[Event]:
    """What is still true of one rollout on start: its open hold, and its
    ending and finished rollbacks if they happened within the last hour."""
    events: list[Event] = []
    if _is_open_hold(status):
        events.append(_hold_event(status, commit))
        assert status.hold is not None
        if status.hold.reason == "rolled_back":
            events.append(_policy_rollback_event(status, commit))
    recent = now - REDELIVER_TERMINAL_WITHIN
    if status.phase in TERMINAL_PHASES and (
        status.finished_at is not None and status.finished_at >= recent
    ):
        events.append(_terminal_event(status, commit))
    events.extend(_request_rollback_events(status, commit, handled_since=recent))
    return events


# --- fleet events (docs/operating.md) ------------------------------------------------
# The fleet watch (docs/operating.md) reports each node as (state, since); these
# turn that into events, keyed by (node, state, since).

NodeState = tuple[str, datetime]  # (state, since)


def fleet_event(node: str, state: str, since: datetime, commit: str, message: str = "") -> Event:
    name = FLEET_EVENT_OF_STATE[state]
    return Event(
        name=name,
        key=(name, node, state, format_time(since)),
        rollout=None,
        phase=None,
        hold=None,
        nodes=(node,),
        message=message or f"{node} is {state} since {format_time(since)}",
        commit=commit,
    )


def fleet_events(
    old: Mapping[str, NodeState], new: Mapping[str, NodeState], commit: str
) -> list[Event]:
    """Nodes that became offline or drifted (a new (state, since))."""
    return [
        fleet_event(node, state, since, commit)
        for node, (state, since) in sorted(new.items())
        if state in FLEET_EVENT_OF_STATE and old.get(node) != (state, since)
    ]


def standing_fleet_events(nodes: Mapping[str, NodeState], commit: str) -> list[Event]:
    """Nodes offline or drifted now: still true, delivered again on start."""
    return fleet_events({}, nodes, commit)


# --- bodies ---------------------------------------------------------------------------


def json_body(event: Event) -> dict[str, Any]:
    """``{event, deliveryId, rollout, phase, hold, nodes, message, commit,
    dashboard}`` (docs/operating.md)."""
    hold = event.hold
    return {
        "event": event.name,
        "deliveryId": event.delivery_id,
        "rollout": event.rollout,
        "phase": event.phase,
        "hold": None
        if hold is None
        else {
            "reason": hold.reason,
            "message": hold.message,
            "nodes": list(hold.nodes),
            "nodeCount": hold.node_count or len(hold.nodes),
            "since": format_time(hold.since),
        },
        "nodes": list(event.nodes),
        "message": event.message,
        "commit": event.commit,
        "dashboard": DASHBOARD_PATH,
    }


def slack_text(event: Event) -> str:
    """Two lines a person reads at a glance: the rollout (or node), what
    happened and on which nodes; then what to do next and the dashboard."""
    nodes = _names(event.nodes, event.hold.node_count if event.hold else 0)
    on = f" on {nodes}" if nodes else ""
    subject = f"*{event.rollout}*" if event.rollout else f"*{nodes}*"
    if event.name == "hold":
        assert event.hold is not None
        first = f"{subject} is on hold ({event.hold.reason}){on}"
        second = event.hold.message
    elif event.name == "rolled_back":
        first = f"{subject} rolled back{on}"
        second = f"{event.message}; {_next(event)}"
    elif event.rollout is not None:
        first = f"{subject} {event.name}" + (f": {event.message}" if event.message else "")
        second = _next(event) if not nodes else f"not succeeded: {nodes}; {_next(event)}"
    else:
        first = f"{subject} {event.name.removeprefix('node_')}: {event.message}"
        second = _next(event)
    text = f"{first}\n{second[:1].upper()}{second[1:]}. Dashboard: {DASHBOARD_PATH}"
    return _slack_escaped(text)


def _slack_escaped(text: str) -> str:
    """Slack reads ``<...>`` as links and mentions (``<!channel>``) and ``&``
    as an entity's start: text from agents and files must arrive as text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _next(event: Event) -> str:
    return NEXT_STEP[event.name].format(rollout=event.rollout or "")


def _names(nodes: tuple[str, ...], count: int) -> str:
    shown = ", ".join(nodes[:5])
    more = max(count, len(nodes)) - min(len(nodes), 5)
    return f"{shown} and {more} more" if more > 0 else shown


assert set(NEXT_STEP) | {"hold"} == set(NOTIFICATION_EVENTS)
