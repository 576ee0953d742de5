"""``reconciler status``: what an operator reads, from the committed status
files of a real repository (bare, working clone, remote-like origin)."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest

from reconciler.cli import main as cli
from reconciler.cli.commands.status import use_colour
from reconciler.spec.rollout_status import Condition, RollbackNode, RollbackRecord, to_record
from reconciler.text import status_text as status_view
from tests.kit.documents import T0, make_status, status_text
from tests.kit.git import commit, git, make_repo

ANSI = re.compile(r"\x1b\[[0-9;]*m")
NOW = T0 + timedelta(minutes=7)

CANARY_NODES = [
    ("gpu-a1", 1, "succeeded"),
    ("gpu-a2", 2, "failed"),
    ("gpu-a3", 3, "pending"),
    ("gpu-a4", 4, "pending"),
]


def canary() -> status_view.RolloutStatus:
    return make_status(
        "llama-canary",
        "paused",
        CANARY_NODES,
        hold="health_failed",
        hold_nodes=["gpu-a2"],
        transitions=[("pending", "running", "started"), ("running", "paused", "health_failed")],
        conditions=(Condition("frozen_fields_changed", "batchSize changed after start", T0),),
        rollbacks=(
            RollbackRecord(
                "r1",
                "Alice <alice@example.com>",
                T0,
                "done",
                nodes=(RollbackNode("gpu-a2", "rolled_back"),),
            ),
        ),
        last_handled_resume="2026-12-01T08:00:00Z bob: retry",
    )


def finished() -> status_view.RolloutStatus:
    return make_status(
        "mistral-wide",
        "completed",
        [("gpu-b1", 1, "succeeded"), ("gpu-b2", 1, "succeeded")],
        batch_size=2,
        transitions=[("running", "completed", "all_succeeded")],
    )


def waiting() -> status_view.RolloutStatus:
    return make_status("qwen-next", "pending", reason="overlap", message="shares gpu-a3")


STATUSES = {s.name: s for s in (finished(), waiting(), canary())}


# -- rendering -------------------------------------------------------------------


def test_table_has_one_line_per_rollout_held_first_within_80_columns() -> None:
    text = status_view.render_table(STATUSES, NOW)

    lines = text.splitlines()
    assert lines[0].split() == ["ROLLOUT", "PHASE", "PROGRESS", "BATCH", "AGE", "HOLD/REASON"]
    assert [line.split()[0] for line in lines[1:]] == ["llama-canary", "qwen-next", "mistral-wide"]
    assert all(len(line) <= 80 for line in lines)
    assert not ANSI.search(text)
    canary_line = lines[1]
    assert "paused" in canary_line
    assert "██░░░░░░░░ 1/4 ✗1" in canary_line
    assert " 2/4 " in canary_line  # the batch in progress
    assert "7m" in canary_line  # since the last transition
    assert canary_line.endswith("health_failed")
    assert lines[2].endswith("overlap")
    assert "██████████ 2/2" in lines[3]


def test_table_colours_phases_only_when_asked() -> None:
    coloured = status_view.render_table(STATUSES, NOW, colour=True)
    assert "\x1b[33mpaused" in coloured
    assert ANSI.sub("", coloured) == status_view.render_table(STATUSES, NOW)


def test_detail_shows_every_node_the_hold_conditions_rollbacks_and_transitions() -> None:
    text = status_view.render_detail(canary(), NOW)

    assert text.startswith("llama-canary  paused  since 2026-12-01T09:00:00Z (7m ago)")
    assert "target    hermes ollama/llama3.1-8b (profile default)" in text
    assert "mode      LIVE, onFailure pause, batchSize 1" in text
    assert "hold      health_failed since 2026-12-01T09:00:00Z" in text
    assert "gpu-a2: health_failed" in text
    for name, batch, state in CANARY_NODES:
        assert re.search(rf"^{name}\s+{batch}\s+{state}\s", text, re.M), name
    assert re.search(r"^gpu-a2\s+2\s+failed\s+1\s+failed\s+agent: exit 1$", text, re.M)
    assert "frozen_fields_changed" in text and "batchSize changed after start" in text
    assert "r1  done  by Alice <alice@example.com>" in text
    assert "gpu-a2: rolled_back" in text
    assert "running -> paused  health_failed" in text
    assert "last resume handled: 2026-12-01T08:00:00Z bob: retry" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_detail_draws_long_runs_of_batches_as_ranges() -> None:
    nodes = [(f"n{i:04d}", i, "succeeded" if i <= 500 else "pending") for i in range(1, 1001)]
    nodes[500] = ("n0501", 501, "dispatched")
    text = status_view.render_detail(make_status("big", "running", nodes), NOW)

    batch_section = text.split("batches\n")[1].split("\n\n")[0].splitlines()
    assert [line.split()[:2] for line in batch_section] == [
        ["1-500", "done"],
        ["501", "running"],
        ["502-1000", "pending"],
    ]


def test_colour_only_on_a_terminal_and_never_with_no_color(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Terminal:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert use_colour(Terminal())
    assert not use_colour(object())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_colour(Terminal())


# -- reading from Git ------------------------------------------------------------


@pytest.fixture
def origin(tmp_path: Path, identity: dict[str, str]) -> Path:
    """A bare origin holding the three statuses, as the daemon leaves it."""
    work = make_repo(
        tmp_path / "seed",
        {
            "rollouts/.keep": "",
            **{p: t for s in STATUSES.values() for p, t in status_text(s).items()},
        },
    )
    bare = tmp_path / "fleet.git"
    git("clone", "--quiet", "--bare", str(work), str(bare), cwd=tmp_path)
    return bare


def test_status_lists_rollouts_from_a_bare_repository(
    origin: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["status", "--repo", str(origin)]) == 0

    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()[1:]] == [
        "llama-canary",
        "qwen-next",
        "mistral-wide",
    ]
    assert not ANSI.search(out)  # not a terminal


def test_status_of_one_rollout_and_json(origin: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "llama-canary", "--repo", str(origin)]) == 0
    assert "gpu-a2" in capsys.readouterr().out

    assert cli.main(["status", "llama-canary", "--repo", str(origin), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(to_record(canary())))

    assert cli.main(["status", "--repo", str(origin), "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["metadata"]["name"] for r in records] == ["llama-canary", "mistral-wide", "qwen-next"]


def test_status_active_leaves_out_finished_rollouts_newest_first(
    origin: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["status", "--repo", str(origin), "--active"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    # llama-canary's latest transition is newer than qwen-next's (it has none)
    assert [line.split()[0] for line in rows] == ["llama-canary", "qwen-next"]

    assert cli.main(["status", "--repo", str(origin), "--active", "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["metadata"]["name"] for r in records] == ["llama-canary", "qwen-next"]


def test_status_active_says_so_when_every_rollout_has_finished(
    tmp_path: Path, identity: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    work = make_repo(tmp_path / "seed", {"rollouts/.keep": "", **status_text(finished())})

    assert cli.main(["status", "--repo", str(work), "--active"]) == 0

    assert capsys.readouterr().out == (
        "no active rollouts (every rollout with a status has finished)\n"
    )


def test_status_of_an_unknown_rollout_fails_and_names_the_known_ones(
    origin: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["status", "nope", "--repo", str(origin)]) == 1
    assert "llama-canary, mistral-wide, qwen-next" in capsys.readouterr().out


def test_a_working_clone_reads_its_origin_not_its_stale_branch(
    origin: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "mine"
    git("clone", "--quiet", str(origin), str(mine), cwd=tmp_path)
    # the daemon (here: another clone) pushes a newer status; `mine` is not pulled
    other = tmp_path / "other"
    git("clone", "--quiet", str(origin), str(other), cwd=tmp_path)
    done = make_status("qwen-next", "aborted", reason="operator_aborted")
    commit(other, status_text(done), "status: qwen-next aborted")
    git("push", "--quiet", "origin", "main", cwd=other)

    assert cli.main(["status", "qwen-next", "--repo", str(mine)]) == 0

    assert capsys.readouterr().out.startswith("qwen-next  aborted")


def test_a_repository_without_origin_is_read_at_its_branch(
    tmp_path: Path, identity: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    alone = make_repo(tmp_path / "alone", status_text(finished()))
    (alone / "status/mistral-wide.yaml").write_text("uncommitted edits do not count\n")

    assert cli.main(["status", "--repo", str(alone / "status")]) == 0

    assert "mistral-wide completed" in " ".join(capsys.readouterr().out.split())


def test_status_follows_the_status_branch_of_the_settings(
    tmp_path: Path, identity: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    repo = make_repo(
        tmp_path / "repo",
        {
            "reconciler.yaml": "apiVersion: reconciler/v1\nkind: Settings\n"
            "spec: {statusBranch: fleet-status}\n"
        },
    )
    git("checkout", "--quiet", "--orphan", "fleet-status", cwd=repo)
    git("rm", "--quiet", "-rf", ".", cwd=repo)
    commit(repo, status_text(canary()), "status")
    git("checkout", "--quiet", "main", cwd=repo)

    assert cli.main(["status", "--repo", str(repo)]) == 0

    assert "llama-canary" in capsys.readouterr().out


def test_status_reads_node_pages_of_a_large_rollout(
    tmp_path: Path, identity: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = [(f"n{i:03d}", (i - 1) // 50 + 1, "succeeded") for i in range(1, 251)]
    big = make_status("big", "completed", nodes, batch_size=50)
    files = status_text(big)
    assert "status/big/nodes-0002.yaml" in files
    repo = make_repo(tmp_path / "repo", files)

    assert cli.main(["status", "--repo", str(repo), "big"]) == 0

    out = capsys.readouterr().out
    assert "250/250" in out
    assert re.search(r"^n250\s+5\s+succeeded", out, re.M)


def test_a_scheduled_rollout_says_when_it_starts_and_has_no_progress_yet() -> None:
    later = make_status(
        "qwen-serving", "scheduled", reason="start_at", scheduled_for=T0 + timedelta(days=1)
    )

    [line] = status_view.render_table({"q": later}, NOW).splitlines()[1:]

    assert line.split()[:4] == ["qwen-serving", "scheduled", "-", "-"]
    assert line.endswith("starts 2026-12-02 09:00Z")
