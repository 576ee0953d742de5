"""Scenarios: verdicts (docs/rollouts.md): failed, unknown, timed out,
live heartbeats, and late reports from an earlier attempt."""

from __future__ import annotations

from datetime import timedelta

from reconciler.spec.model import Settings
from tests.engine_world import OLD_MODEL, World


def two_batches(**spec: object) -> World:
    w = World(["a", "b"])
    w.rollout(batch_size=1, **spec)
    w.step(0)
    return w


def test_failed_job_holds_health_failed_naming_the_node_and_sends_nothing_more() -> None:
    w = two_batches()

    w.fail("a", error="apply_failed: disk full")
    w.step(5)

    assert w.phase() == "paused"
    assert w.hold() == "health_failed"
    assert w.status().hold.nodes == ("a",)  # type: ignore[union-attr]
    assert "a" in w.status().hold.message and "disk full" in w.status().hold.message  # type: ignore[union-attr]
    assert w.node("a").verdict == "failed" and w.state("a") == "failed"
    assert w.last.effects == () and w.state("b") == "pending"


def test_refused_job_is_a_failed_verdict() -> None:
    w = two_batches()

    w.answer(w.job("a"), "refused", error="expired: job past expiresAt")
    w.step(5)

    assert w.hold() == "health_failed"
    assert "refused" in w.node("a").error


def test_agent_unreachable_past_offline_after_holds_health_unknown() -> None:
    w = World(["a", "b"], settings=Settings(offline_after=120))
    w.rollout(batch_size=1, health_timeout=600)
    w.step(0)

    w.go_offline("a")
    w.step(119)
    assert w.phase() == "running" and w.state("a") == "dispatched"

    w.step(121)
    assert w.hold() == "health_unknown"
    assert w.state("a") == "unknown" and w.node("a").verdict == "unknown"
    assert w.status().hold.nodes == ("a",)  # type: ignore[union-attr]
    assert w.last.effects == ()


def test_deadline_passing_while_reachable_is_a_timed_out_failure() -> None:
    w = two_batches(health_timeout=60)

    w.answer(w.job("a"), "running")
    w.step(59)
    assert w.state("a") == "dispatched"
    w.step(60)

    assert w.hold() == "health_failed"
    assert w.state("a") == "timed_out" and w.node("a").verdict == "failed"
    assert "deadline" in w.node("a").error
    assert w.last.effects == () and w.state("b") == "pending"


def test_unreachable_when_the_deadline_passes_is_unknown() -> None:
    w = World(["a"], settings=Settings(offline_after=600))
    w.rollout(health_timeout=60)
    w.step(0)

    w.go_offline("a")
    w.step(60)

    assert w.state("a") == "unknown" and w.hold() == "health_unknown"


def test_evidence_in_the_deciding_pass_beats_the_deadline() -> None:
    w = two_batches(health_timeout=60)

    w.succeed("a")
    w.step(3600)

    assert w.state("a") == "succeeded"
    assert w.sent_now() == ["b"]


def test_node_removed_from_nodes_is_unknown() -> None:
    w = two_batches()

    w.remove_node("a")
    w.step(5)

    assert w.state("a") == "unknown" and w.hold() == "health_unknown"


def test_live_succeeded_job_waits_for_a_heartbeat_showing_the_target() -> None:
    w = two_batches(live=True)
    w.succeed("a")
    w.heartbeat("a", model=OLD_MODEL, at=w.at(10))

    w.step(11)
    assert w.state("a") == "dispatched" and w.last.effects == ()

    w.heartbeat("a", at=w.at(20))
    w.step(21)
    assert w.state("a") == "succeeded" and w.node("a").verdict == "passed"
    assert w.sent_now() == ["b"]


def test_live_heartbeat_from_before_the_job_finished_never_counts() -> None:
    w = two_batches(live=True, health_timeout=60)
    w.now = w.at(10)
    w.succeed("a")
    w.heartbeat("a", at=w.at(9))  # shows the target, but from before the job finished

    w.step(30)
    assert w.state("a") == "dispatched"

    w.step(60)
    assert w.state("a") == "timed_out"
    assert "no heartbeat after the job finished" in w.node("a").error


def test_live_drift_at_the_deadline_is_a_failure() -> None:
    w = two_batches(live=True, health_timeout=60)
    w.succeed("a")
    w.heartbeat("a", model=OLD_MODEL, at=w.now + timedelta(seconds=1))

    w.step(60)

    assert w.state("a") == "failed"
    assert w.node("a").error.startswith("drift")


def test_late_failure_for_attempt_one_after_attempt_two_passed_changes_nothing() -> None:
    w = two_batches(on_failure="retry_once")
    first = w.fail("a")
    w.step(5)
    assert w.job("a").attempt == 2
    w.succeed("a")
    w.step(10)
    before = w.status()

    w.answer(first, "failed", error="late report")
    step = w.step(15)

    assert w.status() == before and "r" not in step.statuses
    assert w.node("a").verdict == "passed" and w.node("a").attempt == 2


def test_verdicts_of_a_whole_batch_join_one_hold() -> None:
    w = World(["a", "b", "c"])
    w.rollout(batch_size=2, health_timeout=60)
    w.step(0)

    w.fail("a")
    w.step(5)
    assert w.status().hold.nodes == ("a",)  # type: ignore[union-attr]
    since = w.status().hold.since  # type: ignore[union-attr]

    w.answer(w.job("b"), "running")
    w.step(60)
    hold = w.status().hold
    assert hold is not None and hold.reason == "health_failed"
    assert hold.nodes == ("a", "b") and hold.node_count == 2 and hold.since == since
    assert w.state("c") == "pending"
