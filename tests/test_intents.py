"""pause, resume and abort edit the rollout file in a working tree: only the
line that carries the intent changes, and nonsense is refused."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest

from reconciler.cli import main as cli
from reconciler.cli.intent_edits import set_spec_fields
from tests.kit.documents import make_status, node_yaml, status_text
from tests.kit.git import commit, git, make_repo

ROLLOUT = """\
# Canary of llama 3.1 on the lab GPUs; owner: ml-platform.
apiVersion: reconciler/v1
kind: Rollout
metadata: {name: llama-canary}
spec:
  target: {runtime: hermes, provider: ollama, model: "llama3.1-8b", profile: default}
  selector: {role: canary}     # the two lab boxes
  batchSize: 1
  live: true
  onFailure:   pause           # a person looks first
  pauseAfter:
    - 1
  startAt: '2026-12-01T09:00:00Z'
  # operator intents, edited through pull requests
  paused: false   # flip to pause
  resumeRequest: 'earlier token'
  skipNodes: []
  # rollbackRequest: {id: r1, nodes: all}
"""

BARE_ROLLOUT = """\
apiVersion: reconciler/v1
kind: Rollout
metadata:
  name: mistral-wide
spec:
  target:
    runtime: hermes
    provider: ollama
    model: mistral-7b
  nodeIds:
  - gpu-a1
  - gpu-a2
  # nothing about intents yet
"""


def status_files(
    name: str, phase: str, hold: str | None = None, operator_paused: bool = False
) -> dict[str, str]:
    """The status files the daemon would have committed next to the rollout."""
    nodes = [("gpu-a1", 1, "succeeded"), ("gpu-a2", 2, "failed" if hold else "succeeded")]
    status = make_status(
        name,
        phase,
        nodes,
        hold=hold,
        hold_nodes=["gpu-a2"] if hold else [],
        operator_paused=operator_paused,
    )
    return status_text(status)


@pytest.fixture
def fleet(tmp_path: Path, identity: dict[str, str]) -> Path:
    return make_repo(
        tmp_path / "fleet",
        {
            "nodes/gpu-a1.yaml": node_yaml("gpu-a1", maintenance=None),
            "nodes/gpu-a2.yaml": node_yaml("gpu-a2", maintenance=None),
            "rollouts/llama-canary.yaml": ROLLOUT,
            "rollouts/mistral-wide.yaml": BARE_ROLLOUT,
        },
    )


def changed_lines(before: str, after: str) -> tuple[list[str], list[str]]:
    """(removed, added) lines of a unified diff."""
    diff = list(difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0))
    removed = [d[1:] for d in diff if d.startswith("-") and not d.startswith("---")]
    added = [d[1:] for d in diff if d.startswith("+") and not d.startswith("+++")]
    return removed, added


def reconcile(*argv: str) -> int:
    return cli.main(list(argv))


def read(fleet: Path, name: str = "llama-canary") -> str:
    return (fleet / "rollouts" / f"{name}.yaml").read_text()


# -- pause -----------------------------------------------------------------


def test_pause_changes_only_the_paused_line(fleet: Path) -> None:
    assert reconcile("pause", "llama-canary", "--repo", str(fleet)) == 0

    removed, added = changed_lines(ROLLOUT, read(fleet))
    assert removed == ["  paused: false   # flip to pause"]
    assert added == ["  paused: true   # flip to pause"]


def test_pause_adds_the_key_under_spec_when_absent(fleet: Path) -> None:
    assert reconcile("pause", "mistral-wide", "--repo", str(fleet)) == 0

    after = read(fleet, "mistral-wide")
    removed, added = changed_lines(BARE_ROLLOUT, after)
    assert removed == []
    assert added == ["  paused: true"]
    # under spec, after its last entry, before the trailing comment
    assert "  - gpu-a2\n  paused: true\n  # nothing about intents yet\n" in after


def test_pause_twice_changes_nothing(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert reconcile("pause", "llama-canary", "--repo", str(fleet)) == 0
    once = read(fleet)
    assert reconcile("pause", "llama-canary", "--repo", str(fleet)) == 0
    assert read(fleet) == once
    assert "nothing to change" in capsys.readouterr().out


def test_pause_works_from_a_subdirectory_of_the_clone(fleet: Path) -> None:
    assert reconcile("pause", "llama-canary", "--repo", str(fleet / "nodes")) == 0
    assert "  paused: true   # flip to pause" in read(fleet)


# -- abort -----------------------------------------------------------------


def test_abort_adds_one_line_and_keeps_everything_else(fleet: Path) -> None:
    assert reconcile("abort", "llama-canary", "--repo", str(fleet)) == 0

    removed, added = changed_lines(ROLLOUT, read(fleet))
    assert removed == []
    assert added == ["  abort: true"]


def test_abort_of_a_finished_rollout_is_refused(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit(fleet, status_files("llama-canary", "completed"), "status")

    assert reconcile("abort", "llama-canary", "--repo", str(fleet)) == 1

    assert read(fleet) == ROLLOUT
    assert "llama-canary is completed" in capsys.readouterr().err


def test_unknown_rollout_is_refused_with_the_ones_that_exist(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert reconcile("abort", "llama-canery", "--repo", str(fleet)) == 1

    err = capsys.readouterr().err
    assert "no rollout named 'llama-canery'" in err
    assert "llama-canary, mistral-wide" in err


def test_a_directory_without_rollouts_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert reconcile("pause", "x", "--repo", str(tmp_path)) == 1
    assert "not a fleet working tree" in capsys.readouterr().err


# -- resume ----------------------------------------------------------------


def test_resume_answers_a_policy_hold_and_lifts_the_pause(fleet: Path) -> None:
    (fleet / "rollouts/llama-canary.yaml").write_text(
        ROLLOUT.replace("paused: false", "paused: true")
    )
    commit(
        fleet,
        status_files("llama-canary", "paused", "health_failed", operator_paused=True),
        "pause",
    )
    before = read(fleet)

    code = reconcile("resume", "llama-canary", "--repo", str(fleet), "--message", "checked gpu-a2")

    assert code == 0
    removed, added = changed_lines(before, read(fleet))
    assert removed == ["  paused: true   # flip to pause", "  resumeRequest: 'earlier token'"]
    assert added[0] == "  paused: false   # flip to pause"
    # a fresh token: time, person, why; the single quotes of the file are kept
    assert re.fullmatch(
        r"  resumeRequest: '\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ Alice Operator: checked gpu-a2'",
        added[1],
    ), added[1]


def test_resume_of_an_operator_pause_only_flips_paused(fleet: Path) -> None:
    (fleet / "rollouts/llama-canary.yaml").write_text(
        ROLLOUT.replace("paused: false", "paused: true")
    )
    commit(
        fleet,
        status_files("llama-canary", "paused", "operator_paused", True),
        "pause",
    )
    before = read(fleet)

    assert reconcile("resume", "llama-canary", "--repo", str(fleet)) == 0

    removed, added = changed_lines(before, read(fleet))
    assert removed == ["  paused: true   # flip to pause"]
    assert added == ["  paused: false   # flip to pause"]


def test_resume_adds_a_request_when_the_key_is_absent(fleet: Path) -> None:
    commit(
        fleet,
        status_files("mistral-wide", "paused", "pause_after_batch"),
        "status",
    )

    assert reconcile("resume", "mistral-wide", "--repo", str(fleet), "-m", "batch 1 ok") == 0

    removed, added = changed_lines(BARE_ROLLOUT, read(fleet, "mistral-wide"))
    assert removed == []
    assert len(added) == 1
    assert added[0].startswith('  resumeRequest: "20')
    assert added[0].endswith(' Alice Operator: batch 1 ok"')


def test_resume_with_nothing_held_and_not_paused_is_refused(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit(fleet, status_files("llama-canary", "running"), "status")

    assert reconcile("resume", "llama-canary", "--repo", str(fleet)) == 1

    assert read(fleet) == ROLLOUT
    assert "nothing to resume: llama-canary is running" in capsys.readouterr().err


def test_resume_of_a_finished_rollout_is_refused(fleet: Path) -> None:
    commit(fleet, status_files("llama-canary", "aborted"), "status")
    assert reconcile("resume", "llama-canary", "--repo", str(fleet)) == 1
    assert read(fleet) == ROLLOUT


# -- skip ------------------------------------------------------------------


def test_skip_adds_the_nodes_to_skip_nodes_and_changes_only_that_line(fleet: Path) -> None:
    assert reconcile("skip", "llama-canary", "gpu-a2", "--repo", str(fleet)) == 0

    removed, added = changed_lines(ROLLOUT, read(fleet))
    assert removed == ["  skipNodes: []"]
    assert added == ["  skipNodes: [gpu-a2]"]
    assert reconcile("validate", str(fleet)) == 0


def test_skip_keeps_the_names_already_there_and_adds_the_key_when_absent(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert reconcile("skip", "mistral-wide", "gpu-a1", "--repo", str(fleet)) == 0
    assert reconcile("skip", "mistral-wide", "gpu-a2", "gpu-a1", "--repo", str(fleet)) == 0

    removed, added = changed_lines(BARE_ROLLOUT, read(fleet, "mistral-wide"))
    assert removed == [] and added == ["  skipNodes: [gpu-a1, gpu-a2]"]
    assert "already in spec.skipNodes: gpu-a1" in capsys.readouterr().out
    assert reconcile("skip", "mistral-wide", "gpu-a1", "--repo", str(fleet)) == 0
    assert "nothing to change" in capsys.readouterr().out


def test_skip_refuses_a_node_that_is_not_the_rollouts_naming_its_nodes(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit(fleet, status_files("llama-canary", "paused", hold="health_failed"), "status")

    assert reconcile("skip", "llama-canary", "gpu-a3", "--repo", str(fleet)) == 1

    assert read(fleet) == ROLLOUT
    err = capsys.readouterr().err
    assert "not nodes of llama-canary: gpu-a3" in err and "gpu-a1, gpu-a2" in err


def test_skip_notes_a_node_that_already_succeeded_and_commits_who_and_why(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit(fleet, status_files("llama-canary", "paused", hold="health_failed"), "status")

    code = reconcile(
        "skip", "llama-canary", "gpu-a1", "gpu-a2", "--repo", str(fleet), "-m", "disk is gone",
        "--commit",
    )  # fmt: skip

    assert code == 0
    assert "already succeeded, so never skipped: gpu-a1" in capsys.readouterr().out
    assert git("log", "-1", "--format=%s", cwd=fleet).strip() == "skip llama-canary: disk is gone"
    assert "spec.skipNodes: [] -> [gpu-a1, gpu-a2]" in git("log", "-1", "--format=%b", cwd=fleet)


# -- --commit --------------------------------------------------------------


def test_commit_records_who_asked_what_and_why(fleet: Path) -> None:
    (fleet / "nodes/gpu-a1.yaml").write_text(
        node_yaml("gpu-a1", labels="{role: other}", maintenance=None)
    )  # unrelated

    code = reconcile(
        "abort", "llama-canary", "--repo", str(fleet), "--message", "wrong model", "--commit"
    )

    assert code == 0
    subject = git("log", "-1", "--format=%s", cwd=fleet).strip()
    body = git("log", "-1", "--format=%b", cwd=fleet)
    author = git("log", "-1", "--format=%an <%ae>", cwd=fleet).strip()
    files = git("show", "--name-only", "--format=", "HEAD", cwd=fleet).split()
    assert subject == "abort llama-canary: wrong model"
    assert "Requested by Alice Operator <alice@example.com>" in body
    assert "spec.abort: (absent) -> true" in body
    assert author == "Alice Operator <alice@example.com>"
    assert files == ["rollouts/llama-canary.yaml"]  # the unrelated edit stays out
    assert "nodes/gpu-a1.yaml" in git("status", "--porcelain", cwd=fleet)


def test_commit_refuses_a_file_with_uncommitted_changes(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edited = ROLLOUT.replace("batchSize: 1", "batchSize: 2")
    (fleet / "rollouts/llama-canary.yaml").write_text(edited)

    assert reconcile("pause", "llama-canary", "--repo", str(fleet), "--commit") == 1

    assert read(fleet) == edited
    assert "has changes that are not committed" in capsys.readouterr().err


# -- the edit itself -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # flow-style spec: the key goes inside the braces
        (
            "kind: Rollout\nspec: {live: true}\n",
            "kind: Rollout\nspec: {live: true, paused: true}\n",
        ),
        # empty value: filled in after the colon, comment kept
        (
            "spec:\n  live: true\n  paused:   # later\n",
            "spec:\n  live: true\n  paused: true   # later\n",
        ),
        # CRLF line endings and no final newline
        ("spec:\r\n  live: true", "spec:\r\n  live: true\r\n  paused: true"),
        # four-space indentation is followed
        ("spec:\n    live: true\n", "spec:\n    live: true\n    paused: true\n"),
    ],
)
def test_set_spec_fields_keeps_layout(text: str, expected: str) -> None:
    assert set_spec_fields(text, {"paused": True}) == expected


def test_set_spec_fields_replaces_a_block_collection_with_one_line() -> None:
    text = (
        "spec:\n"
        "  rollbackRequest:   # last time\n"
        "    id: r1\n"
        "    nodes:\n"
        "      - gpu-a1\n"
        "  # keep me\n"
        "  live: true\n"
    )
    after = set_spec_fields(text, {"rollbackRequest": {"id": "r2", "nodes": "all"}})
    assert after == (
        "spec:\n  rollbackRequest: {id: r2, nodes: all}  # last time\n  # keep me\n  live: true\n"
    )


def test_set_spec_fields_quotes_strings_that_would_not_read_back_as_strings() -> None:
    after = set_spec_fields("spec:\n  x: 1\n", {"rollbackRequest": {"id": "010", "nodes": "true"}})
    assert after == 'spec:\n  x: 1\n  rollbackRequest: {id: "010", nodes: "true"}\n'
