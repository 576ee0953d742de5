"""What the daemon asks of recorded statuses between passes: jobs in flight
(rebuilt from status alone), heartbeats and backup lists to read, when to
wake up, whether a rollout is active; and derived job ids."""

from __future__ import annotations

import json

from reconciler.engine.step import (
    in_flight,
    is_active,
    next_wakeup,
    wanted_backups,
    wanted_heartbeats,
)
from reconciler.protocol.job_ids import job_id
from reconciler.spec.rollout_status import from_record, to_record
from tests.engine_world import World


def test_jobs_in_flight_are_rebuilt_from_status_alone_with_the_same_payload() -> None:
    w = World(["a", "b", "c"])
    w.rollout(batch_size=2, live=True)
    sent = w.step(0).effects

    reloaded = from_record(json.loads(json.dumps(to_record(w.status()))))

    assert in_flight([reloaded]) == sent
    w.succeed("a")
    w.heartbeat("a", at=w.at(1))
    w.step(5)
    assert [j.node for j in in_flight([w.status()])] == ["b"]


def test_restores_in_flight_are_listed_with_their_backup() -> None:
    w = World(["a", "b"])
    w.rollout(batch_size=1, live=True, on_failure="rollback")
    w.step(0)
    w.fail("a", backup_id="bk-a")
    restore = w.step(5).effects[0]

    assert in_flight([w.status()]) == (restore,)
    assert restore.backup_id == "bk-a" and restore.kind == "restore"


def test_job_ids_are_derived_from_their_decision() -> None:
    a = job_id("r", "c0ffee", "n1", 1, "apply")

    assert a == job_id("r", "c0ffee", "n1", 1, "apply")
    assert a.startswith("apply-") and len(a) == len("apply-") + 32
    assert a != job_id("r", "c0ffee", "n1", 2, "apply")
    assert a != job_id("r", "c0ffe", "en1", 1, "apply")
    assert job_id("r", "c", "n", 1, "restore", "policy") != job_id(
        "r", "c", "n", 1, "restore", "rb1"
    )


def test_the_same_decision_after_a_restart_gets_the_same_job_id() -> None:
    first, second = World(["a"]), World(["a"])
    first.rollout()
    second.rollout()

    assert first.step(0).effects == second.step(0).effects


def test_heartbeats_are_wanted_for_dispatched_nodes_of_live_rollouts_only() -> None:
    w = World(["a", "b", "c"])
    w.rollout("live", node_ids=["a", "b"], batch_size=1, live=True)
    w.rollout("dry", node_ids=["c"])
    w.step(0)

    assert wanted_heartbeats(w.statuses.values()) == ("a",)


def test_backups_are_wanted_only_when_a_restore_waits_for_them() -> None:
    w = World(["a", "b"])
    w.rollout(batch_size=1, live=True, on_failure="rollback", health_timeout=60)
    w.step(0)
    assert wanted_backups([w.status()]) == ()

    w.answer(w.job("a"), "running")
    w.step(60)

    assert wanted_backups([w.status()]) == ("a",)


def test_next_wakeup_is_the_earliest_deadline_or_start_time() -> None:
    w = World(["a", "b", "c"])
    w.rollout("soon", node_ids=["a"], health_timeout=120)
    w.rollout("later", node_ids=["b"], start_at="2026-12-01T09:01:00Z")
    w.step(10)

    assert next_wakeup(w.statuses.values()) == w.at(60)
    w.step(60)
    assert next_wakeup(w.statuses.values()) == w.at(130)


def test_active_means_scheduled_running_paused_or_still_finishing() -> None:
    w = World(["a", "b"])
    w.rollout(batch_size=1, live=True, on_failure="rollback")
    w.step(0)
    assert is_active(w.status())

    w.fail("a", backup_id="bk-a")
    w.step(5)
    w.edit(abort=True)
    w.step(10)
    assert w.phase() == "aborted" and is_active(w.status())  # the restore is still out

    w.answer(w.job("a"), "succeeded")
    w.step(15)
    assert not is_active(w.status())


def test_pending_rollout_is_not_active() -> None:
    w = World(["a"])
    w.rollout(selector={"role": "nobody"})
    w.step(0)

    assert not is_active(w.status())
