"""Scenarios: explicit rollback (`rollbackRequest`, docs/rollouts.md)."""

from __future__ import annotations

import json
from dataclasses import replace

from reconciler.engine.memo import StepMemo
from reconciler.engine.rollback import backup_outcome, node_outcome, request_refusal
from reconciler.engine.step import step_fleet
from reconciler.spec import schemas
from reconciler.spec.model import Fleet, Settings
from reconciler.spec.rollout_status import NodeRecord, from_record, to_record
from tests.engine_world import World

STATUS_SCHEMA = schemas.validator("rollout-status")


def live_three_with_third_failed() -> World:
    """Live, batches of one, pause policy: a and b passed, c failed and is held."""
    w = World(["a", "b", "c"])
    w.rollout(batch_size=1, live=True)
    w.step(0)
    for k, node in enumerate(["a", "b"]):
        w.succeed(node, backup_id=f"bk-{node}")
        w.heartbeat(node, at=w.at(10 * k + 2))
        w.step(10 * k + 5)
    w.fail("c", backup_id=None)
    w.step(30)
    assert w.hold() == "health_failed"
    return w


def test_rollback_all_restores_changed_nodes_and_reports_the_rest_as_skipped() -> None:
    w = live_three_with_third_failed()

    w.rollback(id="rb1", author="Ana <ana@example.org>")
    step = w.step(40)

    restores = {j.node: j for j in step.effects}
    assert set(restores) == {"a", "b"}
    assert restores["a"].kind == "restore" and restores["a"].backup_id == "bk-a"
    assert restores["b"].backup_id == "bk-b"
    assert w.state("a") == "restoring" and w.state("b") == "restoring"
    record = w.status().rollbacks[0]
    assert record.id == "rb1" and record.requested_by == "Ana <ana@example.org>"
    assert record.time == w.at(40)
    outcomes = {n.name: n.outcome for n in record.nodes}
    assert outcomes == {"a": "restoring", "b": "restoring", "c": "skipped"}
    assert w.phase() == "paused" and w.hold() == "health_failed"

    w.answer(restores["a"], "succeeded")
    w.answer(restores["b"], "failed", error="restore_failed: checksum")
    w.step(45)
    assert w.state("a") == "rolled_back" and w.state("b") == "rollback_failed"
    record = w.status().rollbacks[0]
    assert record.state == "done"
    assert {n.name: n.outcome for n in record.nodes} == {
        "a": "rolled_back",
        "b": "rollback_failed",
        "c": "skipped",
    }


def test_nothing_else_is_dispatched_while_restoring() -> None:
    w = live_three_with_third_failed()
    w.rollback(nodes=["a"])
    w.step(40)

    w.resume()
    w.step(45)

    assert w.last.effects == () and w.status().condition("resume_refused") is not None
    assert w.job("c").attempt == 1


def test_a_node_that_needed_a_retry_restores_the_first_attempts_backup() -> None:
    w = World(["a"])
    w.rollout(live=True, on_failure="retry_once")
    w.step(0)
    w.fail("a", backup_id="bk-first")
    w.step(5)
    w.succeed("a", backup_id="bk-second")
    w.heartbeat("a", at=w.at(7))
    w.step(10)
    assert w.phase() == "completed"

    w.rollback(id="undo", nodes=["a"])
    w.step(20)

    assert w.job("a").kind == "restore" and w.job("a").backup_id == "bk-first"


def test_rollback_of_a_completed_rollout_keeps_the_phase_and_lists_the_rollback() -> None:
    w = World(["a"])
    w.rollout(live=True)
    w.step(0)
    w.succeed("a", backup_id="bk-a")
    w.heartbeat("a", at=w.at(2))
    w.step(5)
    assert w.phase() == "completed"

    w.rollback(id="undo")
    w.step(10)
    assert w.phase() == "completed" and w.state("a") == "restoring"
    assert w.status().rollbacks[0].id == "undo"

    w.answer(w.job("a"), "succeeded")
    w.step(15)
    assert w.phase() == "completed" and w.state("a") == "rolled_back"
    assert w.status().rollbacks[0].state == "done"


def test_rollback_of_a_running_rollout_that_is_not_held_is_refused() -> None:
    w = World(["a", "b"])
    w.rollout(live=True, batch_size=1)
    w.step(0)
    w.succeed("a", backup_id="bk-a")
    w.heartbeat("a", at=w.at(2))
    w.step(5)

    w.rollback(id="rb1")
    step = w.step(10)

    assert step.effects == ()
    assert w.status().rollbacks[0].state == "refused"
    condition = w.status().condition("rollback_refused")
    assert condition is not None and "pause" in condition.message


def test_rollback_of_a_dry_run_rollout_is_refused() -> None:
    w = World(["a"])
    w.rollout()
    w.step(0)
    w.succeed("a")
    w.step(5)

    w.rollback(id="rb1")
    step = w.step(10)

    assert step.effects == () and w.status().rollbacks[0].state == "refused"
    assert "dry-run" in w.status().rollbacks[0].message


def test_rollback_naming_an_unknown_node_refuses_that_node() -> None:
    w = live_three_with_third_failed()

    w.rollback(id="rb1", nodes=["a", "ghost"])
    step = w.step(40)

    assert [j.node for j in step.effects] == ["a"]
    outcomes = {n.name: n.outcome for n in w.status().rollbacks[0].nodes}
    assert outcomes == {"a": "restoring", "ghost": "refused"}
    condition = w.status().condition("rollback_refused")
    assert condition is not None and "ghost" in condition.message


def test_the_same_rollback_id_restores_once() -> None:
    w = live_three_with_third_failed()
    w.rollback(id="rb1", nodes=["a"])
    w.step(40)
    w.answer(w.job("a"), "succeeded")
    w.step(45)

    w.edit(paused=True)  # another edit, same request id still in the file
    w.step(50)
    w.edit(paused=False)
    w.step(55)

    assert len([j for j in w.jobs_to("a") if j.kind == "restore"]) == 1


def test_rollback_of_a_node_a_later_rollout_changed_is_refused() -> None:
    w = World(["a"])
    w.rollout("old", live=True)
    w.step(0)
    w.succeed("a", "old", backup_id="bk-a")
    w.heartbeat("a", at=w.at(2))
    w.step(5)
    w.rollout("new", live=True)
    w.step(10)
    assert w.phase("new") == "running"

    w.rollback("old", id="rb1")
    step = w.step(15)

    assert [j for j in step.effects if j.kind == "restore"] == []
    node = w.status("old").rollbacks[0].nodes[0]
    assert node.outcome == "refused" and "new" in node.message


def test_rollback_of_a_node_with_a_job_in_flight_is_refused_for_that_node() -> None:
    w = World(["a", "b"])
    w.rollout(live=True, batch_size=2)
    w.step(0)
    w.succeed("a", backup_id="bk-a")
    w.heartbeat("a", at=w.at(1))
    w.edit(paused=True)
    w.step(5)
    assert w.state("b") == "dispatched"

    w.rollback(id="rb1")
    step = w.step(10)

    assert [j.node for j in step.effects] == ["a"]
    outcomes = {n.name: n.outcome for n in w.status().rollbacks[0].nodes}
    assert outcomes == {"a": "restoring", "b": "refused"}


def test_rollback_waits_for_the_backup_list_when_the_first_apply_was_never_seen() -> None:
    w = World(["a", "b"], settings=Settings(offline_after=30))
    w.rollout(live=True, batch_size=1)
    w.step(0)
    first = w.job("a")
    w.go_offline("a")
    w.step(31)
    assert w.state("a") == "unknown" and not w.node("a").first_backup_known

    w.rollback(id="rb1", nodes=["a"])
    step = w.step(40)
    assert step.effects == () and w.status().rollbacks[0].state == "waiting"

    from reconciler.engine.step import wanted_backups

    assert wanted_backups([w.status()]) == ("a",)
    w.come_back("a")
    w.backup("a", "bk-a", first)
    step = w.step(45)

    assert [(j.kind, j.backup_id) for j in step.effects] == [("restore", "bk-a")]
    assert w.status().rollbacks[0].state == "restoring"


def test_restore_decided_before_an_abort_is_still_carried_out() -> None:
    w = World(["a", "b"])
    w.rollout(live=True, batch_size=1, on_failure="rollback")
    w.step(0)
    w.fail("a", backup_id="bk-a")
    w.step(5)
    assert w.state("a") == "rollback_pending"

    w.edit(abort=True)
    w.step(10)
    w.answer(w.job("a"), "succeeded")
    w.step(15)

    assert w.phase() == "aborted" and w.state("a") == "rolled_back"
    assert w.node("a").held is None


# --- a node whose only apply its agent failed ------------------------------------------


def test_rollback_all_skips_a_node_whose_only_apply_its_agent_failed() -> None:
    """The agent put the old bytes back itself (docs/protocol.md): restoring its
    backup would only rerun the failing after-apply command."""
    w = World(["a", "b"])
    w.rollout(live=True, batch_size=2)
    w.step(0)
    w.succeed("a", backup_id="bk-a")
    w.heartbeat("a", at=w.at(1))
    w.fail("b", backup_id="bk-b", error="after_apply_failed: exit 3; previous config restored")
    w.step(5)
    assert w.hold() == "health_failed"

    w.rollback(id="rb1", nodes=None)
    step = w.step(10)

    assert [(j.node, j.kind, j.backup_id) for j in step.effects] == [("a", "restore", "bk-a")]
    assert w.state("b") == "failed" and w.node("b").restore is None
    record = w.status().rollbacks[0]
    outcomes = {n.name: (n.outcome, n.message) for n in record.nodes}
    assert outcomes == {
        "a": ("restoring", ""),
        "b": ("skipped", "never changed: its only apply failed"),
    }


# --- a rollback request waiting for a backup list ----------------------------------------

ANA = "Ana <ana@example.org>"
BORIS = "Boris <boris@example.org>"


def first_apply_unseen_and_rollback_waiting(request: str = "r1") -> World:
    """Live, batches of one: a's agent went away before it reported its
    apply (health_unknown); Ana asked to roll a back, which waits for a's
    backup list. b has not been sent anything."""
    w = World(["a", "b"], settings=Settings(offline_after=30))
    w.rollout(live=True, batch_size=1)
    w.step(0)
    w.go_offline("a")
    w.step(31)
    assert w.hold() == "health_unknown" and not w.node("a").first_backup_known
    w.rollback(id=request, nodes=["a"], author=ANA)
    step = w.step(40)
    assert step.effects == () and w.status().rollbacks[0].state == "waiting"
    return w


def test_a_resume_while_a_rollback_request_waits_is_refused_and_sends_nothing() -> None:
    w = first_apply_unseen_and_rollback_waiting()

    w.edit(resume_request="go-on", author=BORIS)
    step = w.step(45)

    assert step.effects == ()
    assert w.node("a").attempt == 1 and w.state("b") == "pending"
    refusal = w.status().condition("resume_refused")
    assert refusal is not None and 'rollbackRequest "r1" waits' in refusal.message
    assert w.status().last_handled_resume == "go-on"
    assert w.hold() == "health_unknown"
    (record,) = w.status().rollbacks
    assert record.state == "waiting" and record.requested_by == ANA


def test_a_waiting_rollback_request_stays_accepted_once_the_rollout_runs_again() -> None:
    w = first_apply_unseen_and_rollback_waiting()
    apply = w.job("a")

    # Someone else gives up on a: the hold ends and the rollout runs again,
    # but nothing is dispatched while the request waits.
    w.edit(skip_nodes=["a"], author=BORIS)
    step = w.step(45)
    assert w.phase() == "running" and step.effects == ()
    w.step(50)
    assert w.phase() == "running" and w.last.effects == () and w.state("b") == "pending"
    (record,) = w.status().rollbacks
    assert record.state == "waiting" and w.status().condition("rollback_refused") is None

    w.come_back("a")
    w.backup("a", "bk-a", apply)
    step = w.step(55)

    assert [(j.node, j.kind, j.backup_id) for j in step.effects] == [("a", "restore", "bk-a")]
    (record,) = w.status().rollbacks
    assert record.state == "restoring" and record.time == w.at(40)
    assert record.requested_by == ANA  # not Boris, whose commit is the newest
    # Once the restore is done, the rollout carries on with the next batch.
    w.answer(w.job("a"), "succeeded")
    step = w.step(60)
    assert {n.name: n.outcome for n in w.status().rollbacks[0].nodes} == {"a": "rolled_back"}
    assert [(j.node, j.kind) for j in step.effects] == [("b", "apply")]


# --- a waiting rollback request that the file drops or replaces ----------------------------


def test_a_waiting_rollback_request_replaced_by_a_new_id_ends_refused() -> None:
    w = first_apply_unseen_and_rollback_waiting("r1")

    w.rollback(id="r2", nodes=["a"], author=ANA)
    step = w.step(45)

    assert step.effects == ()
    states = {r.id: r for r in w.status().rollbacks}
    assert states["r1"].state == "refused"
    assert states["r1"].message.startswith('replaced by "r2"')
    assert states["r2"].state == "waiting"


def test_a_waiting_rollback_request_removed_from_the_file_ends_refused_and_frees_dispatch() -> None:
    w = first_apply_unseen_and_rollback_waiting("r1")

    w.edit(rollback_request=None)
    w.step(45)

    (record,) = w.status().rollbacks
    assert record.state == "refused" and record.message.startswith("removed from the file")
    # Nothing holds dispatch back any more: a resume sends a new attempt.
    w.come_back("a")
    w.resume()
    step = w.step(50)
    assert [(j.node, j.kind, j.attempt) for j in step.effects] == [("a", "apply", 2)]
    assert w.status().condition("resume_refused") is None


# --- a first apply that took no backup -----------------------------------------------------


def first_apply_without_backup_then_a_second_with_one(on_failure: str) -> World:
    """Live, one node: attempt 1 succeeds at the agent without a backup (the
    node had no config before), but no fresh heartbeat comes by its deadline
    (timed_out). Attempt 2 (retried, or resumed) finds other bytes in place
    and backs them up: they are not what the node held before this rollout."""
    w = World(["a"])
    w.rollout(live=True, on_failure=on_failure, health_timeout=60)
    w.step(0)
    w.succeed("a", backup_id=None, at=w.at(1))
    w.step(60)
    assert w.node("a").first_backup_id is None
    if w.job("a").attempt == 1:  # not retried by itself: held
        assert w.state("a") == "timed_out" and w.hold() == "rollback_unavailable"
        w.resume()
        w.step(65)
    assert w.job("a").attempt == 2
    w.succeed("a", backup_id="bk-in-between", at=w.at(66))
    return w


def test_explicit_rollback_of_a_node_whose_first_apply_took_no_backup_restores_nothing() -> None:
    w = first_apply_without_backup_then_a_second_with_one("retry_once")
    w.heartbeat("a", at=w.at(67))
    w.step(70)
    assert w.phase() == "completed" and w.node("a").backup_id == "bk-in-between"

    w.rollback(id="undo")
    step = w.step(80)

    assert step.effects == () and w.state("a") == "succeeded"
    assert w.node("a").first_backup_id is None and w.node("a").first_apply_attempt == 1
    (record,) = w.status().rollbacks
    (node,) = record.nodes
    assert record.state == "done" and node.outcome == "unavailable"
    assert node.message.startswith("its first apply (attempt 1) left no backup")


def test_rollback_policy_on_a_later_attempt_never_restores_that_attempts_backup() -> None:
    w = first_apply_without_backup_then_a_second_with_one("rollback")
    assert w.status().rollbacks == ()

    w.step(125)  # attempt 2's deadline passes without a fresh heartbeat either

    assert w.state("a") == "timed_out" and w.hold() == "rollback_unavailable"
    assert [j.kind for j in w.jobs_to("a")] == ["apply", "apply"]


def test_an_apply_its_agent_failed_without_a_backup_does_not_count_as_the_first() -> None:
    """The agent left the config as it was, so the next apply's backup holds
    the bytes from before this rollout."""
    w = World(["a"])
    w.rollout(live=True, on_failure="retry_once")
    w.step(0)
    w.fail("a", backup_id=None, error="after_apply_failed: exit 1; previous config restored")
    w.step(5)
    assert w.job("a").attempt == 2 and w.node("a").first_apply_attempt is None
    w.succeed("a", backup_id="bk-second")
    w.heartbeat("a", at=w.at(7))
    w.step(10)
    assert w.phase() == "completed" and w.node("a").first_apply_attempt == 2

    w.rollback(id="undo")
    step = w.step(20)

    assert [(j.kind, j.backup_id) for j in step.effects] == [("restore", "bk-second")]


def test_a_status_written_before_first_apply_attempt_existed_is_read_and_stepped() -> None:
    w = World(["a"])
    w.rollout(live=True)
    w.step(0)
    w.succeed("a", backup_id="bk-a")
    w.heartbeat("a", at=w.at(2))
    w.step(5)
    data = json.loads(json.dumps(to_record(w.status())))
    for node in data["nodes"]:
        del node["firstApplyAttempt"]
    assert not list(STATUS_SCHEMA.iter_errors(data))
    w.statuses["r"] = from_record(data)
    assert w.node("a").first_apply_attempt is None and w.node("a").first_backup_id == "bk-a"

    w.rollback(id="undo")
    step = w.step(10)

    assert [(j.kind, j.backup_id) for j in step.effects] == [("restore", "bk-a")]


def test_a_finished_rollout_left_at_rest_by_the_memo_still_takes_a_rollback_request() -> None:
    # The daemon keeps a StepMemo so finished rollouts at rest are not stepped
    # again; a request arriving later must be handled exactly as without it.
    w = World(["a"])
    w.rollout(live=True)
    w.step(0)
    w.succeed("a", backup_id="bk-a")
    w.heartbeat("a", at=w.at(2))
    w.step(5)
    assert w.phase() == "completed"
    memo = StepMemo()
    fleet = Fleet(tuple(w.fleet.values()))
    for at in (6, 7):  # the second pass finds it at rest
        rested = step_fleet(w.inputs(), fleet, w.settings, w.observations(), w.at(at), memo=memo)
        assert rested.statuses == {} and rested.effects == ()
    assert memo.resting(w.inputs(), fleet, w.settings) == {"r"}

    w.rollback(id="undo")
    plain = step_fleet(w.inputs(), fleet, w.settings, w.observations(), w.at(10))
    with_memo = step_fleet(w.inputs(), fleet, w.settings, w.observations(), w.at(10), memo=memo)
    assert with_memo == plain
    assert with_memo.statuses["r"].nodes[0].state == "restoring"


def test_the_rollback_rules_for_one_node_decide_in_design_order() -> None:
    sent = NodeRecord(name="a", batch=1, state="succeeded", attempt=1, job_id="j")
    assert node_outcome(None, None) == ("refused", "not a node of this rollout")
    assert node_outcome(NodeRecord(name="a", batch=1), None) == (
        "skipped",
        "never sent: this rollout did not change it",
    )
    assert node_outcome(replace(sent, state="dispatched"), "other") == (
        "refused",
        "a job is in flight on it; retry when it finished",
    )
    assert node_outcome(sent, "later") == ("refused", "changed since by rollout later")
    assert node_outcome(sent, None) is None  # its first backup decides
    assert backup_outcome(replace(sent, first_backup_known=False))[0] == "waiting"
    known = replace(sent, first_backup_known=True, first_apply_attempt=1)
    assert backup_outcome(replace(known, first_backup_id="bk"))[0] == "restoring"
    assert backup_outcome(known)[0] == "unavailable"


def test_a_rollback_request_is_refused_whole_on_a_dry_run_or_a_running_rollout() -> None:
    assert "dry-run" in request_refusal(False, "paused", accepted=False)
    assert "running and not held" in request_refusal(True, "running", accepted=False)
    assert request_refusal(True, "running", accepted=True) == ""
    assert request_refusal(True, "paused", accepted=False) == ""
