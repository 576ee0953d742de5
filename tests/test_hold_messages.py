"""Every hold message read with one held node and with several: the words
around the node names agree with how many there are, and a long agent error
is clipped while the instruction after it is kept whole."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from reconciler.cli.main import build_parser
from reconciler.engine.holds import (
    AGREEING,
    COMMANDS,
    DETAIL_LIMIT,
    HOLD_MESSAGES,
    TIMED_PAUSE_MESSAGE,
    hold_message,
)

# reason -> (with one node, with two), as a person should read them, for
# rollout "web" held on node a (and b), whose error is "boom".
RESUME = "reconciler resume web --push"
ABORT = "reconciler abort web --push"
SKIP_ONE, SKIP_TWO = "reconciler skip web a --push", "reconciler skip web a b --push"
EXPECTED = {
    "health_failed": (
        f"failed on a (boom); to try it again: {RESUME}; to give up on it: {SKIP_ONE}; "
        f"to end the rollout: {ABORT}",
        f"failed on a, b (boom); to try them again: {RESUME}; to give up on them: "
        f"{SKIP_TWO}; to end the rollout: {ABORT}",
    ),
    "health_unknown": (
        f"no health evidence from a (boom); check its agent, then to try again: {RESUME}; "
        f"to give up on it: {SKIP_ONE}; to end the rollout: {ABORT}",
        f"no health evidence from a, b (boom); check their agents, then to try again: "
        f"{RESUME}; to give up on them: {SKIP_TWO}; to end the rollout: {ABORT}",
    ),
    "retry_exhausted": (
        f"failed again after the automatic retry on a (boom); to try once more: {RESUME}; "
        f"to give up on it: {SKIP_ONE}; to end the rollout: {ABORT}",
        f"failed again after the automatic retry on a, b (boom); to try once more: "
        f"{RESUME}; to give up on them: {SKIP_TWO}; to end the rollout: {ABORT}",
    ),
    "stopped": (
        f"stopped on failure, a left as it is (boom); to skip it and carry on: {RESUME}; "
        f"to end the rollout: {ABORT}",
        f"stopped on failure, a, b left as they are (boom); to skip them and carry on: "
        f"{RESUME}; to end the rollout: {ABORT}",
    ),
    "rollback_pending": (
        f"restoring a from its first backup after a failure (boom); wait for the restore, "
        f"or to end the rollout: {ABORT}",
        f"restoring a, b from their first backups after a failure (boom); wait for the "
        f"restore, or to end the rollout: {ABORT}",
    ),
    "rolled_back": (
        f"a failed and was restored from its backup (boom); to skip it and carry on: "
        f"{RESUME}; to end the rollout: {ABORT}",
        f"a, b failed and were restored from their backups (boom); to skip them and carry "
        f"on: {RESUME}; to end the rollout: {ABORT}",
    ),
    "rollback_failed": (
        f"restoring a failed (boom); inspect it (reconciler backups NODE), then to skip it "
        f"and carry on: {RESUME}; to end the rollout: {ABORT}",
        f"restoring a, b failed (boom); inspect them (reconciler backups NODE), then to "
        f"skip them and carry on: {RESUME}; to end the rollout: {ABORT}",
    ),
    "rollback_unavailable": (
        f"a failed and has no backup to restore (boom); to try it again: {RESUME}; to give "
        f"up on it: {SKIP_ONE}; to end the rollout: {ABORT}",
        f"a, b failed and have no backup to restore (boom); to try them again: {RESUME}; "
        f"to give up on them: {SKIP_TWO}; to end the rollout: {ABORT}",
    ),
    "dispatch_refused": (
        f"cannot send jobs to a (boom); fix the node file (maintenance, agent address), "
        f"then to try again: {RESUME}; to give up on it: {SKIP_ONE}; to end the rollout: "
        f"{ABORT}",
        f"cannot send jobs to a, b (boom); fix the node files (maintenance, agent "
        f"address), then to try again: {RESUME}; to give up on them: {SKIP_TWO}; to end "
        f"the rollout: {ABORT}",
    ),
    "failure_budget_exceeded": (
        f"more nodes failed than failureBudget allows: a ended failed, timed out or unknown "
        f"(boom); to carry on (observe recorded it, and the next failure holds again): "
        f"{RESUME}; to end the rollout: {ABORT}",
        f"more nodes failed than failureBudget allows: a, b ended failed, timed out or "
        f"unknown (boom); to carry on (observe recorded them, and the next failure holds "
        f"again): {RESUME}; to end the rollout: {ABORT}",
    ),
    "stage_failed": (
        f"staging the artifacts failed on a (boom); nothing on it changed; fix the cause "
        f"(the artifact server, its digest, the nodes' free space), then to stage it again: "
        f"{RESUME}; to give up on it: {SKIP_ONE}; to end the rollout: {ABORT}",
        f"staging the artifacts failed on a, b (boom); nothing on them changed; fix the "
        f"cause (the artifact server, its digest, the nodes' free space), then to stage "
        f"them again: {RESUME}; to give up on them: {SKIP_TWO}; to end the rollout: {ABORT}",
    ),
    "eval_baseline_failed": (
        f"the eval baseline answers could not be recorded on a (boom); no node was applied "
        f"to; check its agent and runtimes, then to ask it again: {RESUME}; to end the "
        f"rollout: {ABORT}",
        f"the eval baseline answers could not be recorded on a, b (boom); no node was "
        f"applied to; check their agents and runtimes, then to ask them again: {RESUME}; "
        f"to end the rollout: {ABORT}",
    ),
}
NO_NODES = {
    "operator_paused": f"paused by the operator (spec.paused is true); to carry on: {RESUME}",
    "pause_after_batch": (
        f"batch 2 finished and pauseAfter holds here; to start batch 3: {RESUME}; "
        f"to end the rollout: {ABORT}"
    ),
}


def test_every_reason_is_read_here() -> None:
    assert set(EXPECTED) | set(NO_NODES) == set(HOLD_MESSAGES)


@pytest.mark.parametrize("reason", sorted(EXPECTED))
def test_one_node_and_several(reason: str) -> None:
    one, several = EXPECTED[reason]
    assert hold_message(reason, rollout="web", nodes=["a"], error="boom") == one
    assert hold_message(reason, rollout="web", nodes=["a", "b"], error="boom") == several


@pytest.mark.parametrize("reason", sorted(NO_NODES))
def test_holds_without_nodes(reason: str) -> None:
    assert hold_message(reason, rollout="web", batch=2) == NO_NODES[reason]


def test_many_nodes_read_as_several() -> None:
    names = [f"n{i}" for i in range(30)]
    message = hold_message("rolled_back", rollout="web", nodes=names)
    assert message.startswith("n0, n1, ")
    assert " and 10 more failed and were restored from their backups;" in message


def test_every_agreeing_word_is_used_and_every_placeholder_known() -> None:
    used = {f for text in HOLD_MESSAGES.values() for f in re.findall(r"{(\w+)}", text)}
    assert set(AGREEING) <= used
    filled = {"nodes", "detail", "batch", "next", "failure", "restore", *COMMANDS}
    assert used - set(AGREEING) <= filled


def test_a_long_error_is_clipped_never_the_instruction() -> None:
    error = "job failed: " + "disk full " * 60
    message = hold_message("health_failed", rollout="web", nodes=["gpu-b4"], error=error)
    assert message.startswith("the apply failed on gpu-b4 (disk full disk full")
    quoted = message[message.index("(") + 1 : message.index(")")]
    assert len(quoted) == DETAIL_LIMIT
    assert quoted.endswith("…")
    assert message.endswith(
        f"; to try it again: {RESUME}; to give up on it: reconciler skip web gpu-b4 --push; "
        f"to end the rollout: {ABORT}"
    )
    assert message.count("gpu-b4") == 2  # named once, and once in the skip command


# What the agent or the evidence said -> what a health_failed hold says happened.
FAILURE_WORDS = [
    ("job failed: no space left on device", "the apply failed on a (no space left on device)"),
    ("job failed", "the apply failed on a;"),
    ("refused by the agent: live_not_allowed", "the agent refused the job on a (live_not_allowed)"),
    ("deadline passed: job still running", "the deadline passed on a (job still running)"),
    ("drift: heartbeat shows ollama/old", "the config drifted on a (heartbeat shows ollama/old)"),
    (
        "health check ready failed: failed 3 times in a row: 503",
        "health check failed on a (ready failed: failed 3 times in a row: 503)",
    ),
]


@pytest.mark.parametrize(("error", "opening"), FAILURE_WORDS)
def test_a_health_failed_hold_says_what_failed(error: str, opening: str) -> None:
    message = hold_message("health_failed", rollout="web", nodes=["a"], error=error)
    assert message.startswith(opening)
    assert message.endswith(
        f"to try it again: {RESUME}; to give up on it: {SKIP_ONE}; to end the rollout: {ABORT}"
    )


def test_nodes_that_failed_differently_are_not_given_one_cause() -> None:
    errors = ["job failed: disk full", "health check ready failed: 503"]
    message = hold_message(
        "health_failed", rollout="web", nodes=["a", "b"], error=errors[0], errors=errors
    )
    assert message.startswith("failed on a, b (job failed: disk full); ")


def test_a_live_rollout_is_offered_a_restore_where_the_node_was_changed() -> None:
    restore = "; to restore it from its first backup: reconciler rollback web --nodes a --push"
    checked = hold_message(
        "health_failed", rollout="web", nodes=["a"], error="health check r failed: x", live=True
    )
    assert (
        checked == f"health check failed on a (r failed: x); to try it again: {RESUME}; to give "
        f"up on it: {SKIP_ONE}{restore}; to end the rollout: {ABORT}"
    )
    stopped = hold_message("stopped", rollout="web", nodes=["a"], error="boom", live=True)
    assert stopped == (
        f"stopped on failure, a left as it is (boom){restore}; to skip it and carry on: "
        f"{RESUME}; to end the rollout: {ABORT}"
    )
    # The agent put the previous config back (or never wrote one): nothing to restore.
    unchanged = hold_message(
        "health_failed", rollout="web", nodes=["a"], error="job failed: x", live=True
    )
    assert "rollback" not in unchanged
    assert "rollback" not in hold_message("stopped", rollout="web", nodes=["a"], error="boom")


def test_past_the_nodes_shown_the_commands_name_no_nodes() -> None:
    names = [f"n{i}" for i in range(30)]
    message = hold_message("health_unknown", rollout="web", nodes=names)
    assert "to give up on them: reconciler skip web NODE... --push;" in message
    live = hold_message("stopped", rollout="web", nodes=names, live=True)
    assert "reconciler rollback web --nodes NODE,... --push" in live


def test_a_timed_pause_says_when_it_lifts_and_what_starts_it_now() -> None:
    until = datetime(2026, 12, 1, 10, 30, tzinfo=UTC)
    message = hold_message("pause_after_batch", rollout="web", batch=1, until=until)
    assert message == (
        "batch 1 finished and pauseAfter holds here until 2026-12-01T10:30:00Z, then batch 2 "
        f"starts by itself; to start it now: {RESUME}; to end the rollout: {ABORT}"
    )
    assert "{resume}" in TIMED_PAUSE_MESSAGE


def test_every_command_a_hold_gives_is_a_real_verb_with_real_flags() -> None:
    parser = build_parser()
    messages = [
        hold_message(reason, rollout="web", nodes=["a", "b"], error="boom", live=True)
        for reason in HOLD_MESSAGES
    ]
    given = {
        command
        for message in messages
        for command in re.findall(
            r"reconciler (?:resume|skip|abort|rollback) [^;]*?--push", message
        )
    }
    assert {c.split()[1] for c in given} == {"resume", "skip", "abort", "rollback"}
    for command in given:
        args = parser.parse_args(command.split()[1:])
        assert args.push and args.name == "web"
