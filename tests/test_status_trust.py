"""status_trust.tampered_fields: which fields of a started status the
verified spec at its startCommit does not back (values in, names out)."""

from __future__ import annotations

from dataclasses import replace

from reconciler.daemon.status_trust import StartSpec, tampered_fields
from reconciler.protocol.job_ids import job_id
from reconciler.spec.model import SpreadBy, Target
from reconciler.spec.rollout_status import FrozenSpec, NodeRecord, RestoreRecord, RolloutStatus
from reconciler.spec.times import parse_time

START = "a" * 40
OTHER = "b" * 40
ON_BRANCH = {START}.__contains__
FROZEN = FrozenSpec(
    target=Target("hermes", "ollama", "good-model", "default"),
    batch_size=2,
    live=True,
    on_failure="retry_once",
    node_ids=("n1", "n2", "n3"),
)
EXPECTED = StartSpec(FROZEN, ("n1", "n2", "n3"))


def node(name: str, batch: int, attempt: int = 1) -> NodeRecord:
    return NodeRecord(
        name=name,
        batch=batch,
        state="dispatched",
        attempt=attempt,
        job_id=job_id("r", START, name, attempt, "apply"),
        source_commit=START,
    )


STATUS = RolloutStatus(
    name="r",
    phase="running",
    start_commit=START,
    frozen=FROZEN,
    nodes=(node("n1", 1), node("n2", 1), node("n3", 2)),
)


def test_a_status_as_the_daemon_wrote_it_is_backed() -> None:
    assert tampered_fields(STATUS, EXPECTED, ON_BRANCH) == ()


def test_an_edited_frozen_value_is_named() -> None:
    evil = replace(FROZEN, target=replace(FROZEN.target, model="evil-model"), live=False)
    assert tampered_fields(replace(STATUS, frozen=evil), EXPECTED, ON_BRANCH) == (
        "frozen.target.model",
        "frozen.live",
    )


def test_nodes_may_only_have_left_the_selection_in_order() -> None:
    fewer = replace(STATUS, nodes=(node("n1", 1), node("n3", 1)))
    assert tampered_fields(fewer, EXPECTED, ON_BRANCH) == ()
    added = replace(STATUS, nodes=(*STATUS.nodes, node("n4", 2)))
    assert tampered_fields(added, EXPECTED, ON_BRANCH) == ("frozen.nodes",)
    swapped = replace(STATUS, nodes=(node("n2", 1), node("n1", 1), node("n3", 2)))
    assert tampered_fields(swapped, EXPECTED, ON_BRANCH) == ("frozen.nodes",)
    rebatched = replace(STATUS, nodes=(node("n1", 1), node("n2", 2), node("n3", 2)))
    assert tampered_fields(rebatched, EXPECTED, ON_BRANCH) == ("nodes[n2].batch",)


def test_an_attempt_or_job_id_edited_alone_breaks_the_derived_job_id() -> None:
    bumped = replace(STATUS.nodes[0], attempt=5)
    status = replace(STATUS, nodes=(bumped, *STATUS.nodes[1:]))
    assert tampered_fields(status, EXPECTED, ON_BRANCH) == ("nodes[n1].jobId",)


def test_start_and_source_commits_must_be_on_the_branch() -> None:
    moved = replace(STATUS, start_commit=OTHER)
    assert tampered_fields(moved, EXPECTED, {START, OTHER}.__contains__) != ()
    assert tampered_fields(moved, EXPECTED, ON_BRANCH) == ("startCommit",)
    assert tampered_fields(STATUS, None, ON_BRANCH) == ("startCommit",)
    elsewhere = replace(STATUS.nodes[2], source_commit=OTHER)
    status = replace(STATUS, nodes=(*STATUS.nodes[:2], elsewhere))
    assert tampered_fields(status, EXPECTED, ON_BRANCH) == ("nodes[n3].sourceCommit",)


def test_a_restore_record_is_checked_too() -> None:
    when = parse_time("2026-12-01T12:00:00Z")
    restore = RestoreRecord(
        request="r1",
        job_id=job_id("r", START, "n1", 1, "restore", "r1"),
        backup_id="b-1",
        attempt=1,
        source_commit=START,
        dispatched_at=when,
        deadline=when,
    )
    ok = replace(STATUS, nodes=(replace(STATUS.nodes[0], restore=restore), *STATUS.nodes[1:]))
    assert tampered_fields(ok, EXPECTED, ON_BRANCH) == ()
    other = replace(restore, request="r2")
    bad = replace(STATUS, nodes=(replace(STATUS.nodes[0], restore=other), *STATUS.nodes[1:]))
    assert tampered_fields(bad, EXPECTED, ON_BRANCH) == ("nodes[n1].restore.jobId",)


def test_a_status_not_started_carries_nothing_to_check() -> None:
    assert tampered_fields(RolloutStatus(name="r"), None, ON_BRANCH) == ()


def test_batches_cut_by_a_batches_list_are_backed_and_edited_sizes_are_named() -> None:
    growing = replace(FROZEN, batches=(1, "100%"))
    expected = StartSpec(growing, ("n1", "n2", "n3"))
    status = replace(STATUS, frozen=growing, nodes=(node("n1", 1), node("n2", 2), node("n3", 2)))
    assert tampered_fields(status, expected, ON_BRANCH) == ()
    widened = replace(status, frozen=replace(growing, batches=(3,)))
    assert tampered_fields(widened, expected, ON_BRANCH) == (
        "frozen.batches",
        "nodes[n2].batch",
        "nodes[n3].batch",
    )


def test_checks_added_to_a_status_are_named() -> None:
    from reconciler.spec.health import Health, HealthCheck, TcpProbe

    added = Health(checks=(HealthCheck("port", tcp=TcpProbe("127.0.0.1", 22)),))
    edited = replace(STATUS, frozen=replace(FROZEN, health=added))
    assert tampered_fields(edited, EXPECTED, ON_BRANCH) == ("frozen.health",)


def test_spread_batches_are_backed_by_the_labels_at_start_and_edited_ones_are_named() -> None:
    spread = replace(FROZEN, spread_by=SpreadBy("zone", 1))
    expected = StartSpec(spread, ("n1", "n2", "n3"), {"n1": "a", "n2": "a", "n3": "b"})
    status = replace(STATUS, frozen=spread, nodes=(node("n1", 1), node("n2", 2), node("n3", 1)))
    assert tampered_fields(status, expected, ON_BRANCH) == ()
    # n2 moved into batch 1, beside n1 of the same zone
    packed = replace(status, nodes=(node("n1", 1), node("n2", 1), node("n3", 2)))
    assert tampered_fields(packed, expected, ON_BRANCH) == ("nodes[n2].batch", "nodes[n3].batch")
    looser = replace(status, frozen=replace(spread, spread_by=SpreadBy("zone", 2)))
    assert "frozen.spreadBy" in tampered_fields(looser, expected, ON_BRANCH)
    budget = replace(status, frozen=replace(spread, failure_budget=3))
    assert tampered_fields(budget, expected, ON_BRANCH) == ("frozen.failureBudget",)
