"""``reconciler rollback`` writes a rollbackRequest with a fresh id into the
rollout file, and refuses what the daemon could not do."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from reconciler.cli import main as cli
from reconciler.spec.rollout_status import RollbackNode, RollbackRecord
from tests.kit.documents import T0, make_status, node_yaml, status_text
from tests.kit.git import commit, git, make_repo

ROLLOUT = """\
apiVersion: reconciler/v1
kind: Rollout
metadata: {name: llama-canary}
spec:
  target: {runtime: hermes, provider: ollama, model: llama3.1-8b}
  selector: {role: canary}   # the lab boxes
  live: true                 # really changes the nodes
  onFailure: pause
  # rollbackRequest: {id: r1, nodes: all}
"""

NODES = [("gpu-a1", 1, "succeeded"), ("gpu-a2", 2, "failed"), ("gpu-a3", 3, "pending")]


@pytest.fixture
def fleet(tmp_path: Path, identity: dict[str, str]) -> Path:
    return make_repo(
        tmp_path / "fleet",
        {
            **{f"nodes/{n}.yaml": node_yaml(n, maintenance=None) for n, _, _ in NODES},
            "nodes/gpu-b1.yaml": node_yaml("gpu-b1", labels="{role: wide}", maintenance=None),
            "rollouts/llama-canary.yaml": ROLLOUT,
            **status_text(
                make_status(
                    "llama-canary", "paused", NODES, hold="health_failed", hold_nodes=["gpu-a2"]
                )
            ),
        },
    )


def diff(before: str, after: str) -> tuple[list[str], list[str]]:
    lines = list(difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0))
    removed = [d[1:] for d in lines if d.startswith("-") and not d.startswith("---")]
    added = [d[1:] for d in lines if d.startswith("+") and not d.startswith("+++")]
    return removed, added


def rollout_text(fleet: Path) -> str:
    return (fleet / "rollouts/llama-canary.yaml").read_text()


def test_rollback_of_named_nodes_adds_one_request_line(fleet: Path) -> None:
    code = cli.main(["rollback", "llama-canary", "--nodes", "gpu-a2,gpu-a1", "--repo", str(fleet)])

    assert code == 0
    removed, added = diff(ROLLOUT, rollout_text(fleet))
    assert removed == []
    assert added == ["  rollbackRequest: {id: r1, nodes: [gpu-a2, gpu-a1]}"]


def test_a_second_rollback_gets_the_next_id_and_replaces_the_request(fleet: Path) -> None:
    with_request = ROLLOUT.replace(
        "  onFailure: pause\n",
        "  onFailure: pause\n  rollbackRequest:   # first try\n    id: r1\n    nodes: [gpu-a2]\n",
    )
    handled = make_status(
        "llama-canary",
        "paused",
        NODES,
        hold="rollback_failed",
        hold_nodes=["gpu-a2"],
        rollbacks=(
            RollbackRecord(
                "r1",
                "Alice Operator <alice@example.com>",
                T0,
                "done",
                nodes=(RollbackNode("gpu-a2", "rollback_failed"),),
            ),
        ),
    )
    commit(
        fleet,
        {"rollouts/llama-canary.yaml": with_request, **status_text(handled)},
        "first rollback",
    )

    assert cli.main(["rollback", "llama-canary", "--all", "--repo", str(fleet)]) == 0

    removed, added = diff(with_request, rollout_text(fleet))
    assert removed == ["  rollbackRequest:   # first try", "    id: r1", "    nodes: [gpu-a2]"]
    assert added == ["  rollbackRequest: {id: r2, nodes: all}  # first try"]


def test_rollback_of_a_dry_run_rollout_is_refused(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dry = make_status("llama-canary", "paused", NODES, live=False, hold="health_failed")
    commit(fleet, status_text(dry), "dry run status")

    assert cli.main(["rollback", "llama-canary", "--all", "--repo", str(fleet)]) == 1

    assert rollout_text(fleet) == ROLLOUT
    assert "dry-run rollout" in capsys.readouterr().err


def test_rollback_of_nodes_outside_the_rollout_is_refused(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(
        ["rollback", "llama-canary", "--nodes", "gpu-a1,gpu-b1,gpu-zz", "--repo", str(fleet)]
    )

    assert code == 1
    err = capsys.readouterr().err
    assert "not nodes of llama-canary: gpu-b1, gpu-zz" in err
    assert "gpu-a1, gpu-a2, gpu-a3" in err
    assert rollout_text(fleet) == ROLLOUT


def test_without_status_the_nodes_must_exist_in_nodes(
    tmp_path: Path, identity: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = make_repo(
        tmp_path / "fresh",
        {
            "nodes/gpu-a1.yaml": node_yaml("gpu-a1", maintenance=None),
            "rollouts/llama-canary.yaml": ROLLOUT,
        },
    )

    assert cli.main(["rollback", "llama-canary", "--nodes", "gpu-a9", "--repo", str(fleet)]) == 1
    assert "no such nodes in nodes/: gpu-a9" in capsys.readouterr().err

    assert cli.main(["rollback", "llama-canary", "--nodes", "gpu-a1", "--repo", str(fleet)]) == 0
    assert "note: no status/llama-canary.yaml" in capsys.readouterr().out


def test_rollback_of_a_running_rollout_without_a_hold_says_to_pause_first(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    running = [("gpu-a1", 1, "succeeded"), ("gpu-a2", 2, "dispatched"), ("gpu-a3", 3, "pending")]
    commit(fleet, status_text(make_status("llama-canary", "running", running)), "running")

    assert cli.main(["rollback", "llama-canary", "--all", "--repo", str(fleet)]) == 1
    assert "reconciler pause llama-canary" in capsys.readouterr().err

    # paused in the same change: accepted
    assert cli.main(["pause", "llama-canary", "--repo", str(fleet)]) == 0
    assert cli.main(["rollback", "llama-canary", "--all", "--repo", str(fleet)]) == 0
    assert "rollbackRequest: {id: r1, nodes: all}" in rollout_text(fleet)


def test_rollback_commit_says_who_and_why(fleet: Path) -> None:
    code = cli.main(
        [
            "rollback",
            "llama-canary",
            "--nodes",
            "gpu-a2",
            "--repo",
            str(fleet),
            "--message",
            "model OOMs on gpu-a2",
            "--commit",
        ]
    )

    assert code == 0
    assert git("log", "-1", "--format=%s", cwd=fleet).strip() == (
        "rollback llama-canary: model OOMs on gpu-a2"
    )
    assert git("status", "--porcelain", cwd=fleet) == ""


@pytest.mark.parametrize(
    "argv",
    [
        ["rollback", "llama-canary"],
        ["rollback", "llama-canary", "--all", "--nodes", "gpu-a1"],
        ["rollback", "llama-canary", "--nodes", ","],
    ],
)
def test_rollback_needs_exactly_one_of_nodes_or_all(fleet: Path, argv: list[str]) -> None:
    try:
        code = cli.main([*argv, "--repo", str(fleet)])
    except SystemExit as exc:  # argparse refuses before the command runs
        code = int(exc.code or 0)
    assert code == 2
    assert rollout_text(fleet) == ROLLOUT
