"""Scenarios: operator intents (docs/rollouts.md): paused, resumeRequest,
pauseAfter, abort, frozen fields, healthTimeout, removing the file."""

from __future__ import annotations

from reconciler.engine.holds import ASK_AGAIN, HOLD_MESSAGES, RESUME_OF_HELD, SKIP
from reconciler.spec.model import Target
from reconciler.spec.rollout_status import HOLD_REASONS, NODE_STATES
from tests.engine_world import TARGET, World


def started(nodes: list[str], **spec: object) -> World:
    w = World(nodes)
    spec.setdefault("batch_size", 1)
    w.rollout(**spec)
    w.step(0)
    return w


def test_paused_mid_batch_holds_but_still_records_verdicts_then_carries_on() -> None:
    w = started(["a", "b", "c"], batch_size=2)

    w.edit(paused=True)
    w.step(5)
    assert w.phase() == "paused" and w.hold() == "operator_paused"
    assert w.status().operator_paused

    w.succeed("a")
    w.succeed("b")
    w.step(10)
    assert w.states() == {"a": "succeeded", "b": "succeeded", "c": "pending"}
    assert w.last.effects == () and w.hold() == "operator_paused"

    w.edit(paused=False)
    w.step(15)
    assert w.phase() == "running" and not w.status().operator_paused
    assert w.sent_now() == ["c"]


def test_failure_while_paused_is_recorded_and_the_policy_acts_once_unpaused() -> None:
    w = started(["a", "b"], on_failure="retry_once")
    w.edit(paused=True)
    w.step(1)

    w.fail("a")
    w.step(5)
    assert w.state("a") == "failed" and w.last.effects == ()
    assert w.hold() == "operator_paused"

    w.edit(paused=False)
    w.step(10)
    assert w.job("a").attempt == 2 and w.sent_now() == ["a"]


def test_resume_made_while_paused_waits_and_applies_once_the_pause_is_lifted() -> None:
    w = started(["a", "b"])
    w.fail("a")
    w.step(5)
    w.edit(paused=True)
    w.step(6)

    w.resume(token="go")
    w.step(10)
    assert w.status().last_handled_resume != "go"
    assert w.last.effects == () and w.hold() == "health_failed"
    assert w.status().operator_paused

    w.edit(paused=False)
    w.step(15)
    assert w.status().last_handled_resume == "go"
    assert w.job("a").attempt == 2 and w.phase() == "running"


def test_resume_with_nothing_held_is_recorded_and_does_nothing() -> None:
    w = started(["a", "b"])

    w.resume(token="idle")
    step = w.step(5)

    assert w.status().last_handled_resume == "idle"
    assert step.effects == () and w.phase() == "running"
    assert w.states() == {"a": "dispatched", "b": "pending"}


def test_pause_after_batch_one_holds_until_a_resume_starts_batch_two() -> None:
    w = started(["a", "b", "c"], pause_after=[1])
    w.succeed("a")

    w.step(5)
    assert w.hold() == "pause_after_batch" and w.last.effects == ()
    assert "batch 2" in w.status().hold.message  # type: ignore[union-attr]

    w.resume()
    w.step(10)
    assert w.phase() == "running" and w.sent_now() == ["b"]

    w.succeed("b")
    w.step(15)
    assert w.sent_now() == ["c"]


def test_pause_after_batch_and_a_health_hold_take_one_resume_each_health_first() -> None:
    w = started(["a", "b"], pause_after=[1])
    w.fail("a")
    w.step(5)
    assert w.hold() == "health_failed"

    w.resume()
    w.step(10)
    assert w.job("a").attempt == 2 and w.phase() == "running"
    w.succeed("a")
    w.step(15)
    assert w.hold() == "pause_after_batch" and w.last.effects == ()

    w.resume()
    w.step(20)
    assert w.sent_now() == ["b"]


def test_a_frozen_field_changed_after_start_is_a_condition_and_changes_nothing_else() -> None:
    w = started(["a", "b"])
    before = w.status()

    w.edit(target=Target("hermes", "ollama", "other-model"), batch_size=2)
    w.step(5)

    condition = w.status().condition("frozen_fields_changed")
    assert condition is not None
    assert "target" in condition.message and "batchSize" in condition.message
    assert w.status().frozen == before.frozen and w.status().nodes == before.nodes
    assert w.last.effects == ()
    w.succeed("a")
    w.step(10)
    assert w.job("b").target == TARGET

    w.edit(target=TARGET, batch_size=1)
    w.step(15)
    assert w.status().condition("frozen_fields_changed") is None


def test_health_timeout_changed_after_start_applies_to_new_deadlines() -> None:
    w = started(["a", "b"], health_timeout=300)
    assert w.node("a").deadline == w.at(300)

    w.edit(health_timeout=60)
    w.step(5)
    assert w.node("a").deadline == w.at(300)  # already dispatched: unchanged
    assert w.status().condition("frozen_fields_changed") is None

    w.succeed("a")
    w.step(10)
    assert w.node("b").deadline == w.at(70)


def test_removing_the_rollout_file_aborts_with_spec_removed() -> None:
    w = started(["a", "b"])

    w.remove()
    w.step(5)

    assert w.phase() == "aborted" and w.status().reason == "spec_removed"
    assert w.last.effects == ()


def test_abort_then_abort_false_stays_aborted() -> None:
    w = started(["a", "b"])
    w.edit(abort=True)
    w.step(5)

    w.edit(abort=False)
    w.step(10)
    w.resume()
    w.step(15)

    assert w.phase() == "aborted" and w.last.effects == ()
    assert len(w.sent) == 1


def test_abort_wins_over_pause_and_resume_in_the_same_commit() -> None:
    w = started(["a", "b"])
    w.fail("a")
    w.step(5)

    w.edit(abort=True, paused=True, resume_request="now")
    w.step(10)

    assert w.phase() == "aborted" and w.hold() is None and w.last.effects == ()


def test_invalid_file_after_start_decides_nothing_new_and_says_why() -> None:
    w = started(["a", "b"])

    w.break_file(problem="rollouts/r.yaml:3:1: spec.batchSize: must be at least 1")
    w.succeed("a")
    w.step(5)

    assert w.state("a") == "succeeded" and w.last.effects == ()
    condition = w.status().condition("invalid_spec")
    assert condition is not None and "batchSize" in condition.message


def test_skip_nodes_of_a_later_batch_are_never_dispatched() -> None:
    w = started(["a", "b", "c"])

    w.edit(skip_nodes=["b"])
    w.succeed("a")
    w.step(5)

    assert w.state("b") == "skipped" and w.sent_now() == ["c"]
    w.succeed("c")
    w.step(10)
    assert w.phase() == "failed"
    assert not w.jobs_to("b")


def test_skip_nodes_waits_for_a_job_in_flight() -> None:
    w = started(["a", "b"])

    w.edit(skip_nodes=["a"])
    w.step(5)
    assert w.state("a") == "dispatched"

    w.fail("a")
    w.step(10)
    assert w.state("a") == "skipped" and w.sent_now() == ["b"]


def test_the_resume_table_names_every_node_state_and_the_design_question_nodes() -> None:
    assert set(RESUME_OF_HELD) == set(NODE_STATES)
    asked = {s for s, a in RESUME_OF_HELD.items() if a == ASK_AGAIN}
    skipped = {s for s, a in RESUME_OF_HELD.items() if a == SKIP}
    assert asked == {"failed", "timed_out", "unknown", "pending"}
    assert skipped == {"stopped", "rolled_back", "rollback_failed"}


def test_every_hold_reason_of_the_status_format_has_its_message_and_no_other() -> None:
    assert list(HOLD_MESSAGES) == list(HOLD_REASONS)
