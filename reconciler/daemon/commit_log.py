"""The log lines and metrics of a status commit: one line a transition,
one a node state change of the fleet watch.

Must not: decide or write anything but log lines and metrics.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from reconciler.daemon.logs import EventLog
from reconciler.daemon.metrics import Metrics
from reconciler.engine import fleet as fleet_rules
from reconciler.engine.step import FleetStep


def log_commit(
    log: EventLog,
    metrics: Metrics,
    step: FleetStep,
    fleet_changes: Sequence[fleet_rules.FleetChange],
    commit: str,
) -> None:
    """What the status commit ``commit`` recorded, logged and counted."""
    metrics.commits.inc()
    log.info_many(
        (
            "transition",
            f"{t.from_state} -> {t.to_state}" + (f" ({t.reason})" if t.reason else ""),
            {"rollout": t.rollout, "node": t.node, "commit": commit[:12]},
        )
        for t in step.transitions
    )
    for state, count in Counter(t.to_state for t in step.transitions if t.node).items():
        metrics.verdicts.labels(state=state).inc(count)
    _log_fleet_changes(log, fleet_changes, commit)


def _log_fleet_changes(
    log: EventLog, changes: Sequence[fleet_rules.FleetChange], commit: str
) -> None:
    """One log line per node state change (nodes listed ``ok`` for the
    first time are counted in one line); ``node_offline`` and
    ``node_drift`` are the notification events' names (docs/operating.md)."""
    first_ok = [c for c in changes if c.from_state is None and c.to_state == "ok"]
    if first_ok:
        log.info("fleet_listed", f"{len(first_ok)} node(s) listed ok", commit=commit[:12])
    for change in changes:
        if change.from_state is None and change.to_state == "ok":
            continue
        event = fleet_rules.FLEET_EVENTS.get(change.to_state or "", "node_state")
        text = f"{change.from_state or 'new'} -> {change.to_state or 'gone'}"
        if change.detail:
            text += f": {change.detail}"
        write = log.warning if change.to_state in fleet_rules.FLEET_EVENTS else log.info
        write(event, text, node=change.node, commit=commit[:12])
