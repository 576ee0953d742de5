"""Rollout shapes the engine applies (docs/rollouts.md), besides the
batch sizes (``spec.batch_shapes``) and the windows (``calendar``): when a
timed ``pauseAfter`` hold lifts by itself, and when ``after`` lets a rollout
start. Pure: the step hands in ``now`` and the other rollouts' statuses.

Timed pause rule: the ``pause_after_batch`` hold after batch N, with an
entry ``{batch: N, for: D}``, lifts at ``since + D`` (``since``: when the
hold opened, daemon clock) when every node of batch N succeeded on its first
attempt. A failure that joined the batch (a failed, timed-out, unknown,
retried, skipped or rolled-back node) keeps it until a resume.

``after`` rules, by the phase of each named rollout, first match wins:

| named rollout's phase          | this rollout                      | reason         |
|--------------------------------|-----------------------------------|----------------|
| ``failed`` or ``aborted``      | stays pending, names it           | ``after_failed`` |
| no status yet, or not ended    | stays pending, waits for it       | ``after``      |
| ``completed``                  | may start (if all are)            |                |
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from reconciler.spec.rollout_status import NodeRecord, RolloutStatus

__all__ = ["AFTER_RULES", "after_wait", "timed_pause_until"]

# (phases of the named rollout, reason, message) in the order checked.
AFTER_RULES: tuple[tuple[frozenset[str | None], str, str], ...] = (
    (
        frozenset({"failed", "aborted"}),
        "after_failed",
        "rollout {name} ended {phase}, and this one starts only after it completed; "
        "remove {name} from after to start anyway, or abort",
    ),
    (
        frozenset({None, "pending", "scheduled", "running", "paused"}),
        "after",
        "waits for rollout {name} to complete (it is {phase})",
    ),
)


def after_wait(
    after: Sequence[str], statuses: Mapping[str, RolloutStatus]
) -> tuple[str, str] | None:
    """(reason, message) while ``after`` keeps a rollout pending; None when
    every named rollout has completed."""
    for phases, reason, message in AFTER_RULES:
        for name in after:
            status = statuses.get(name)
            phase = status.phase if status is not None else None
            if phase in phases:
                return reason, message.format(name=name, phase=phase or "not yet seen")
    return None


def timed_pause_until(
    pause_for: Iterable[tuple[int, int]],
    batch: int,
    since: datetime,
    batch_nodes: Iterable[NodeRecord],
) -> datetime | None:
    """When the hold after ``batch`` lifts by itself: None when the entry is
    not timed, or a failure joined the batch."""
    seconds = dict(pause_for).get(batch)
    if seconds is None:
        return None
    if not all(n.state == "succeeded" and n.attempt == 1 for n in batch_nodes):
        return None
    return since + timedelta(seconds=seconds)
