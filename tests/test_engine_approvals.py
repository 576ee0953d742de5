"""``approvedBy`` in status (docs/trust.md): recorded when a rollout
starts under approvals, kept while it runs, renewed only by a change of its
own spec; absent without approvals, as in version 1."""

from __future__ import annotations

from reconciler.spec.rollout_status import ApprovalRecord, to_record
from tests.engine_world import World

BOB = ApprovalRecord("bob@example.com", "SHA256:bob")
CAROL = ApprovalRecord("carol@example.com", "SHA256:carol")


def test_a_rollout_started_under_approvals_records_who_approved() -> None:
    world = World(nodes=2)
    world.rollout("r", batch_size=1)
    world.approved_by = (BOB,)
    world.step()
    assert world.phase() == "running"
    assert world.status().approved_by == (BOB,)
    assert to_record(world.status())["approvedBy"] == [
        {"principal": "bob@example.com", "keyId": "SHA256:bob"}
    ]


def test_an_approval_of_another_change_rewrites_no_running_status() -> None:
    world = World(nodes=2)
    world.rollout("r", batch_size=1)
    world.approved_by = (BOB,)
    world.step()
    before = world.status()
    world.approved_by = (CAROL,)  # a newer verified commit, approved by carol
    world.step()
    assert world.status().approved_by == (BOB,)
    assert world.status() is before or world.status() == before


def test_a_change_of_the_rollouts_own_spec_records_its_approvers() -> None:
    world = World(nodes=2)
    world.rollout("r", batch_size=1)
    world.approved_by = (BOB,)
    world.step()
    world.approved_by = (CAROL,)
    world.edit("r", paused=True)
    world.step()
    assert world.status().approved_by == (CAROL,)


def test_without_approvals_the_status_has_no_approved_by() -> None:
    world = World(nodes=2)
    world.rollout("r", batch_size=1)
    world.step()
    assert world.status().approved_by == ()
    assert "approvedBy" not in to_record(world.status())
