"""``status/README.md``: one row per rollout and a Mermaid diagram of the
active ones, the same bytes for the same statuses."""

from __future__ import annotations

import random
import re
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from reconciler.engine.holds import hold_message
from reconciler.spec.rollout_status import Condition, RolloutStatus
from reconciler.views.dashboard import (
    DashboardOrder,
    DashboardParts,
    dashboard_parts,
    render_dashboard,
)
from tests.kit.documents import make_status
from tests.markdown_render import plain_text

CANARY = make_status(
    "llama-canary",
    "paused",
    [
        (f"gpu-a{i}", i, "succeeded" if i < 4 else "failed" if i == 4 else "pending")
        for i in range(1, 9)
    ],
    hold="health_failed",
    hold_nodes=["gpu-a4"],
    transitions=[("pending", "running", "started"), ("running", "paused", "health_failed")],
)
WIDE = make_status(
    "qwen-wide",
    "running",
    [
        (
            f"n{i:03d}",
            (i - 1) // 10 + 1,
            "succeeded" if i <= 30 else "dispatched" if i <= 40 else "pending",
        )
        for i in range(1, 201)
    ],
    batch_size=10,
    transitions=[("pending", "running", "started")],
)
DONE = make_status(
    "mistral-old",
    "completed",
    [("gpu-b1", 1, "succeeded")],
    transitions=[("running", "completed", "all_succeeded")],
)
WAITING = make_status(
    "phi-next",
    "pending",
    reason="overlap",
    message="shares nodes with qwen-wide",
    conditions=(
        Condition(
            "unverified",
            "commit 1234abc is not signed by an allowed signer",
            DONE.transitions[0].time,
        ),
    ),
)
ALL = {s.name: s for s in (DONE, WIDE, WAITING, CANARY)}


def rows(text: str) -> dict[str, list[str]]:
    """Table rows by rollout name: the cells after the name."""
    table: dict[str, list[str]] = {}
    for line in text.splitlines():
        if match := re.match(r"\| \[([a-z0-9-]+)\]", line):
            table[match.group(1)] = [cell.strip() for cell in line.split("|")[2:-1]]
    return table


def test_one_row_per_rollout_with_phase_progress_batch_and_hold() -> None:
    text = render_dashboard(ALL)

    table = rows(text)
    assert list(table) == ["llama-canary", "qwen-wide", "phi-next", "mistral-old"]
    phase, progress, batch, why, since = table["llama-canary"]
    assert "paused" in phase and "live" in phase
    assert progress == "`███░░░░░░░\u00a03/8\u00a0✗1`"  # never wraps apart
    assert batch == "4/8"
    assert why == "`health_failed`"
    assert since == "2026-12-01\u00a009:00Z"
    assert table["qwen-wide"][1] == "`█░░░░░░░░░\u00a030/200`"
    assert table["phi-next"][3] == "`overlap`"
    assert table["mistral-old"][1] == "`██████████\u00a01/1`"
    assert "[llama-canary](llama-canary.yaml)" in text  # links to the status file


def test_holds_and_conditions_are_listed_for_a_person() -> None:
    text = render_dashboard(ALL)

    attention = text.split("## Needs attention")[1].split("##")[0]
    # The message names the nodes once; no "Nodes:" list repeats them.
    assert "- 🛑 **llama-canary** `health_failed`: gpu-a4\\: health\\_failed." in attention
    assert "**phi-next** condition `unverified`: commit 1234abc is not signed" in attention


def test_mermaid_diagram_of_active_rollouts_coloured_by_batch_state() -> None:
    text = render_dashboard(ALL)

    diagram = text.split("```mermaid\n")[1].split("```")[0]
    assert diagram.startswith("flowchart TB")
    assert 'subgraph r1["llama-canary: paused (health_failed)"]' in diagram
    assert 'subgraph r2["qwen-wide: running"]' in diagram
    assert "mistral-old" not in diagram and "phi-next" not in diagram  # not active
    assert '["batches 1-3<br/>3/3 ok · done"]:::done' in diagram
    assert '["batch 4<br/>0/1 ok · ✗1 failed · failed"]:::failed' in diagram
    assert '["batches 5-8<br/>0/4 ok · pending"]:::pending' in diagram
    assert '["batch 4<br/>0/10 ok · running"]:::running' in diagram
    assert "r1b1 --> r1b4 --> r1b5" in diagram
    for state in ("done", "running", "held", "failed", "unknown", "pending"):
        assert re.search(rf"^  classDef {state} fill:#", diagram, re.M)


def test_a_huge_rollout_is_still_a_handful_of_boxes() -> None:
    nodes = [(f"n{i:05d}", i, "succeeded" if i <= 4000 else "pending") for i in range(1, 10001)]
    nodes[4000] = ("n04001", 4001, "dispatched")
    text = render_dashboard({"huge": make_status("huge", "running", nodes)})

    assert text.count(":::") == 3
    assert len(text) < 3000


def test_same_statuses_give_the_same_bytes_in_any_order() -> None:
    forward = render_dashboard(ALL)
    backward = render_dashboard(dict(reversed(list(ALL.items()))))

    assert forward == backward
    assert forward.encode() == render_dashboard(dict(ALL)).encode()


def test_no_rollouts_and_hostile_text_render_safely() -> None:
    assert "No rollouts yet" in render_dashboard({})
    nasty = make_status("x", "paused", [("a", 1, "failed")], hold="health_failed")
    assert nasty.hold is not None
    hold = replace(nasty.hold, message='boom | <script>"x"</script>\nsecond line')
    text = render_dashboard({"x": replace(nasty, hold=hold)})
    assert "<script>" not in text
    assert "boom \\| \\<script\\>" in text
    assert "second line" in text.split("## Needs attention")[1].splitlines()[2]


# --- what a person must see first ------------------------------------------------


def test_a_long_agent_error_is_clipped_and_the_instruction_kept() -> None:
    held = make_status("x", "paused", [("gpu-a4", 1, "failed")], hold="health_failed")
    assert held.hold is not None
    message = hold_message("health_failed", rollout="x", nodes=["gpu-a4"], error="disk full " * 80)
    page = render_dashboard({"x": replace(held, hold=replace(held.hold, message=message))})

    [line] = [ln for ln in page.splitlines() if ln.startswith("- 🛑 **x**")]
    assert plain_text(line).endswith(
        "; to try it again: reconciler resume x --push; to give up on it: reconciler skip x "
        "gpu-a4 --push; to end the rollout: reconciler abort x --push."
    )
    assert plain_text(line).count("gpu-a4") == 2  # named once, and in the skip command


def test_pending_rollouts_a_person_must_unblock_are_explained() -> None:
    no_nodes = make_status(
        "empty", "pending", reason="no_nodes", message="the selection matches no node"
    )
    invalid = make_status("broken", "pending", reason="invalid", message="invalid rollout file")
    page = render_dashboard({s.name: s for s in (no_nodes, invalid, WAITING)})

    attention = plain_text(page.split("## Needs attention")[1])
    assert "empty pending no_nodes: the selection matches no node." in attention
    assert "broken pending invalid: invalid rollout file." in attention
    # waiting for another rollout to end needs nobody
    assert "phi-next pending" not in attention


def test_the_hold_icon_tells_a_failure_from_a_planned_pause() -> None:
    planned = make_status("planned", "paused", [("a", 1, "succeeded")], hold="pause_after_batch")
    failing = make_status("failing", "paused", [("b", 1, "failed")], hold="health_failed")
    unknown = make_status("silent", "paused", [("c", 1, "unknown")], hold="health_unknown")
    table = rows(render_dashboard({s.name: s for s in (planned, failing, unknown)}))

    assert table["planned"][0].startswith("⏸️ paused")
    assert table["failing"][0].startswith("🛑 paused")
    assert table["silent"][0].startswith("❓ paused")


def test_a_long_name_keeps_its_link_target_and_cells_do_not_wrap() -> None:
    name = "a" * 30 + "-" + "b" * 32  # 63 characters, the longest a name can be
    page = render_dashboard({name: replace(DONE, name=name)})

    [row] = [ln for ln in page.splitlines() if ln.startswith("| [")]
    link_text = row[3 : row.index("]")]
    assert len(link_text) <= 40 and link_text.endswith("…")
    assert f"]({name}.yaml)" in row
    cells = row.split("|")
    assert " " not in cells[3].strip("` ")  # the bar and its count
    assert " " not in cells[6].strip()  # the date


def test_mermaid_keeps_the_table_order_neutral_boxes_and_marks_failures() -> None:
    text = render_dashboard(ALL)
    diagram = text.split("```mermaid\n")[1].split("```")[0]

    # llama-canary comes first in the table and at the top of the diagram
    assert diagram.index('subgraph r1["llama-canary') < diagram.index('subgraph r2["qwen-wide')
    assert "  r1 ~~~ r2\n" in diagram
    assert "  style r1 fill:#ffffff,stroke:#d0d7de,color:#24292f\n" in diagram
    assert "  style r2 fill:#ffffff,stroke:#d0d7de,color:#24292f\n" in diagram
    assert "✗1 failed" in diagram and ":::failed" in diagram


def test_kept_rows_told_which_rollouts_changed_draw_what_drawing_every_row_does() -> None:
    # The daemon hands its DashboardOrder the rollouts whose status may have
    # changed since the last drawing; the others are not looked at. Over
    # random changes (rollouts added, removed, changed to another phase,
    # hold or note), the text is the text drawn from every status.
    rng = random.Random(20)
    shapes = [DONE, WIDE, WAITING, CANARY, replace(DONE, phase="aborted")]
    names = [f"r{i:02d}" for i in range(30)]
    order = DashboardOrder()
    current: dict[str, RolloutStatus] = {}
    for step in range(200):
        touched = set(rng.sample(names, rng.randint(0, 4)))
        for name in touched:
            if name in current and rng.random() < 0.3:
                del current[name]
            else:
                current[name] = replace(rng.choice(shapes), name=name)
        assert render_dashboard(current, order, touched) == render_dashboard(current), step


def test_the_kept_rows_in_blocks_are_the_text_and_only_changed_blocks_are_new() -> None:
    # The daemon writes the dashboard from its parts: the table's rows
    # encoded in blocks kept from call to call. Over random changes among
    # 2,000 rollouts, the parts joined are the bytes of the text drawn from
    # every status, and a changed rollout makes at most three blocks new
    # (its old block, and its new one split at its row), the others being
    # the very objects of the call before.
    rng = random.Random(21)
    shapes = [DONE, WIDE, WAITING, CANARY, replace(DONE, phase="aborted")]
    current = {f"r{i:04d}": replace(DONE, name=f"r{i:04d}") for i in range(2000)}
    order = DashboardOrder()
    before = dashboard_parts(current, order, None)
    assert len(before.blocks) > 10
    for step in range(40):
        touched = set(rng.sample(sorted(current), rng.randint(1, 3)))
        for name in touched:
            if rng.random() < 0.2:
                del current[name]
            else:
                current[name] = replace(rng.choice(shapes), name=name)
        if rng.random() < 0.2:
            new = f"r{2000 + step:04d}"
            current[new] = replace(rng.choice(shapes), name=new)
            touched.add(new)
        parts = dashboard_parts(current, order, touched)
        assert b"".join(parts.pieces()) == render_dashboard(current).encode(), step
        assert all(block and not block.endswith(b"\n") for block in parts.blocks)
        kept = {id(block) for block in before.blocks}
        assert sum(id(block) not in kept for block in parts.blocks) <= 3 * len(touched), step
        before = parts


@given(
    st.text(alphabet="ab\n", max_size=6),
    st.lists(st.text(alphabet="|x\n", min_size=1, max_size=4).map(lambda t: t + "|"), max_size=3),
    st.text(alphabet="ab\n", max_size=6),
    st.text(alphabet="c\n", max_size=4),
)
def test_parts_extended_are_the_text_stripped_and_extended(
    head: str, rows: list[str], tail: str, more: str
) -> None:
    # A section appended after the text with its trailing newlines
    # stripped, as the daemon appends the fleet's, changes only the tail
    # (a block ends in a row, never in a newline).
    parts = DashboardParts(head, tuple(row.encode() for row in rows), tail)
    assert parts.extended(more).text() == parts.text().rstrip("\n") + more
    assert parts.extended(more).blocks == parts.blocks or not parts.blocks
