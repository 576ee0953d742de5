"""Scenarios: a status file's ``progress`` counts are a summary for
people; the node records are the truth. A status whose counts were edited
by hand gets the same decisions as the true one."""

from __future__ import annotations

from reconciler.engine.step import (
    in_flight,
    is_active,
    next_wakeup,
    waits_for_a_person,
    wanted_backups,
    wanted_heartbeats,
)
from reconciler.spec.rollout_status import RolloutStatus, from_record, to_record
from tests.engine_world import World


def completed_with_two_restoring() -> World:
    """A live rollout of a and b that completed; a rollback of all sent
    both restores, which are in flight."""
    w = World(["a", "b"])
    w.rollout(batch_size=2, live=True)
    w.step(0)
    for node in ("a", "b"):
        w.succeed(node, backup_id=f"bk-{node}")
        w.heartbeat(node, at=w.at(2))
    w.step(5)
    assert w.phase() == "completed"
    w.rollback(id="undo")
    w.step(10)
    assert w.states() == {"a": "restoring", "b": "restoring"}
    return w


def with_progress(status: RolloutStatus, progress: dict[str, int]) -> RolloutStatus:
    """``status`` as read back from a file whose ``progress`` was edited."""
    record = to_record(status)
    record["progress"] = progress
    edited = from_record(record)
    assert edited.progress != status.progress and edited.nodes == status.nodes
    return edited


def test_edited_progress_hides_no_restore_from_what_is_in_flight() -> None:
    w = completed_with_two_restoring()
    true = w.status()
    edited = with_progress(true, {"succeeded": 2})

    assert [j.job_id for j in in_flight([edited])] == [j.job_id for j in in_flight([true])]
    assert len(in_flight([edited])) == 2
    assert next_wakeup([edited]) == next_wakeup([true]) is not None
    assert is_active(edited) and is_active(true)
    assert waits_for_a_person(edited) == waits_for_a_person(true)
    assert wanted_backups([edited]) == wanted_backups([true])
    assert wanted_heartbeats([edited]) == wanted_heartbeats([true])


def test_edited_progress_changes_no_decision_of_the_next_step() -> None:
    truth = completed_with_two_restoring()
    edited = completed_with_two_restoring()
    edited.statuses["r"] = with_progress(edited.status(), {"succeeded": 2, "rolled_back": 5})
    for w in (truth, edited):
        w.answer(w.job("a"), "succeeded")
        w.answer(w.job("b"), "failed", error="restore_failed: checksum")

    truth.step(15)
    edited.step(15)

    assert edited.states() == truth.states() == {"a": "rolled_back", "b": "rollback_failed"}
    assert edited.status().rollbacks == truth.status().rollbacks
    assert edited.status().progress == truth.status().progress
    assert [t.to_state for t in edited.last.transitions] == [
        t.to_state for t in truth.last.transitions
    ]


def test_edited_progress_still_claims_the_restoring_nodes_for_an_overlapping_start() -> None:
    for progress in (None, {"succeeded": 2}):
        w = completed_with_two_restoring()
        if progress is not None:
            w.statuses["r"] = with_progress(w.status(), progress)
        w.rollout("next", node_ids=("a", "b"))

        w.step(12)

        assert w.phase("next") == "pending" and w.status("next").reason == "overlap"
