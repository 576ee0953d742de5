"""Holds as one table: every reason a rollout can be held for, the message
that tells the operator what to do about it, and what a resume does with
each held node (docs/rollouts.md). The engine applies these; the
reasons themselves are the status format's (``rollout_status.HOLD_REASONS``),
and a test keeps both lists the same."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime

from reconciler.engine.evidence import JOB_FAILED, JOB_REFUSED
from reconciler.spec.rollout_status import HOLD_NODES_SHOWN, Hold, NodeRecord, OperatorAct
from reconciler.spec.times import format_time

# A node's health verdict; restores in flight.
VERDICT_STATES = frozenset({"failed", "timed_out", "unknown"})
RESTORE_STATES = frozenset({"rollback_pending", "restoring"})

# What a resumeRequest does with a held node, by the node's state (docs/rollouts.md). Question nodes (a verdict: failed, timed_out, unknown, whether held by
# health, retry_exhausted or rollback_unavailable; and a `pending` node held
# by dispatch_refused) are asked again as a new attempt. Statement nodes
# become `skipped`. A node removed or in maintenance is skipped whatever its
# state. The other states are never held when a resume gets this far (a
# restore in flight refuses the resume first), so a resume leaves them.
ASK_AGAIN, SKIP, LEAVE, CARRY_ON = "ask again", "skip", "leave", "carry on"
RESUME_OF_HELD: Mapping[str, str] = {
    # a staged node is held only when its apply cannot be sent: the step
    # sends it once the hold is gone
    "staged": CARRY_ON,
    "staging": LEAVE,
    "failed": ASK_AGAIN,
    "timed_out": ASK_AGAIN,
    "unknown": ASK_AGAIN,
    "pending": ASK_AGAIN,
    "stopped": SKIP,
    "rolled_back": SKIP,
    "rollback_failed": SKIP,
    "dispatched": LEAVE,
    "succeeded": LEAVE,
    "skipped": LEAVE,
    "rollback_pending": LEAVE,
    "restoring": LEAVE,
}

# What a resume does with a node held for these reasons, whatever its state
# (and before a removed or maintenance node is skipped): a node past the
# failureBudget was recorded by observe, so a resume carries on without
# sending it again (docs/capacity.md).
RESUME_OF_REASON: Mapping[str, str] = {"failure_budget_exceeded": CARRY_ON}

# Why a hold exists and what the operator can do, by reason: the commands
# to run from a clone of the fleet repository (docs/cli.md). The words in
# braces other than those ``hold_message`` fills agree with the number of
# held nodes (``AGREEING``): "gpu-b4 failed and was restored from its
# backup", "gpu-b4, gpu-b5 failed and were restored from their backups".
HOLD_MESSAGES = {
    "operator_paused": "paused by the operator (spec.paused is true); to carry on: {resume}",
    "pause_after_batch": (
        "batch {batch} finished and pauseAfter holds here; to start batch {next}: {resume}; "
        "to end the rollout: {abort}"
    ),
    "health_failed": (
        "{failure} on {nodes}{detail}; to try {them} again: {resume}; to give up on {them}: "
        "{skip}{restore}; to end the rollout: {abort}"
    ),
    "health_unknown": (
        "no health evidence from {nodes}{detail}; check {their} {agents}, then to try again: "
        "{resume}; to give up on {them}: {skip}; to end the rollout: {abort}"
    ),
    "retry_exhausted": (
        "failed again after the automatic retry on {nodes}{detail}; to try once more: "
        "{resume}; to give up on {them}: {skip}{restore}; to end the rollout: {abort}"
    ),
    "stopped": (
        "stopped on failure, {nodes} left as {they} {are}{detail}{restore}; to skip {them} "
        "and carry on: {resume}; to end the rollout: {abort}"
    ),
    "rollback_pending": (
        "restoring {nodes} from {their} first {backups} after a failure{detail}; "
        "wait for the restore, or to end the rollout: {abort}"
    ),
    "rolled_back": (
        "{nodes} failed and {were} restored from {their} {backups}{detail}; to skip {them} "
        "and carry on: {resume}; to end the rollout: {abort}"
    ),
    "rollback_failed": (
        "restoring {nodes} failed{detail}; inspect {them} (reconciler backups NODE), then to "
        "skip {them} and carry on: {resume}; to end the rollout: {abort}"
    ),
    "rollback_unavailable": (
        "{nodes} failed and {have} no backup to restore{detail}; to try {them} again: "
        "{resume}; to give up on {them}: {skip}; to end the rollout: {abort}"
    ),
    "dispatch_refused": (
        "cannot send jobs to {nodes}{detail}; fix the node {files} (maintenance, agent "
        "address), then to try again: {resume}; to give up on {them}: {skip}; to end the "
        "rollout: {abort}"
    ),
    "failure_budget_exceeded": (
        "more nodes failed than failureBudget allows: {nodes} ended failed, timed out or "
        "unknown{detail}; to carry on (observe recorded {them}, and the next failure holds "
        "again): {resume}; to end the rollout: {abort}"
    ),
    "stage_failed": (
        "staging the artifacts failed on {nodes}{detail}; nothing on {them} changed; fix the "
        "cause (the artifact server, its digest, the nodes' free space), then to stage "
        "{them} again: {resume}; to give up on {them}: {skip}; to end the rollout: {abort}"
    ),
    "eval_baseline_failed": (
        "the eval baseline answers could not be recorded on {nodes}{detail}; no node was "
        "applied to; check {their} {agents} and runtimes, then to ask {them} again: {resume}; "
        "to end the rollout: {abort}"
    ),
}

# The commands a hold message gives, filled with the rollout's name and
# the held nodes (past ``HOLD_NODES_SHOWN`` of them, a placeholder).
COMMANDS: Mapping[str, str] = {
    "resume": "reconciler resume {rollout} --push",
    "skip": "reconciler skip {rollout} {node_words} --push",
    "abort": "reconciler abort {rollout} --push",
    "rollback": "reconciler rollback {rollout} --nodes {node_commas} --push",
}

# What failed, in a health_failed hold, by how the failed nodes' errors
# start (the evidence rules' words); "": errors that start differently.
FAILURES: Mapping[str, str] = {
    JOB_FAILED: "the apply failed",
    JOB_REFUSED: "the agent refused the job",
    "deadline passed": "the deadline passed",
    "drift": "the config drifted",
    "health check": "health check failed",
    "": "failed",
}
# Failures after which the agent left or put back the previous config:
# nothing to restore.
UNCHANGED = frozenset({JOB_FAILED, JOB_REFUSED})
# Holds whose message offers a restore from backups, on a live rollout.
RESTORE_OFFERED = frozenset({"health_failed", "retry_exhausted", "stopped"})
RESTORE_WORDS = "; to restore {them} from {their} first {backups}: {rollback}"

# The words of HOLD_MESSAGES that agree with the number of nodes: (one, several).
AGREEING: Mapping[str, tuple[str, str]] = {
    "they": ("it", "they"),
    "them": ("it", "them"),
    "their": ("its", "their"),
    "are": ("is", "are"),
    "were": ("was", "were"),
    "have": ("has", "have"),
    "agents": ("agent", "agents"),
    "backups": ("backup", "backups"),
    "files": ("file", "files"),
}

# How much of the first held node's error a hold message quotes: the
# instruction after it is never cut, the error is.
DETAIL_LIMIT = 120

# A pauseAfter entry with ``for`` (docs/rollouts.md): the hold lifts itself.
TIMED_PAUSE_MESSAGE = (
    "batch {batch} finished and pauseAfter holds here until {until}, then batch {next} "
    "starts by itself; to start it now: {resume}; to end the rollout: {abort}"
)


def hold_message(
    reason: str,
    *,
    rollout: str,
    nodes: Sequence[str] = (),
    error: str = "",
    errors: Sequence[str] = (),
    batch: int = 0,
    until: datetime | None = None,
    live: bool = False,
) -> str:
    """The message of ``rollout``'s hold for ``reason``: the held ``nodes``
    (the first few, and how many more), the first one's ``error`` (clipped
    to ``DETAIL_LIMIT``), what failed (from ``errors``, every held node's;
    by default ``error`` alone), the ``batch`` a pauseAfter holds after and
    ``until`` when it lifts itself, and the commands that answer it (a
    restore only on a ``live`` rollout)."""
    commands = _commands(rollout, nodes)
    if reason == "pause_after_batch" and until is not None:
        return TIMED_PAUSE_MESSAGE.format(
            batch=batch, next=batch + 1, until=format_time(until), **commands
        )
    failed = _failure(errors or (error,))
    if reason == "health_failed" and failed:
        error = error.removeprefix(failed).lstrip(": ")
    error = " ".join(error.split())
    if len(error) > DETAIL_LIMIT:
        error = error[: DETAIL_LIMIT - 1].rstrip() + "…"
    words = {word: forms[0 if len(nodes) == 1 else 1] for word, forms in AGREEING.items()}
    offered = live and reason in RESTORE_OFFERED and failed not in UNCHANGED
    restore = RESTORE_WORDS.format(**words, **commands) if offered else ""
    return HOLD_MESSAGES[reason].format(
        nodes=name_list(nodes),
        detail=f" ({error})" if error else "",
        failure=FAILURES[failed],
        batch=batch,
        next=batch + 1,
        restore=restore,
        **commands,
        **words,
    )


def _commands(rollout: str, nodes: Sequence[str]) -> dict[str, str]:
    """``COMMANDS`` filled for ``rollout`` and its held ``nodes``."""
    shown = nodes if len(nodes) <= HOLD_NODES_SHOWN else ()
    return {
        name: text.format(
            rollout=rollout,
            node_words=" ".join(shown) or "NODE...",
            node_commas=",".join(shown) or "NODE,...",
        )
        for name, text in COMMANDS.items()
    }


def _failure(errors: Sequence[str]) -> str:
    """The start in ``FAILURES`` that every one of ``errors`` begins with, else ""."""
    starts = {next((s for s in FAILURES if s and e.startswith(s)), "") for e in errors}
    return starts.pop() if len(starts) == 1 else ""


def hold_over(
    held: Sequence[NodeRecord],
    current: Hold | None,
    paused_after: int | None,
    until: datetime | None,
    operator_paused: bool,
    now: datetime,
    failed: Sequence[str] = (),
    paused_by: OperatorAct | None = None,
    *,
    rollout: str,
    live: bool = False,
) -> Hold | None:
    """``rollout``'s hold, from the first cause that applies: the ``held``
    nodes (the current reason while some node is still held for it, else
    the first held node's); the pauseAfter batch ``paused_after`` (lifting
    itself at ``until``); the operator pause. ``current`` itself when
    nothing about it changed, so an idle pass writes nothing. A
    ``failure_budget_exceeded`` hold names every node the budget counts
    (``failed``), not only those past it. The message offers a restore
    only on a ``live`` rollout. The operator pause names who paused it and
    why (``paused_by``), when known."""
    if held:
        reasons = [n.held for n in held]
        reason = current.reason if current is not None and current.reason in reasons else reasons[0]
        assert reason is not None
        names = tuple(n.name for n in held)
        if reason == "failure_budget_exceeded" and failed:
            names = tuple(failed)
        first = next(n for n in held if n.held == reason)
        errors = [n.error for n in held if n.held == reason]
        message = hold_message(
            reason, rollout=rollout, nodes=names, error=first.error, errors=errors, live=live
        )
        return _hold(current, reason, message, names, now)
    if paused_after is not None:
        message = hold_message(
            "pause_after_batch", rollout=rollout, batch=paused_after, until=until
        )
        return _hold(current, "pause_after_batch", message, (), now, until)
    if operator_paused:
        message = hold_message("operator_paused", rollout=rollout)
        if paused_by is not None:
            message += f" (paused by {paused_by.describe()})"
        return _hold(current, "operator_paused", message, (), now)
    return None


def operator_words(act: OperatorAct | None) -> tuple[str, str]:
    """Who acted and why, for a message: ("the operator", "") when unknown."""
    if act is None:
        return "the operator", ""
    subject = act.message.split("\n", 1)[0].strip()
    return act.author, f" in {act.commit[:12]}" + (f": {subject}" if subject else "")


def hold_since(current: Hold | None, reason: str, now: datetime) -> datetime:
    """When a hold for ``reason`` opened: kept while the reason stays."""
    return current.since if current is not None and current.reason == reason else now


def _hold(
    current: Hold | None,
    reason: str,
    message: str,
    names: tuple[str, ...],
    now: datetime,
    until: datetime | None = None,
) -> Hold:
    new = Hold(
        reason=reason,
        message=message,
        since=hold_since(current, reason, now),
        nodes=names[:HOLD_NODES_SHOWN],
        node_count=len(names),
        until=until,
    )
    return current if current == new else new


def restore_waiting(node: NodeRecord) -> bool:
    """The policy decided a restore that waits for the agent's backup list."""
    return node.held == "rollback_pending" and node.state not in RESTORE_STATES


def name_list(names: Sequence[str]) -> str:
    """``a, b, c and 7 more``: the names a hold shows."""
    shown = ", ".join(names[:HOLD_NODES_SHOWN])
    more = len(names) - HOLD_NODES_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def quoted(value: str) -> str:
    """A token or id as messages quote it: JSON notation, which reads the
    same in YAML (never Python's repr)."""
    return json.dumps(value, ensure_ascii=False)
