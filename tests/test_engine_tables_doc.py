"""The state diagrams and policy table of docs/rollouts.md are generated
from the engine's own tables; this keeps the copy on that page current."""

from __future__ import annotations

from pathlib import Path

from reconciler.engine.lifecycle import render_engine_tables, render_state_diagram
from reconciler.engine.policy import render_policy_table

ROLLOUTS_PAGE = Path(__file__).parent.parent / "docs/rollouts.md"
BEGIN, END = "<!-- engine-tables:begin -->", "<!-- engine-tables:end -->"


def test_rollouts_page_block_matches_the_engine_tables() -> None:
    text = ROLLOUTS_PAGE.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, (
        f"docs/rollouts.md needs a block between {BEGIN} and {END}"
    )
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]

    assert block.strip() == render_engine_tables().strip(), (
        "docs/rollouts.md is out of date: replace the engine-tables block with "
        "`python -c 'from reconciler.engine.lifecycle import render_engine_tables as r; print(r())'`"
    )


def test_policy_table_has_a_row_per_verdict_and_a_column_per_policy() -> None:
    lines = render_policy_table().splitlines()

    assert lines[0] == "| verdict | observe | pause (default) | retry_once | stop | rollback |"
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["passed", "failed", "unknown"]
    assert "hold `retry_exhausted`" in lines[3] and "hold `rollback_unavailable`" in lines[3]


def test_state_diagram_lists_every_phase() -> None:
    diagram = render_state_diagram()

    for phase in ("pending", "scheduled", "running", "paused", "completed", "failed", "aborted"):
        assert phase in diagram
    assert diagram.count("```mermaid") == 2
