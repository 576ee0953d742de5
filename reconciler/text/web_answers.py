"""The read API's answers (docs/web.md), made from one committed view of
the status branch: the rollouts at a glance, one rollout's status as in its
status files, the fleet status, and the events between two views.

A ``StatusView`` is what the daemon hands over after it made or read a
status commit: immutable values only, so the server answers from it while
the next pass runs. ``Answers`` are built from a view in the server's own
thread, reusing what the view before left unchanged (a status that is the
same value is summarised once).

``status NAME --format json`` and ``fleet --format json`` print what the
detail and fleet answers hold, byte for byte: both come from the same
renderers (``status_text.render_json``, ``fleet_text.render_fleet_json``).

Deterministic and pure: must not read Git, files, sockets or the clock.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.spec.fleet_status import FleetStatus
from reconciler.spec.rollout_status import RolloutStatus, to_record
from reconciler.spec.times import format_time
from reconciler.text.fleet_text import render_fleet_json
from reconciler.text.status_text import render_json
from reconciler.text.web_page import render_page, rollout_row

DEFAULT_LIMIT = 500  # node records in one rollout answer, unless ?limit= says otherwise
MAX_LIMIT = 10_000

# What ``reconciler fleet --format json`` prints before the first sweep.
NO_FLEET = json.dumps({"kind": "FleetStatus", "nodes": None}) + "\n"

_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class StatusView:
    """The statuses and the fleet status at one status commit, as the
    daemon made or read it (``commit`` None: no status branch yet)."""

    commit: str | None
    statuses: Mapping[str, RolloutStatus]
    fleet: FleetStatus | None


@dataclass(frozen=True)
class Event:
    """One Server-Sent Event: ``kind`` is its ``event:`` field, ``id`` a
    digest of what it says (the same transition has the same id whichever
    daemon reports it), ``data`` its JSON."""

    kind: str  # transition | fleet | commit
    id: str
    data: Mapping[str, Any]

    def frame(self) -> bytes:
        body = _COMPACT.encode(self.data)
        return f"id: {self.id}\nevent: {self.kind}\ndata: {body}\n\n".encode()


@dataclass(frozen=True)
class Answers:
    """The answers of one view; ``rollouts`` and ``fleet`` are bodies ready
    to send, ``summaries`` the list's entries by name (reused by the next
    view for statuses that did not change)."""

    view: StatusView
    summaries: Mapping[str, bytes]  # each entry's JSON
    rollouts: bytes
    fleet: bytes
    rows: Mapping[str, str]  # each rollout's row of the page's table (HTML)

    def page(self, selected: str | None = None) -> bytes:
        """The web page as at this view, with rollout ``selected`` in full."""
        status = self.view.statuses.get(selected) if selected else None
        fleet = json.loads(self.fleet) if self.view.fleet is not None else None
        html = render_page(
            commit=self.view.commit,
            rows=self.rows.values(),
            fleet=fleet,
            selected=status,
            selected_name=selected,
            node_limit=DEFAULT_LIMIT,
        )
        return html.encode()

    def rollout(self, name: str, offset: int = 0, limit: int = DEFAULT_LIMIT) -> bytes | None:
        """One rollout's status as in its status files, with node records
        ``offset`` to ``offset + limit``; None for a rollout with no status.
        With every node, the exact text of ``status NAME --format json``."""
        status = self.view.statuses.get(name)
        if status is None:
            return None
        if offset == 0 and limit >= len(status.nodes):
            return render_json([status], one=True).encode()
        record = to_record(status)
        record["nodes"] = record["nodes"][offset : offset + limit]
        return (json.dumps(record, indent=2, ensure_ascii=False) + "\n").encode()


def summary(status: RolloutStatus) -> dict[str, Any]:
    """A rollout at a glance: ``{name, phase, hold, waiting, progress,
    target, specCommit, updatedAt}`` (``updatedAt``: its latest transition)."""
    record = to_record(status, inline_nodes=False)
    frozen = record["frozen"]
    return {
        "name": status.name,
        "phase": status.phase,
        "hold": record["hold"],
        "waiting": record.get("waiting"),
        "progress": record["progress"],
        "target": frozen["target"] if frozen is not None else None,
        "specCommit": status.spec_commit,
        "updatedAt": format_time(status.transitions[-1].time) if status.transitions else None,
    }


def answers_for(view: StatusView, before: Answers | None = None) -> Answers:
    """The answers of ``view``; summaries of statuses that are the same
    values as in ``before`` are taken from it."""
    old = before.summaries if before is not None else {}
    old_statuses = before.view.statuses if before is not None else {}
    old_rows = before.rows if before is not None else {}
    summaries: dict[str, bytes] = {}
    rows: dict[str, str] = {}
    for name in sorted(view.statuses):
        status = view.statuses[name]
        kept, kept_row = old.get(name), old_rows.get(name)
        same = old_statuses.get(name) is status
        if same and kept is not None and kept_row is not None:
            summaries[name], rows[name] = kept, kept_row
        else:
            summaries[name] = _COMPACT.encode(summary(status)).encode()
            rows[name] = rollout_row(status)
    rollouts = b"[" + b",".join(summaries.values()) + b"]"
    if before is not None and before.view.fleet is view.fleet:
        fleet = before.fleet
    else:
        fleet = (render_fleet_json(view.fleet) if view.fleet is not None else NO_FLEET).encode()
    return Answers(view, summaries, rollouts, fleet, rows)


def events_between(before: StatusView, after: StatusView) -> list[Event]:
    """What ``after`` says happened since ``before``: when anything changed
    at all, first one ``commit`` event naming the rollouts whose status
    changed (a node's progress is no transition); then each phase
    transition recorded since (by rollout name), and each node whose fleet
    state changed."""
    events: list[Event] = []
    changed: list[str] = []
    for name in sorted(after.statuses):
        status = after.statuses[name]
        old = before.statuses.get(name)
        if old is status or old == status:
            continue
        changed.append(name)
        seen = set(old.transitions) if old is not None else set()
        for t in status.transitions:
            if t in seen:
                continue
            data = {
                "rollout": name,
                "from": t.from_phase,
                "to": t.to_phase,
                "reason": t.reason,
                "commit": t.commit,
                "time": format_time(t.time),
            }
            events.append(Event("transition", _digest("transition", data), data))
    removed = sorted(set(before.statuses) - set(after.statuses))
    fleet_changed = before.fleet != after.fleet
    if fleet_changed:
        events += _fleet_events(before.fleet, after.fleet, after.commit)
    if changed or removed or fleet_changed:
        summary_of_commit: dict[str, Any] = {
            "commit": after.commit,
            "rollouts": changed + removed,
            "fleet": fleet_changed,
        }
        events.insert(0, Event("commit", _digest("commit", summary_of_commit), summary_of_commit))
    return events


def _fleet_events(
    before: FleetStatus | None, after: FleetStatus | None, commit: str | None
) -> list[Event]:
    old = before.by_name() if before is not None else {}
    events = []
    for node in after.nodes if after is not None else ():
        was = old.get(node.name)
        if was is not None and (was.state, was.since) == (node.state, node.since):
            continue
        data = {
            "node": node.name,
            "from": was.state if was is not None else None,
            "to": node.state,
            "since": format_time(node.since),
            "commit": commit,
        }
        events.append(Event("fleet", _digest("fleet", data, "commit"), data))
    return events


def _digest(kind: str, data: Mapping[str, Any], *leave_out: str) -> str:
    key = {k: v for k, v in data.items() if k not in leave_out}
    return hashlib.sha256(f"{kind}:{json.dumps(key, sort_keys=True)}".encode()).hexdigest()[:32]


__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "NO_FLEET",
    "Answers",
    "Event",
    "StatusView",
    "answers_for",
    "events_between",
    "summary",
]
