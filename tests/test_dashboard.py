"""``status/README.md``: one row per rollout and a Mermaid diagram of the
active ones, the same bytes for the same statuses."""

from __future__ import annotations

import random
import re
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from reconciler.engine.holds import hold_message
from reconciler.spec.compare import FiringAlert, Measured
from reconciler.spec.rollout_status import CheckOutcome, Condition, RolloutStatus, Waiting
from reconciler.text.dashboard import (
    DashboardOrder,
    DashboardParts,
    dashboard_parts,
    render_dashboard,
)
from tests.kit.documents import make_status
from tests.markdown_render import constructs, plain_text

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


# --- comparisons and alerts ------------------------------------------------------


def measured(canary: float, baseline: float, change: float, p: float | None) -> Measured:
    return Measured("median", canary, 13, baseline, 26, ("gpu-c3", "gpu-c4"), change, p)


def compared() -> RolloutStatus:
    """A running rollout whose first batch (two nodes) is decided: its
    comparisons passed and failed, and an agent check that is no comparison."""
    status = make_status(
        "canary",
        "running",
        [("gpu-c1", 1, "succeeded"), ("gpu-c2", 1, "failed"), ("gpu-c3", 2, "pending")],
        transitions=[("pending", "running", "started")],
    )
    rate = Measured("rate", 0.02, 10, 0.001, 20, ("gpu-c3",), 0.019, 1.5e-9)
    checks = {
        "gpu-c1": (
            CheckOutcome("latency-p95", True, "median 0.103 …", measured(0.103, 0.1, 0.03, 0.02)),
            CheckOutcome("errors", True, "rate …", replace(rate, canary=0.0011, change=0.0001)),
        ),
        "gpu-c2": (
            CheckOutcome("latency-p95", False, "median 0.13 …", measured(0.13, 0.1, 0.3, 1.2e-5)),
            CheckOutcome("disk", False, "agent check failed"),  # not a comparison
        ),
    }
    nodes = tuple(replace(n, checks=checks.get(n.name, ())) for n in status.nodes)
    return replace(status, nodes=nodes)


def comparison_rows(text: str) -> list[list[str]]:
    section = text.split("## Comparisons")[1].split("\n## ")[0]
    lines = [line for line in section.splitlines() if line.startswith("| **")]
    return [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines]


def test_every_decided_comparison_of_the_batch_is_shown_with_its_numbers() -> None:
    text = render_dashboard({"canary": compared(), **ALL})

    table = comparison_rows(text)
    assert [row[1:4] for row in table] == [
        ["gpu-c2", "latency-p95", "❌ failed"],  # failed first
        ["gpu-c1", "latency-p95", "✅ passed"],
        ["gpu-c1", "errors", "✅ passed"],
    ]
    failed = table[0]
    assert failed[4:] == [
        "median 0.13 (13 samples)",
        "median 0.1 (26 samples), 2 nodes",
        "+30.0%",
        "1.2e-05",
    ]
    assert table[2][4:] == [
        "rate 0.110% (10 steps)",
        "rate 0.100% (20 steps), 1 node",
        "+0.01 points",
        "1.5e-09",
    ]
    assert "disk" not in text.split("## Comparisons")[1]
    assert constructs(text.split("## Comparisons")[1].split("\n## ")[0])["table_open"] == 1


def test_a_batch_without_decided_comparisons_has_no_comparisons_section() -> None:
    assert "## Comparisons" not in render_dashboard(ALL)


def test_an_inconclusive_comparison_and_a_long_batch_say_so() -> None:
    status = compared()
    inconclusive = CheckOutcome("latency-p95", False, "inconclusive", measured(0.1, 0.1, 0, None))
    many = tuple(
        replace(status.nodes[0], name=f"gpu-x{i:02d}", checks=(inconclusive,)) for i in range(25)
    )
    text = render_dashboard({"canary": replace(status, nodes=many)})

    table = comparison_rows(text)
    assert len(table) == 21 and table[0][3] == "❔ unknown" and table[0][7] == ""
    assert "and 5 more of batch 1" in table[-1][1]


def test_an_alert_wait_names_the_alerts_and_alertmanager_unreachable_says_so() -> None:
    hot = FiringAlert("GpuHot", (("severity", "page"),), "2026-12-01T09:00:00Z")
    nasty = FiringAlert("<b>x</b>|y", (), "2026-12-01T09:05:00Z")
    firing = replace(WIDE, waiting=Waiting("alert_firing", None, (hot, nasty)))
    gone = replace(WIDE, name="gone", waiting=Waiting("alertmanager_unreachable", None))
    text = render_dashboard({"qwen-wide": firing, "gone": gone})

    assert rows(text)["qwen-wide"][3] == "`alert_firing`"
    assert rows(text)["gone"][3] == "`alertmanager_unreachable`"
    attention = text.split("## Needs attention")[1].split("\n## ")[0]
    line = next(x for x in attention.splitlines() if "qwen-wide" in x)
    assert plain_text(line) == (
        "⏳ qwen-wide waiting alert_firing: GpuHot (firing since 2026-12-01T09:00:00Z), "
        "<b>x</b>|y (firing since 2026-12-01T09:05:00Z); the next batch starts by itself "
        "once the alert resolves or is silenced."
    )
    assert "<b>" not in text
    line = next(x for x in attention.splitlines() if "gone" in x)
    assert "waiting `alertmanager_unreachable`: no new batch until Alertmanager answers" in line
