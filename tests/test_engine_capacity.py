"""Scenarios and properties: batches spread across a label's values
(``spreadBy``) and a failure budget under observe (docs/capacity.md)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.spec.batch_shapes import entry_size, share_of, spread_numbers
from reconciler.spec.model import SpreadBy
from reconciler.spec.rollout_status import from_record, to_record
from tests.engine_world import World

# --- the order rule -----------------------------------------------------------

fleets = st.lists(st.sampled_from(["", "a", "b", "c", "d"]), min_size=1, max_size=60)
shares = st.one_of(st.integers(1, 4), st.sampled_from(["1%", "25%", "50%", "100%"]))
shapes = st.one_of(
    st.tuples(st.just(()), st.integers(1, 8)),
    st.tuples(
        st.lists(
            st.one_of(st.integers(1, 6), st.sampled_from(["10%", "50%"])), min_size=1, max_size=4
        ).map(tuple),
        st.just(1),
    ),
)


@settings(max_examples=300, deadline=None)
@given(values=fleets, share=shares, shape=shapes)
def test_no_batch_holds_more_than_max_per_batch_of_a_value_and_every_node_is_in_one(
    values: list[str], share: int | str, shape: tuple[tuple[int | str, ...], int]
) -> None:
    batches, batch_size = shape
    numbers = spread_numbers(values, batches, batch_size, share)

    assert len(numbers) == len(values)  # each node in exactly one batch
    used = sorted(set(numbers))
    assert used == list(range(1, len(used) + 1))  # batches numbered 1..k, none empty
    shared = Counter(values)
    per_batch = Counter(zip(numbers, values, strict=True))
    for (_, value), n in per_batch.items():
        assert n <= share_of(share, shared[value])
    # No batch is larger than its entry says (the last entry repeating).
    entries = batches or (batch_size,)
    for batch, n in Counter(numbers).items():
        assert n <= entry_size(entries[min(batch - 1, len(entries) - 1)], len(values))


@settings(max_examples=200, deadline=None)
@given(values=fleets, share=shares, size=st.integers(1, 8))
def test_batches_are_filled_in_frozen_order_skipping_only_full_values(
    values: list[str], share: int | str, size: int
) -> None:
    numbers = spread_numbers(values, (), size, share)
    shared = Counter(values)
    for batch in sorted(set(numbers)):
        members = [i for i, b in enumerate(numbers) if b == batch]
        taken = Counter(values[i] for i in members)
        if len(members) == size:
            continue
        # Short of its size: every node left for later batches has a full value.
        for i, b in enumerate(numbers):
            if b > batch:
                assert taken[values[i]] >= share_of(share, shared[values[i]])


def test_six_nodes_in_three_zones_one_per_zone_per_batch() -> None:
    zones = ["z1", "z1", "z2", "z2", "z3", "z3"]
    assert spread_numbers(zones, (), 3, 1) == (1, 2, 1, 2, 1, 2)


def test_a_percentage_is_of_the_nodes_sharing_the_value_rounded_down_at_least_one() -> None:
    assert share_of("50%", 5) == 2 and share_of("50%", 1) == 1 and share_of("10%", 3) == 1


# --- through the engine -------------------------------------------------------


def zoned_world() -> World:
    w = World([f"n{i}" for i in range(1, 8)])
    for k, zone in enumerate(["a", "a", "b", "b", "c", "c"], start=1):
        w.set_node(f"n{k}", labels={"zone": zone})
    return w  # n7 has no zone label


def test_the_engine_records_spread_batches_and_dispatches_one_zone_value_each() -> None:
    w = zoned_world()
    w.rollout(batch_size=3, spread_by=SpreadBy("zone", 1))

    w.step(0)

    status = w.status()
    assert [(n.name, n.batch) for n in status.nodes] == [
        ("n1", 1),
        ("n2", 2),
        ("n3", 1),
        ("n4", 2),
        ("n5", 1),
        ("n6", 2),
        ("n7", 3),
    ]
    assert sorted(w.sent_now()) == ["n1", "n3", "n5"]
    assert status.frozen is not None and status.frozen.spread_by == SpreadBy("zone", 1)
    assert "spread by zone" in status.message
    assert from_record(to_record(status)) == status

    for node in ("n1", "n3", "n5"):
        w.succeed(node)
    w.step(5)
    assert sorted(w.sent_now()) == ["n2", "n4", "n6"]
    for node in ("n2", "n4", "n6"):
        w.succeed(node)
    w.step(10)
    assert w.sent_now() == ["n7"]  # without the label: the value "", placed too
    w.succeed("n7")
    w.step(15)
    assert w.phase() == "completed"


def test_a_label_changed_after_start_moves_no_node_between_batches() -> None:
    w = zoned_world()
    w.rollout(batch_size=3, spread_by=SpreadBy("zone", 1))
    w.step(0)
    before = [(n.name, n.batch) for n in w.status().nodes]

    w.set_node("n2", labels={"zone": "b"})
    w.step(1)

    assert [(n.name, n.batch) for n in w.status().nodes] == before


def observe_with_budget(budget: int | str) -> World:
    w = World(["a", "b", "c", "d", "e", "f"])
    w.rollout(batch_size=2, on_failure="observe", failure_budget=budget)
    w.step(0)
    return w


def test_a_failure_within_the_budget_carries_on_and_the_next_one_holds_naming_both() -> None:
    w = observe_with_budget(1)
    w.fail("a")
    w.succeed("b")
    w.step(5)
    assert w.phase() == "running" and w.state("a") == "failed"
    assert sorted(w.sent_now()) == ["c", "d"]

    w.succeed("c")
    w.fail("d")
    w.step(10)

    assert w.phase() == "paused" and w.hold() == "failure_budget_exceeded"
    hold = w.status().hold
    assert hold is not None and hold.nodes == ("a", "d")
    assert "a, d ended failed" in hold.message
    assert w.sent_now() == []


def test_a_resume_lifts_the_budget_hold_without_sending_again_and_counting_goes_on() -> None:
    w = observe_with_budget(1)
    w.fail("a")
    w.succeed("b")
    w.step(5)
    w.succeed("c")
    w.fail("d")
    w.step(10)
    assert w.hold() == "failure_budget_exceeded"

    w.resume(token="r1")
    w.step(15)
    assert w.phase() == "running" and sorted(w.sent_now()) == ["e", "f"]
    assert w.state("d") == "failed" and w.node("d").attempt == 1

    w.fail("e")
    w.succeed("f")
    w.step(20)
    assert w.hold() == "failure_budget_exceeded"
    hold = w.status().hold
    assert hold is not None and hold.nodes == ("a", "d", "e")

    w.resume(token="r2")
    w.step(25)
    assert w.phase() == "failed" and w.status().reason == "not_all_succeeded"


def test_a_percentage_budget_is_of_the_frozen_nodes_rounded_down() -> None:
    w = observe_with_budget("20%")  # 6 nodes: 1 allowed
    w.fail("a")
    w.fail("b")
    w.step(5)
    assert w.hold() == "failure_budget_exceeded"
    hold = w.status().hold
    assert hold is not None and hold.nodes == ("a", "b")


def test_a_budget_of_zero_holds_at_the_first_failure_and_unknown_counts() -> None:
    w = observe_with_budget(0)
    w.go_offline("a")
    w.succeed("b")
    w.step(400)  # past the deadline while unreachable: unknown
    assert w.state("a") == "unknown" and w.hold() == "failure_budget_exceeded"


def test_spread_by_and_the_budget_edited_after_start_are_reported_and_not_applied() -> None:
    w = zoned_world()
    w.rollout(batch_size=3, spread_by=SpreadBy("zone", 1), on_failure="observe", failure_budget=1)
    w.step(0)
    before = [(n.name, n.batch) for n in w.status().nodes]

    w.edit(spread_by=SpreadBy("zone", 3), failure_budget=5)
    w.step(1)

    status = w.status()
    condition = status.condition("frozen_fields_changed")
    assert condition is not None and "spreadBy, failureBudget" in condition.message
    assert [(n.name, n.batch) for n in status.nodes] == before
    assert status.frozen is not None and status.frozen.failure_budget == 1
