"""Scenarios: the five failure policies (docs/rollouts.md) and resume."""

from __future__ import annotations

import pytest

from reconciler.spec.model import Settings
from tests.engine_world import World


def started(nodes: list[str], **spec: object) -> World:
    w = World(nodes, settings=Settings(offline_after=60))
    spec.setdefault("batch_size", 1)
    w.rollout(**spec)
    w.step(0)
    return w


def test_resume_after_a_failure_sends_a_new_attempt_with_a_new_job_id() -> None:
    w = started(["a", "b"])
    first = w.fail("a")
    w.step(5)

    w.resume()
    w.step(10)

    second = w.job("a")
    assert w.phase() == "running" and w.state("a") == "dispatched"
    assert second.attempt == 2 and second.job_id != first.job_id
    assert w.node("a").verdict is None and w.node("a").attempt == 2


def test_abort_after_a_resume_sends_nothing_more() -> None:
    w = started(["a", "b"])
    w.fail("a")
    w.step(5)
    w.resume()
    w.step(10)

    w.edit(abort=True)
    w.step(15)
    w.succeed("a")
    w.step(20)

    assert w.phase() == "aborted"
    assert w.last.effects == () and len(w.sent) == 2
    assert w.state("a") == "succeeded"  # an in-flight job is still observed
    assert w.state("b") == "pending"


def test_retry_once_retries_once_by_itself_then_holds_and_never_again_after_resume() -> None:
    w = started(["a", "b"], on_failure="retry_once")

    w.fail("a")
    w.step(5)
    assert w.job("a").attempt == 2 and w.sent_now() == ["a"]
    assert w.node("a").auto_retried and w.phase() == "running"

    w.fail("a")
    w.step(10)
    assert w.hold() == "retry_exhausted" and w.last.effects == ()

    w.resume()
    w.step(15)
    assert w.job("a").attempt == 3 and w.phase() == "running"

    w.fail("a")
    w.step(20)
    assert w.hold() == "retry_exhausted" and w.last.effects == ()
    assert len(w.jobs_to("a")) == 3 and w.state("b") == "pending"


def test_stop_leaves_the_node_stopped_and_resume_skips_it() -> None:
    w = started(["a", "b", "c"], on_failure="stop")
    w.succeed("a")
    w.step(5)

    w.fail("b")
    w.step(10)
    assert w.state("b") == "stopped" and w.hold() == "stopped"
    assert w.last.effects == () and w.state("c") == "pending"

    w.resume()
    w.step(15)
    assert w.state("b") == "skipped"
    assert w.sent_now() == ["c"]

    w.succeed("c")
    w.step(20)
    assert w.phase() == "failed"
    assert w.states() == {"a": "succeeded", "b": "skipped", "c": "succeeded"}


def test_rollback_policy_restores_the_first_backup_then_resume_skips() -> None:
    w = started(["a", "b"], on_failure="rollback", live=True)

    w.fail("a", backup_id="bk-a1")
    w.step(5)
    assert w.state("a") == "rollback_pending" and w.hold() == "rollback_pending"
    restore = w.job("a")
    assert restore.kind == "restore" and restore.backup_id == "bk-a1"
    assert w.sent_now() == ["a"]

    w.answer(restore, "succeeded", finished_at="2026-12-01T09:00:07Z")
    w.step(8)
    assert w.state("a") == "rolled_back" and w.hold() == "rolled_back"
    assert w.last.effects == ()

    w.resume()
    w.step(10)
    assert w.state("a") == "skipped" and w.sent_now() == ["b"]


def test_resumes_while_a_policy_restore_is_pending_are_refused() -> None:
    w = started(["a", "b"], on_failure="rollback", live=True)
    w.fail("a", backup_id="bk-a1")
    w.step(5)
    sent = len(w.sent)

    w.resume(token="first")
    w.step(6)
    assert w.status().last_handled_resume == "first"
    refusal = w.status().condition("resume_refused")
    assert refusal is not None and "a" in refusal.message and "abort" in refusal.message
    w.resume(token="second")
    w.step(7)

    assert w.status().last_handled_resume == "second"
    assert len(w.sent) == sent and w.hold() == "rollback_pending"
    assert w.state("a") == "rollback_pending"


def test_restore_that_fails_is_rollback_failed() -> None:
    w = started(["a", "b"], on_failure="rollback", live=True)
    w.fail("a", backup_id="bk-a1")
    w.step(5)

    w.answer(w.job("a"), "failed", error="restore_failed: backup missing")
    w.step(8)

    assert w.state("a") == "rollback_failed" and w.hold() == "rollback_failed"


def test_restore_without_evidence_by_its_deadline_is_rollback_failed() -> None:
    w = started(["a", "b"], on_failure="rollback", live=True, health_timeout=60)
    w.fail("a", backup_id="bk-a1")
    w.step(5)

    w.step(64)
    assert w.state("a") == "rollback_pending"
    w.step(65)

    assert w.state("a") == "rollback_failed" and w.hold() == "rollback_failed"


def test_rollback_policy_on_a_dry_run_holds_rollback_unavailable() -> None:
    w = started(["a", "b"], on_failure="rollback")

    w.fail("a")
    w.step(5)

    assert w.hold() == "rollback_unavailable" and w.state("a") == "failed"
    assert w.last.effects == ()


def test_rollback_policy_live_node_that_had_no_config_holds_rollback_unavailable() -> None:
    w = started(["a", "b"], on_failure="rollback", live=True)

    w.fail("a", backup_id=None)
    w.step(5)

    assert w.hold() == "rollback_unavailable" and w.last.effects == ()


def test_rollback_policy_after_a_timeout_searches_the_backup_list() -> None:
    w = started(["a", "b"], on_failure="rollback", live=True, health_timeout=60)
    apply = w.job("a")
    w.answer(apply, "running")
    w.step(60)
    assert w.state("a") == "timed_out" and w.hold() == "rollback_pending"
    assert w.last.effects == ()  # the first backup is not known yet

    w.backup("a", "bk-a-first", apply)
    w.step(65)

    assert w.state("a") == "rollback_pending"
    assert w.job("a").kind == "restore" and w.job("a").backup_id == "bk-a-first"


@pytest.mark.parametrize("policy", ["pause", "retry_once", "stop", "rollback"])
def test_unknown_never_retries_stops_or_restores(policy: str) -> None:
    w = started(["a", "b"], on_failure=policy, live=True)
    w.go_offline("a")

    w.step(61)

    assert w.hold() == "health_unknown"
    assert w.state("a") == "unknown"
    assert w.last.effects == () and len(w.sent) == 1
    assert not w.node("a").auto_retried


def test_observe_records_failures_and_goes_on_to_end_failed() -> None:
    w = started(["a", "b", "c"], on_failure="observe")

    w.fail("a")
    w.step(5)
    assert w.phase() == "running" and w.hold() is None
    assert w.sent_now() == ["b"]

    w.go_offline("b")
    w.step(70)
    assert w.state("b") == "unknown" and w.sent_now() == ["c"]

    w.succeed("c")
    w.step(75)
    assert w.phase() == "failed"
    assert w.states() == {"a": "failed", "b": "unknown", "c": "succeeded"}


def test_resume_of_a_node_that_went_into_maintenance_skips_it() -> None:
    w = started(["a", "b"])
    w.fail("a")
    w.step(5)

    w.set_node("a", maintenance=True)
    w.resume()
    w.step(10)

    assert w.state("a") == "skipped" and w.sent_now() == ["b"]


def test_skip_nodes_gives_up_on_a_held_node() -> None:
    w = started(["a", "b"])
    w.fail("a")
    w.step(5)

    w.edit(skip_nodes=["a"])
    w.step(10)

    assert w.state("a") == "skipped" and w.sent_now() == ["b"]
    w.succeed("b")
    w.step(15)
    assert w.phase() == "failed"
