"""What people read says what happened: statuses made by the real engine
(``tests/engine_world.World``), read through the dashboard and ``status``.

- a rollout rolled back after it completed says so, naming the nodes, and
  no count it gives is false;
- a rollout that has ended lists nothing under "Needs attention" that
  only a running rollout could act on;
- while held after a batch, the batch shown is that batch, not the next;
- an unknown node is drawn and counted as unknown, never as failed;
- an apply the agent failed is worded as that, with the agent's error.
"""

from __future__ import annotations

import re

from reconciler.text.dashboard import render_dashboard
from reconciler.text.status_text import render_detail, render_table
from tests.engine_world import World
from tests.markdown_render import plain_text


def row(page: str, name: str = "r") -> list[str]:
    """The dashboard row of rollout ``name``: its cells after the name."""
    [line] = [ln for ln in page.splitlines() if ln.startswith(f"| [{name}]")]
    return [cell.strip() for cell in line.split("|")[2:-1]]


def attention(page: str) -> str:
    return (
        page.split("## Needs attention")[1].split("\n## ")[0]
        if "## Needs attention" in page
        else ""
    )


def diagram(page: str) -> str:
    return page.split("```mermaid\n")[1].split("```")[0]


def completed_then_two_rolled_back() -> World:
    """Live, one batch of three, all succeeded; then a rollback of b and c."""
    w = World(["a", "b", "c"])
    w.rollout(batch_size=3, live=True)
    w.step(0)
    for node in ("a", "b", "c"):
        w.succeed(node, backup_id=f"bk-{node}")
        w.heartbeat(node, at=w.at(2))
    w.step(5)
    assert w.phase() == "completed"
    w.rollback(id="undo", nodes=["b", "c"])
    w.step(10)
    for node in ("b", "c"):
        w.answer(w.job(node), "succeeded")
    w.step(15)
    assert w.phase() == "completed"
    assert w.states() == {"a": "succeeded", "b": "rolled_back", "c": "rolled_back"}
    return w


def test_a_rollout_rolled_back_after_it_completed_says_so_on_the_dashboard() -> None:
    w = completed_then_two_rolled_back()
    phase, progress, batch, why, _ = row(render_dashboard({"r": w.status()}))

    assert phase == "⏪ completed · live"
    assert progress == "`███░░░░░░░\u00a01/3`"
    assert batch == "-"
    assert why == "`rolled back b, c`"


def test_status_says_what_the_rollout_ended_with_and_what_was_rolled_back_since() -> None:
    w = completed_then_two_rolled_back()
    status = w.status()

    table = render_table({"r": status}, w.now)
    assert re.search(r"^r +completed +███░░░░░░░ 1/3 +- +\S+ +rolled back b, c$", table, re.M)
    detail = " ".join(render_detail(status, w.now).split())
    assert "progress ███░░░░░░░ 1/3" in detail
    assert "nodes 1 succeeded, 2 rolled_back" in detail
    assert "all 3 nodes succeeded when it ended; since then rolled back b, c" in detail
    assert "all 3 nodes succeeded commits" not in detail  # never the bare, stale count


def test_a_rolled_back_rollout_still_restoring_says_which_node() -> None:
    w = World(["a", "b"])
    w.rollout(batch_size=2, live=True)
    w.step(0)
    for node in ("a", "b"):
        w.succeed(node, backup_id=f"bk-{node}")
        w.heartbeat(node, at=w.at(2))
    w.step(5)
    w.rollback(id="undo", nodes=["a", "b"])
    w.step(10)
    w.answer(w.job("a"), "succeeded")
    w.step(15)

    assert row(render_dashboard({"r": w.status()}))[3] == "`rolled back a; restoring b`"


def test_an_ended_rollout_lists_no_stale_conditions_for_a_person() -> None:
    w = World(["a", "b"])
    w.rollout(batch_size=1, live=True)
    w.step(0)
    w.edit(batch_size=2)  # frozen at start: a condition says it is not applied
    w.step(1)
    assert w.status().condition("frozen_fields_changed") is not None
    assert "**r** condition `frozen_fields_changed`" in attention(
        render_dashboard({"r": w.status()})
    )

    w.edit(abort=True)
    w.step(2)
    assert w.phase() == "aborted"
    assert w.status().condition("frozen_fields_changed") is not None  # kept in the record
    page = render_dashboard({"r": w.status()})
    assert "**r**" not in attention(page)


def test_an_ended_rollout_still_lists_a_refused_rollback() -> None:
    w = World(["a"])
    w.rollout(live=False)
    w.step(0)
    w.succeed("a")
    w.step(5)
    assert w.phase() == "completed"
    w.rollback(id="undo")
    w.step(10)
    assert w.status().condition("rollback_refused") is not None

    assert "**r** condition `rollback_refused`" in attention(render_dashboard({"r": w.status()}))


def test_held_after_batch_one_shows_batch_one() -> None:
    w = World(["a", "b", "c"])
    w.rollout(batch_size=1, live=True, pause_after=[1])
    w.step(0)
    w.succeed("a")
    w.heartbeat("a", at=w.at(2))
    w.step(5)
    assert w.hold() == "pause_after_batch"
    assert [b.state for b in w.status().batches] == ["done", "pending", "pending"]

    assert row(render_dashboard({"r": w.status()}))[2] == "1/3"
    table = render_table({"r": w.status()}, w.now)
    assert re.search(r"^r +paused +\S+ 1/3 +1/3 ", table, re.M)
    assert "batch 1/3" in render_detail(w.status(), w.now)

    w.resume()
    w.step(6)
    assert row(render_dashboard({"r": w.status()}))[2] == "2/3"


def test_an_unknown_node_is_drawn_as_unknown_and_its_batch_held_never_failed() -> None:
    w = World(["a", "b"])
    w.rollout(batch_size=1, live=True)
    w.step(0)
    w.go_offline("a")
    w.step(200)  # past offlineAfter (2m)
    assert w.state("a") == "unknown" and w.hold() == "health_unknown"
    page = render_dashboard({"r": w.status()})

    assert '["batch 1<br/>0/1 ok · ?1 unknown · held"]:::held' in diagram(page)
    assert "· failed" not in diagram(page) and ":::failed" not in diagram(page)
    assert row(page)[1] == "`░░░░░░░░░░\u00a00/2\u00a0?1`"
    assert "✗" not in render_table({"r": w.status()}, w.now)
    assert "1  held     0/1 ok  a" in render_detail(w.status(), w.now)


def test_a_failed_node_beside_an_unknown_one_is_counted_apart() -> None:
    w = World(["a", "b"])
    w.rollout(batch_size=2, live=True)
    w.step(0)
    w.go_offline("a")
    w.fail("b", error="disk full")
    w.step(200)
    assert w.states() == {"a": "unknown", "b": "failed"}
    page = render_dashboard({"r": w.status()})

    assert "0/2 ok · ✗1 failed · ?1 unknown · failed" in diagram(page)
    assert row(page)[1] == "`░░░░░░░░░░\u00a00/2\u00a0✗1\u00a0?1`"


def test_an_apply_the_agent_failed_is_worded_as_that_with_its_error() -> None:
    w = World(["a", "b"])
    w.rollout(batch_size=1, live=True)
    w.step(0)
    w.fail("a", error="no space left on device")
    w.step(5)
    hold = w.status().hold
    assert hold is not None and hold.reason == "health_failed"

    assert hold.message == (
        "the apply failed on a (no space left on device); to try it again: reconciler resume "
        "r --push; to give up on it: reconciler skip r a --push; to end the rollout: "
        "reconciler abort r --push"
    )
    assert "health check" not in plain_text(attention(render_dashboard({"r": w.status()})))
