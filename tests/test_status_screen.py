"""``reconciler status`` and ``status NAME`` with 10,000 nodes, as a person
sees them: on an 80x24 and a 200-column terminal (tmux, so the terminal
wraps and scrolls as a real one does), nothing wraps badly and the useful
part comes first: the hold reason whole, the summary and the hold before
the node list, the nodes in trouble first."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reconciler.cli.commands.status import fit_screen
from reconciler.text import status_text as view
from tests.kit.documents import make_status, status_text
from tests.kit.git import make_repo

NOW = datetime(2026, 12, 1, 14, 0, tzinfo=UTC)
NAME = "llama-3-1-70b-instruct-wide-rollout-over-the-whole-gpu-fleet-01"  # 63 characters
ERROR = "job failed: exit 1: disk full on /var/lib/ollama (wrote 0 of 4.1 GB); see journalctl"


def big() -> view.RolloutStatus:
    nodes = [
        (
            f"gpu-node-{i:05d}",
            (i - 1) // 500 + 1,
            "succeeded"
            if i <= 4000
            else "failed"
            if i in (4001, 4007)
            else "dispatched"
            if i <= 4500
            else "pending",
        )
        for i in range(1, 10_001)
    ]
    status = make_status(
        NAME,
        "paused",
        nodes,
        hold="rollback_unavailable",
        hold_nodes=["gpu-node-04001", "gpu-node-04007"],
        batch_size=500,
        transitions=[("pending", "running", "started"), ("running", "paused", "health_failed")],
    )
    return replace(
        status,
        nodes=tuple(replace(n, error=ERROR) if n.state == "failed" else n for n in status.nodes),
    )


def small() -> view.RolloutStatus:
    return make_status(
        "mistral-canary",
        "running",
        [("gpu-a1", 1, "succeeded"), ("gpu-a2", 2, "dispatched")],
        transitions=[("pending", "running", "started")],
    )


def test_the_table_keeps_the_hold_reason_whole_at_80_columns() -> None:
    text = view.render_table({NAME: big(), "mistral-canary": small()}, NOW, width=80)

    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert lines[1].endswith(" rollback_unavailable")
    assert lines[1].startswith(NAME[:12])  # the name gives way to the reason


def test_the_table_shows_a_whole_name_at_200_columns() -> None:
    text = view.render_table({NAME: big(), "mistral-canary": small()}, NOW, width=200)

    assert text.splitlines()[1].startswith(NAME + " ")
    assert all(len(line) <= 200 for line in text.splitlines())


def test_the_detail_puts_the_summary_first_and_the_nodes_in_trouble_first() -> None:
    text = view.render_detail(big(), NOW)

    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert lines[0] == f"{NAME}  paused"  # the time goes below a long name
    assert lines[1].startswith("  since     2026-12-01T09:00:00Z")
    table = lines.index(next(line for line in lines if line.startswith("NODE ")))
    assert lines.index(next(line for line in lines if line.startswith("  hold "))) < table
    assert lines[table + 1].startswith("gpu-node-04001      9  failed")
    assert lines[table + 1].endswith("disk")  # the error wraps at a word
    assert lines[table + 2].strip() == "full on /var/lib/ollama"


def test_watch_fits_the_screen_and_says_what_it_left_out() -> None:
    text = "\n".join(f"line {i}" for i in range(100)) + "\n"

    fitted = fit_screen(text, 24).splitlines()
    assert len(fitted) == 20  # and the footer: a blank line, two lines, the cursor's line
    assert fitted[0] == "line 0"
    assert fitted[-1] == "… 81 more lines: run it without --watch to see them all"
    assert fit_screen("a\nb\n", 24) == "a\nb\n"


# --- through tmux -----------------------------------------------------------------

TMUX = shutil.which("tmux")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    files: dict[str, str] = {}
    for status in (big(), small()):
        files.update(status_text(status))
    return make_repo(tmp_path / "fleet", files)


def screen(tmp_path: Path, columns: int, rows: int, *argv: str) -> list[str]:
    """What a ``columns`` x ``rows`` terminal shows while ``argv`` runs."""
    if TMUX is None:
        if os.environ.get("CI"):
            pytest.fail("tmux is missing: .ci/run installs it")
        pytest.skip("tmux is not installed (apt-get install tmux)")
    socket = str(tmp_path / "tmux.sock")
    command = " ".join([sys.executable, "-m", "reconciler", *argv])
    subprocess.run(
        [TMUX, "-S", socket, "new-session", "-d", "-x", str(columns), "-y", str(rows), command],
        check=True,
        env={
            **{k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")},
            "TERM": "xterm-256color",
        },
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            shown = subprocess.run(
                [TMUX, "-S", socket, "capture-pane", "-p"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.splitlines()
            if any("Ctrl-C to stop" in line for line in shown) or time.monotonic() > deadline:
                return shown
            time.sleep(0.2)
    finally:
        subprocess.run([TMUX, "-S", socket, "kill-server"], check=False)


@pytest.mark.slow
@pytest.mark.parametrize(("columns", "rows"), [(80, 24), (200, 50)])
def test_status_watch_on_a_terminal(repo: Path, tmp_path: Path, columns: int, rows: int) -> None:
    shown = screen(tmp_path, columns, rows, "status", "--watch", "--repo", str(repo))

    assert shown[0].startswith("ROLLOUT")
    assert shown[1].endswith(" rollback_unavailable")
    if columns == 200:
        assert shown[1].startswith(NAME + " ")
    assert shown[2].startswith("mistral-cana")
    assert any("Ctrl-C to stop" in line for line in shown)


@pytest.mark.slow
@pytest.mark.parametrize(("columns", "rows"), [(80, 24), (200, 50)])
def test_status_name_watch_on_a_terminal(
    repo: Path, tmp_path: Path, columns: int, rows: int
) -> None:
    shown = screen(tmp_path, columns, rows, "status", NAME, "--watch", "--repo", str(repo))

    assert shown[0] == f"{NAME}  paused"  # the top is on the screen, not scrolled away
    assert any(line.startswith("  hold      rollback_unavailable") for line in shown)
    assert any(line.startswith("batches") for line in shown)
    assert any("more lines: run it without --watch" in line for line in shown)
    assert "Ctrl-C to stop" in shown[-2] or "Ctrl-C to stop" in shown[-3]
    if rows == 50:
        assert any(line.startswith("gpu-node-04001      9  failed") for line in shown)
