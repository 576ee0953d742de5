"""Scenarios: pending reasons and the start queue (docs/rollouts.md)."""

from __future__ import annotations

from tests.engine_world import World


def test_selector_matching_no_node_is_pending_then_starts_when_a_node_matches() -> None:
    w = World(["a"])
    w.rollout(selector={"role": "canary"})

    w.step(0)
    assert w.phase() == "pending" and w.status().reason == "no_nodes"
    assert w.last.effects == ()

    w.set_node("a", labels={"role": "canary"})
    w.step(5)
    assert w.phase() == "running" and w.sent_now() == ["a"]


def test_unknown_node_name_is_pending_until_the_node_exists() -> None:
    w = World(["a"])
    w.rollout(node_ids=["a", "ghost"])

    w.step(0)
    assert w.phase() == "pending" and w.status().reason == "unknown_nodes"
    assert "ghost" in w.status().message

    w.set_node("ghost")
    w.step(5)
    assert w.phase() == "running"


def test_invalid_file_before_start_is_pending_with_its_problems() -> None:
    w = World(["a"])
    w.rollout()
    w.break_file(problem="rollouts/r.yaml:4:3: spec.target.model: required")

    w.step(0)

    assert w.phase() == "pending" and w.status().reason == "invalid"
    assert "spec.target.model" in w.status().message


def test_paused_before_start_is_pending_then_starts_when_unpaused() -> None:
    w = World(["a"])
    w.rollout(paused=True)

    w.step(0)
    assert w.phase() == "pending" and w.status().reason == "paused"

    w.edit(paused=False)
    w.step(5)
    assert w.phase() == "running"


def test_unverified_rollout_is_pending_with_the_refusal() -> None:
    w = World(["a"])
    w.rollout()
    w.specs["r"] = None
    w.refusals["r"] = "commit abc123 is not signed by an allowed signer"

    w.step(0)

    assert w.phase() == "pending" and w.status().reason == "unverified"
    assert "allowed signer" in w.status().message
    assert w.last.effects == ()


def test_overlapping_rollout_waits_until_the_first_is_terminal() -> None:
    w = World(["a", "b"])
    w.rollout("first", node_ids=["a", "b"])
    w.rollout("second", node_ids=["b"])

    w.step(0)
    assert w.phase("first") == "running"
    assert w.phase("second") == "pending" and w.status("second").reason == "overlap"
    assert "first" in w.status("second").message

    w.succeed("a", "first")
    w.step(5)
    assert w.phase("second") == "pending"
    w.succeed("b", "first")
    w.step(10)

    assert w.phase("first") == "completed"
    assert w.phase("second") == "running" and w.sent_now() == ["b"]


def test_nodes_a_rollout_with_an_unreadable_status_may_hold_are_not_free() -> None:
    w = World(["a", "b"])
    w.unreadable = {"broken": ("a",)}  # its status file cannot be read
    w.rollout("r", node_ids=["a", "b"])

    w.step(0)
    assert w.phase("r") == "pending" and w.status("r").reason == "overlap"
    assert "broken" in w.status("r").message and w.last.effects == ()

    w.unreadable = {}  # repaired (and, say, finished)
    w.step(5)
    assert w.phase("r") == "running"


def test_allow_overlap_lets_both_run() -> None:
    w = World(["a", "b"])
    w.rollout("first", node_ids=["a", "b"])
    w.rollout("second", node_ids=["b"], allow_overlap=True)

    w.step(0)

    assert w.phase("first") == "running" and w.phase("second") == "running"


def test_rollout_freed_by_an_abort_starts_in_the_same_pass() -> None:
    w = World(["a"])
    w.rollout("first")
    w.rollout("second")
    w.step(0)
    assert w.phase("second") == "pending"

    w.edit("first", abort=True)
    step = w.step(5)

    assert w.phase("first") == "aborted"
    assert w.phase("second") == "running"
    assert [j.rollout for j in step.effects] == ["second"]


def test_rollouts_start_in_queue_order_not_name_order() -> None:
    w = World(["a"])
    w.rollout("zeta")  # first seen first
    w.rollout("alpha")

    w.step(0)

    assert w.phase("zeta") == "running" and w.phase("alpha") == "pending"


def test_pending_rollout_removed_is_aborted() -> None:
    w = World(["a"])
    w.rollout(selector={"role": "none"})
    w.step(0)

    w.remove()
    w.step(5)

    assert w.phase() == "aborted" and w.status().reason == "spec_removed"


def test_refusal_after_start_is_a_condition_and_the_rollout_goes_on() -> None:
    w = World(["a", "b"])
    w.rollout(batch_size=1)
    w.step(0)

    w.refusals["r"] = "newest change abc123 is unsigned"
    w.succeed("a")
    w.step(5)

    condition = w.status().condition("unverified")
    assert condition is not None and "unsigned" in condition.message
    assert w.sent_now() == ["b"]
