"""Releases: stopping the previous slot a standby apply kept warm
(docs/rollouts.md#warm-standby), as a table and pure rules.

Theory of operation. A live apply of a rollout with ``standby`` starts the
target in the node's idle slot and moves traffic to it; the previous slot
keeps running, so a rollback routes back to it in a second. The apply's
answer names that slot, and the node's record keeps it (``standby.slot``).
A ``release`` job stops it. ``RELEASE_RULES`` says when, by
``keepPrevious`` and the moment: ``passed`` (the node's verdict passed) or
``ended`` (the rollout's phase is terminal, whatever ended it). Never while
the node's apply or a restore is in flight or decided: a restore routes
back to that slot.

A release is housekeeping: it holds nothing and fails nothing. Its job is
observed like any other (the daemon re-sends it, same id, to an agent that
does not know it) until it succeeded, failed, or its deadline passed
(``healthTimeout`` after it was sent); a failure or a deadline is recorded
in ``standby.releaseError`` and not retried: the job id is fixed per apply
attempt and an agent runs a job once, so the error tells a person what to
stop by hand.

Values in, values out: the step records what these return. Must not read
the clock, do IO, or know about status files.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from reconciler.engine.holds import RESTORE_STATES, restore_waiting
from reconciler.protocol.effects import SendJob
from reconciler.protocol.job_ids import job_id
from reconciler.protocol.observations import NO_EVIDENCE, JobObservation
from reconciler.spec.rollout_status import FrozenSpec, NodeRecord, StandbyRecord

KEEP_PREVIOUS = ("untilSoaked", "untilCompleted")
MOMENTS = ("passed", "ended")


@dataclass(frozen=True)
class ReleaseRule:
    keep_previous: str  # untilSoaked | untilCompleted
    moment: str  # passed: the node's verdict passed; ended: the rollout's phase is terminal
    release: bool
    says: str  # the table cell, as docs/rollouts.md words it


RELEASE_RULES: tuple[ReleaseRule, ...] = (
    ReleaseRule("untilSoaked", "passed", True, "release"),
    ReleaseRule("untilSoaked", "ended", True, "release"),
    ReleaseRule("untilCompleted", "passed", False, "keep warm"),
    ReleaseRule("untilCompleted", "ended", True, "release"),
)
assert {(r.keep_previous, r.moment) for r in RELEASE_RULES} == {
    (k, m) for k in KEEP_PREVIOUS for m in MOMENTS
}, "one release rule per keepPrevious and moment"


def decide(keep_previous: str, moment: str) -> bool:
    """Whether the table releases at ``moment`` under ``keep_previous``."""
    for rule in RELEASE_RULES:
        if rule.keep_previous == keep_previous and rule.moment == moment:
            return rule.release
    raise ValueError(f"no release rule for {keep_previous} at {moment}")


def moment(node: NodeRecord, ended: bool) -> str | None:
    """The moment the node is at: the rollout ended, or its verdict passed."""
    if ended:
        return "ended"
    if node.state == "succeeded" and node.verdict == "passed":
        return "passed"
    return None


def waiting_on_slot(node: NodeRecord) -> bool:
    """The previous slot may still be needed: an apply in flight, or a restore
    decided or in flight (a restore routes back to the warm slot)."""
    return node.state == "dispatched" or node.state in RESTORE_STATES or restore_waiting(node)


def due(frozen: FrozenSpec, node: NodeRecord, ended: bool) -> bool:
    """Whether the node's kept slot is to be released now."""
    standby = node.standby
    if frozen.standby is None or standby is None or standby.release_job_id is not None:
        return False
    if waiting_on_slot(node):
        return False
    at = moment(node, ended)
    return at is not None and decide(frozen.standby, at)


def kept_slot(node: NodeRecord, job: JobObservation | None) -> StandbyRecord | None:
    """The node's standby record after its apply's answer: the slot the
    answer says is kept warm, or the record as it was (an answer without
    one keeps an earlier attempt's slot, which still runs)."""
    answer = job.standby if job is not None else None
    slot = answer.get("slot") if answer is not None else None
    if isinstance(slot, str) and slot:
        return StandbyRecord(slot=slot)
    return node.standby


def sent(node: NodeRecord, *, rollout: str, start_commit: str, deadline: datetime) -> StandbyRecord:
    """The standby record once its release is sent (the node's current apply attempt)."""
    assert node.standby is not None
    release = job_id(rollout, start_commit, node.name, node.attempt, "release")
    return replace(node.standby, release_job_id=release, release_deadline=deadline)


def release_job(rollout: str, frozen: FrozenSpec, node: NodeRecord) -> SendJob:
    """The release job recorded on ``node``, rebuilt from status alone."""
    assert node.standby is not None and node.standby.release_job_id is not None
    assert node.source_commit is not None
    return SendJob(
        job_id=node.standby.release_job_id,
        kind="release",
        node=node.name,
        rollout=rollout,
        attempt=node.attempt,
        mode="live",
        target=frozen.target,
        source_commit=node.source_commit,
    )


def observed(
    standby: StandbyRecord, job: JobObservation | None, now: datetime
) -> tuple[StandbyRecord, str] | None:
    """The record after this pass's answer to an open release, and why; None
    while it waits (no answer yet, or an unreachable agent before the deadline)."""
    assert standby.release_deadline is not None
    if job is not None and job.state == "succeeded":
        return replace(standby, released_at=now), f"slot {standby.slot} released"
    if job is not None and job.state in ("failed", "refused"):
        error = (
            f"release failed: {job.error or job.state}; slot {standby.slot} may still run: "
            "stop it on the node"
        )
        return replace(standby, release_error=error), error
    if now >= standby.release_deadline:
        why = job.error if job is not None and job.state == "unreachable" else "no answer"
        if why.startswith(NO_EVIDENCE):
            why = why[len(NO_EVIDENCE) :].strip()
        error = (
            f"release unanswered by its deadline ({why}); slot {standby.slot} may still run: "
            "stop it on the node"
        )
        return replace(standby, release_error=error), error
    return None


def render_release_table() -> str:
    """``RELEASE_RULES`` as a Markdown table (moments as rows, keepPrevious as columns)."""
    lines = ["| moment | " + " | ".join(KEEP_PREVIOUS) + " |", "|---" * 3 + "|"]
    words = {"passed": "the node's verdict passed", "ended": "the rollout ended (any way)"}
    for at in MOMENTS:
        cells = [
            r.says
            for k in KEEP_PREVIOUS
            for r in RELEASE_RULES
            if (k, at) == (r.keep_previous, r.moment)
        ]
        lines.append(f"| {words[at]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
