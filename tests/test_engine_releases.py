"""Releases of slots kept warm by standby applies: the table, and the step
that sends and records them (pure, through the real engine)."""

from __future__ import annotations

import pytest

from reconciler.engine import releases
from reconciler.engine.releases import RELEASE_RULES, decide, render_release_table
from reconciler.engine.step import in_flight, is_active
from reconciler.protocol.effects import SendJob
from reconciler.protocol.job_ids import job_id
from reconciler.spec.rollout_status import to_record
from reconciler.spec.times import format_time
from tests.engine_world import World

TIMINGS = {
    "drainStartedAt": None,
    "drainedAt": None,
    "activatedAt": "2026-12-01T09:00:01Z",
    "warmedAt": "2026-12-01T09:00:02Z",
    "servingAt": "2026-12-01T09:00:03Z",
    "routedAt": "2026-12-01T09:00:03Z",
}


def _world(keep: str | None, policy: str = "pause", nodes: int = 3) -> World:
    world = World(nodes)
    world.rollout(live=True, batch_size=1, on_failure=policy, standby=keep)
    world.step(at=0)
    return world


def _switch(world: World, node: str, slot: str | None = "a") -> SendJob:
    """The node's apply succeeds on slots, keeping ``slot`` warm, and its heartbeat shows it."""
    job = world.job(node)
    assert job.kind == "apply"
    world.answer(
        job,
        "succeeded",
        finished_at=format_time(world.now),
        source_commit=job.source_commit,
        backup_id=f"bk-{node}",
        timings=TIMINGS,
        standby={"slot": slot, "serving": "b"},
    )
    world.heartbeats.pop(node, None)
    return job


def _pass(world: World, node: str, at: float) -> None:
    """Answer the node's apply with a kept slot, then a heartbeat a second later."""
    _switch(world, node)
    world.step(at=at)
    world.heartbeat(node, at=world.at(at + 1))
    world.step(at=at + 1)


def _releases(world: World) -> list[SendJob]:
    return [j for j in world.sent if j.kind == "release"]


def test_the_table_has_one_rule_per_keep_previous_and_moment() -> None:
    assert decide("untilSoaked", "passed") is True
    assert decide("untilCompleted", "passed") is False
    assert decide("untilSoaked", "ended") and decide("untilCompleted", "ended")
    assert len(RELEASE_RULES) == 4
    assert "| the node's verdict passed | release | keep warm |" in render_release_table()
    with pytest.raises(ValueError):
        decide("forever", "passed")


def test_until_soaked_releases_each_node_when_it_passes() -> None:
    world = _world("untilSoaked")
    assert world.job("n1").standby == "untilSoaked"  # the apply carries it
    _pass(world, "n1", 10)
    n1 = world.node("n1")
    assert n1.verdict == "passed" and n1.out_of_service == 0
    assert n1.timings is not None and n1.timings["routedAt"] == TIMINGS["routedAt"]
    sent = _releases(world)
    assert [(j.node, j.mode, j.attempt) for j in sent] == [("n1", "live", 1)]
    assert sent[0].job_id == job_id("r", world.status().start_commit or "", "n1", 1, "release")
    assert n1.standby is not None and n1.standby.release_job_id == sent[0].job_id
    assert n1.standby.slot == "a" and n1.standby.released_at is None
    # The release is in flight (the daemon reads and re-sends it) until answered.
    assert sent[0] in in_flight([world.status()])
    world.succeed("n1")  # the newest job to n1: its release
    world.step(at=20)
    standby = world.node("n1").standby
    assert standby is not None and standby.released_at == world.at(20)
    assert sent[0] not in in_flight([world.status()])
    assert world.job("n2").kind == "apply" and world.phase() == "running"


def test_until_completed_keeps_every_slot_until_the_rollout_ends() -> None:
    world = _world("untilCompleted")
    _pass(world, "n1", 10)
    _pass(world, "n2", 20)
    assert _releases(world) == []
    _pass(world, "n3", 30)
    assert world.phase() == "completed"
    assert sorted(j.node for j in _releases(world)) == ["n1", "n2", "n3"]
    status = world.status()
    assert is_active(status)  # releases in flight keep the daemon observing
    for node in ("n1", "n2", "n3"):
        world.succeed(node)
    world.step(at=40)
    assert world.phase() == "completed"
    assert all(n.standby is not None and n.standby.released_at for n in world.status().nodes)
    assert not is_active(world.status())
    # Recorded after the end: node records changed, the phase and its history did not.
    assert world.status().transitions == status.transitions
    assert world.status().finished_at == status.finished_at


def test_abort_releases_the_kept_slots_and_only_those() -> None:
    world = _world("untilCompleted", nodes=3)
    _pass(world, "n1", 10)
    _switch(world, "n2", slot=None)  # the first standby apply: nothing was kept warm
    world.step(at=20)
    world.heartbeat("n2", at=world.at(21))
    world.step(at=21)
    assert world.node("n2").standby is None
    world.edit(abort=True)
    world.step(at=30)
    assert world.phase() == "aborted"
    assert [j.node for j in _releases(world)] == ["n1"]


def test_no_release_while_a_restore_may_route_back_to_the_slot() -> None:
    world = _world("untilCompleted", policy="rollback", nodes=2)
    _pass(world, "n1", 10)
    job = _switch(world, "n2")
    world.step(at=20)
    world.heartbeat("n2", model="broken", at=world.at(21))  # drift: n2 fails
    world.step(at=20 + 301)
    assert world.state("n2") == "rollback_pending"  # the policy restore is sent
    world.edit(abort=True)
    world.step(at=330)
    assert world.phase() == "aborted"
    assert [j.node for j in _releases(world)] == ["n1"]  # not n2: its restore runs
    restore = world.job("n2")
    assert restore.kind == "restore" and job.job_id != restore.job_id
    world.answer(
        restore,
        "succeeded",
        finished_at=format_time(world.now),
        timings={"routedAt": "2026-12-01T09:05:31Z"},
        standby={"slot": None, "serving": "a", "warm": True},
    )
    world.step(at=340)
    n2 = world.node("n2")
    assert n2.state == "rolled_back"
    assert n2.restore is not None and n2.restore.timings == {"routedAt": "2026-12-01T09:05:31Z"}
    assert [j.node for j in _releases(world)] == ["n1", "n2"]  # now: idempotent on the node
    assert world.phase() == "aborted"


def test_a_failed_or_unanswered_release_is_recorded_and_holds_nothing() -> None:
    world = _world("untilSoaked", nodes=2)
    _pass(world, "n1", 10)
    world.fail("n1", error="stop_failed: exit 3")  # n1's release
    world.step(at=15)
    standby = world.node("n1").standby
    assert standby is not None and standby.release_error.startswith("release failed: stop_failed")
    assert world.hold() is None and world.phase() == "running"
    _pass(world, "n2", 20)
    assert world.phase() == "completed"
    world.go_offline("n2")
    release = world.job("n2")
    world.answer(release, "unreachable", error="connection refused")
    world.step(at=30)
    assert world.node("n2").standby.release_error == ""  # type: ignore[union-attr]
    assert is_active(world.status())
    world.step(at=21 + 300)  # healthTimeout after it was sent
    error = world.node("n2").standby.release_error  # type: ignore[union-attr]
    assert error.startswith("release unanswered by its deadline (connection refused)")
    assert world.phase() == "completed" and not is_active(world.status())
    assert in_flight([world.status()]) == ()


def test_a_rollout_without_standby_records_nothing_of_slots() -> None:
    world = World(2)
    world.rollout(live=True, batch_size=1)
    world.step(at=0)
    assert world.job("n1").standby is None
    _switch(world, "n1")  # an answer naming a slot changes nothing here
    world.step(at=10)
    world.heartbeat("n1", at=world.at(11))
    world.step(at=11)
    assert world.node("n1").standby is None and _releases(world) == []
    assert "standby" not in str(to_record(world.status()))


def test_release_job_is_rebuilt_from_status_alone() -> None:
    world = _world("untilSoaked")
    _pass(world, "n1", 10)
    status = world.status()
    [sent] = _releases(world)
    frozen = status.frozen
    assert frozen is not None
    assert releases.release_job("r", frozen, world.node("n1")) == sent


def test_no_release_while_the_operator_pauses_a_running_rollout() -> None:
    # The operator may be pausing to roll back to the kept slot.
    world = _world("untilSoaked")
    world.edit(paused=True)
    _pass(world, "n1", 10)
    assert world.node("n1").verdict == "passed" and _releases(world) == []
    world.edit(paused=False)
    world.step(at=20)
    assert [j.node for j in _releases(world)] == ["n1"]
