"""Scenarios: selection, batches, dry-run progress, startAt, completion."""

from __future__ import annotations

from reconciler.engine.step import select_nodes_by_index
from reconciler.spec.model import Fleet, Node, RolloutSpec
from tests.engine_world import TARGET, World


def test_three_nodes_batch_size_two_make_batches_ab_then_c() -> None:
    w = World(["a", "b", "c"])
    w.rollout(batch_size=2)

    w.step(0)

    assert [(n.name, n.batch) for n in w.status().nodes] == [("a", 1), ("b", 1), ("c", 2)]
    assert w.sent_now() == ["a", "b"]
    assert [(b.index, b.state) for b in w.status().batches] == [(1, "running"), (2, "pending")]


def test_dry_run_two_nodes_one_at_a_time_until_completed() -> None:
    w = World(["a", "b"])
    w.rollout(batch_size=1)

    w.step(0)
    assert w.sent_now() == ["a"]
    assert w.job("a").mode == "dry_run"
    assert w.states() == {"a": "dispatched", "b": "pending"}

    w.succeed("a")
    w.step(5)
    assert w.sent_now() == ["b"]
    assert w.states() == {"a": "succeeded", "b": "dispatched"}

    w.succeed("b")
    w.step(9)
    assert w.phase() == "completed"
    assert w.status().finished_at == w.at(9)
    assert w.last.effects == ()


def test_completed_rollout_stays_the_same_when_stepped_again() -> None:
    w = World(["a"])
    w.rollout()
    w.step(0)
    w.succeed("a")
    w.step(1)

    again = w.step(100)

    assert again.statuses == {} and again.effects == ()


def test_start_at_one_minute_ahead_schedules_then_starts_at_sixty_seconds() -> None:
    w = World(["a", "b"])
    w.rollout(start_at="2026-12-01T09:01:00Z")

    w.step(0)
    assert w.phase() == "scheduled" and w.last.effects == ()
    w.step(59)
    assert w.phase() == "scheduled" and w.last.effects == ()
    assert w.last.statuses == {}  # nothing changed between 0 s and 59 s

    w.step(60)
    assert w.phase() == "running"
    assert w.sent_now() == ["a"]


def test_scheduled_rollout_aborted_never_sends_a_job() -> None:
    w = World(["a"])
    w.rollout(start_at="2026-12-01T10:00:00Z")
    w.step(0)

    w.edit(abort=True)
    w.step(10)
    w.step(7200)

    assert w.phase() == "aborted"
    assert w.sent == []


def test_selector_matches_are_ordered_by_name_and_skip_maintenance() -> None:
    fleet = Fleet(
        (
            Node("z1", "http://h:1", (("role", "canary"),)),
            Node("a1", "http://h:1", (("role", "canary"),)),
            Node("m1", "http://h:1", (("role", "canary"),), maintenance=True),
            Node("b1", "http://h:1", (("role", "main"),)),
        )
    )
    spec = RolloutSpec(name="r", target=TARGET, selector=(("role", "canary"),))

    assert select_nodes_by_index(spec, fleet) == ("a1", "z1")
    with_maintenance = RolloutSpec(
        name="r", target=TARGET, selector=(("role", "canary"),), include_maintenance=True
    )
    assert select_nodes_by_index(with_maintenance, fleet) == ("a1", "m1", "z1")


def test_node_ids_keep_their_order_and_drop_duplicates() -> None:
    fleet = Fleet(tuple(Node(n, "http://h:1") for n in ("a", "b", "c")))
    spec = RolloutSpec(name="r", target=TARGET, node_ids=("c", "a", "c", "b"))

    assert select_nodes_by_index(spec, fleet) == ("c", "a", "b")


def test_first_batch_is_dispatched_in_the_same_pass_as_the_start() -> None:
    w = World(["a", "b", "c", "d"])
    w.rollout(batch_size=3, live=True)

    step = w.step(0)

    assert w.phase() == "running"
    assert [j.node for j in step.effects] == ["a", "b", "c"]
    assert all(j.mode == "live" and j.attempt == 1 and j.kind == "apply" for j in step.effects)
    assert {(t.from_state, t.to_state) for t in step.transitions if t.node is None} == {
        ("pending", "running")
    }


def test_deadline_is_dispatch_time_plus_health_timeout() -> None:
    w = World(["a"])
    w.rollout(health_timeout=90)

    w.step(10)

    node = w.node("a")
    assert node.dispatched_at == w.at(10)
    assert node.deadline == w.at(100)


def test_node_in_maintenance_at_dispatch_holds_dispatch_refused_until_fixed_and_resumed() -> None:
    w = World(["a", "b"])
    w.rollout(batch_size=1)
    w.step(0)
    w.set_node("b", maintenance=True)
    w.succeed("a")

    w.step(5)
    assert w.hold() == "dispatch_refused" and w.last.effects == ()
    assert w.state("b") == "pending" and "maintenance" in w.node("b").error

    w.set_node("b", maintenance=False)
    w.resume()
    w.step(10)
    assert w.sent_now() == ["b"] and w.phase() == "running"


def test_invalid_agent_address_at_dispatch_holds_dispatch_refused() -> None:
    w = World(["a"])
    w.set_node("a", agent="ftp://10.0.0.1")
    w.rollout()

    w.step(0)

    assert w.hold() == "dispatch_refused" and w.sent == []
    assert "http(s)://host[:port]" in w.status().hold.message  # type: ignore[union-attr]


def test_a_hold_names_at_most_twenty_nodes_and_counts_them_all() -> None:
    w = World(25)
    w.rollout(batch_size=25)
    w.step(0)
    for job in list(w.sent):
        w.answer(job, "failed", error="boom")

    w.step(5)

    hold = w.status().hold
    assert hold is not None and len(hold.nodes) == 20 and hold.node_count == 25
    assert "and 5 more" in hold.message
