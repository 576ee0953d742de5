"""Every hold message read with one held node and with several: the words
around the node names agree with how many there are, and a long agent error
is clipped while the instruction after it is kept whole."""

from __future__ import annotations

import re

import pytest

from reconciler.engine.holds import AGREEING, DETAIL_LIMIT, HOLD_MESSAGES, hold_message

# reason -> (with one node, with two), as a person should read them.
EXPECTED = {
    "health_failed": (
        "health check failed on a (boom); set a new resumeRequest to try it again, "
        "list it in skipNodes to give up on it, or abort",
        "health check failed on a, b (boom); set a new resumeRequest to try them again, "
        "list them in skipNodes to give up on them, or abort",
    ),
    "health_unknown": (
        "no health evidence from a (boom); check its agent, then set a new resumeRequest "
        "to try again, list it in skipNodes, or abort",
        "no health evidence from a, b (boom); check their agents, then set a new "
        "resumeRequest to try again, list them in skipNodes, or abort",
    ),
    "retry_exhausted": (
        "failed again after the automatic retry on a (boom); set a new resumeRequest to try "
        "once more, list it in skipNodes, or abort",
        "failed again after the automatic retry on a, b (boom); set a new resumeRequest to "
        "try once more, list them in skipNodes, or abort",
    ),
    "stopped": (
        "stopped on failure, a left as it is (boom); set a new resumeRequest to skip it "
        "and carry on, or abort",
        "stopped on failure, a, b left as they are (boom); set a new resumeRequest to skip "
        "them and carry on, or abort",
    ),
    "rollback_pending": (
        "restoring a from its first backup after a failure (boom); wait for the restore, or abort",
        "restoring a, b from their first backups after a failure (boom); wait for the "
        "restore, or abort",
    ),
    "rolled_back": (
        "a failed and was restored from its backup (boom); set a new resumeRequest to "
        "skip it and carry on, or abort",
        "a, b failed and were restored from their backups (boom); set a new resumeRequest "
        "to skip them and carry on, or abort",
    ),
    "rollback_failed": (
        "restoring a failed (boom); inspect it (reconciler backups NODE), then set a new "
        "resumeRequest to skip it and carry on, or abort",
        "restoring a, b failed (boom); inspect them (reconciler backups NODE), then set a "
        "new resumeRequest to skip them and carry on, or abort",
    ),
    "rollback_unavailable": (
        "a failed and has no backup to restore (boom); set a new resumeRequest to try it "
        "again, list it in skipNodes, or abort",
        "a, b failed and have no backup to restore (boom); set a new resumeRequest to try "
        "them again, list them in skipNodes, or abort",
    ),
    "dispatch_refused": (
        "cannot send jobs to a (boom); fix the node file (maintenance, agent address), then "
        "set a new resumeRequest, list it in skipNodes, or abort",
        "cannot send jobs to a, b (boom); fix the node files (maintenance, agent address), "
        "then set a new resumeRequest, list them in skipNodes, or abort",
    ),
    "failure_budget_exceeded": (
        "more nodes failed than failureBudget allows: a ended failed, timed out or unknown "
        "(boom); set a new resumeRequest to carry on (observe recorded it, and the next "
        "failure holds again), or abort",
        "more nodes failed than failureBudget allows: a, b ended failed, timed out or unknown "
        "(boom); set a new resumeRequest to carry on (observe recorded them, and the next "
        "failure holds again), or abort",
    ),
}
NO_NODES = {
    "operator_paused": "paused by the operator (spec.paused is true); set paused: false to carry on",
    "pause_after_batch": (
        "batch 2 finished and pauseAfter holds here; set a new resumeRequest to start "
        "batch 3, or abort"
    ),
}


def test_every_reason_is_read_here() -> None:
    assert set(EXPECTED) | set(NO_NODES) == set(HOLD_MESSAGES)


@pytest.mark.parametrize("reason", sorted(EXPECTED))
def test_one_node_and_several(reason: str) -> None:
    one, several = EXPECTED[reason]
    assert hold_message(reason, nodes=["a"], error="boom") == one
    assert hold_message(reason, nodes=["a", "b"], error="boom") == several


@pytest.mark.parametrize("reason", sorted(NO_NODES))
def test_holds_without_nodes(reason: str) -> None:
    assert hold_message(reason, batch=2) == NO_NODES[reason]


def test_many_nodes_read_as_several() -> None:
    names = [f"n{i}" for i in range(30)]
    message = hold_message("rolled_back", nodes=names)
    assert message.startswith("n0, n1, ")
    assert " and 10 more failed and were restored from their backups;" in message


def test_every_agreeing_word_is_used_and_every_placeholder_known() -> None:
    used = {f for text in HOLD_MESSAGES.values() for f in re.findall(r"{(\w+)}", text)}
    assert set(AGREEING) <= used
    assert used - set(AGREEING) <= {"nodes", "detail", "batch", "next"}


def test_a_long_error_is_clipped_never_the_instruction() -> None:
    error = "job failed: " + "disk full " * 60
    message = hold_message("health_failed", nodes=["gpu-b4"], error=error)
    quoted = message[message.index("(") + 1 : message.index(")")]
    assert len(quoted) == DETAIL_LIMIT
    assert quoted.endswith("…")
    assert message.endswith(
        "; set a new resumeRequest to try it again, list it in skipNodes to give up on it, or abort"
    )
    assert message.count("gpu-b4") == 1
