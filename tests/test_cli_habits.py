"""The command line's shared habits, on real repositories: ``-o`` for
``--format`` and ``yaml`` next to ``json`` on every verb that prints data,
``RECONCILER_REPO`` as every ``--repo``'s default, and shell completion
driven through a real ``bash``."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from reconciler.cli import main as cli
from reconciler.spec.fleet_status import FleetNode, FleetRuntime, FleetStatus, fleet_to_files
from reconciler.spec.safe_yaml import dump_yaml
from tests.kit.documents import T0, make_status, status_text
from tests.kit.git import git, make_repo


def load_yaml(text: str) -> object:
    return YAML(typ="safe", pure=True).load(text)


def fleet_files() -> dict[str, str]:
    fleet = FleetStatus(
        (
            FleetNode("gpu-a1", "ok", T0, (FleetRuntime("hermes", "ollama", "m", "default"),)),
            FleetNode("gpu-a2", "offline", T0 + timedelta(minutes=3)),
        )
    )
    return {path: dump_yaml(record).decode() for path, record in fleet_to_files(fleet).items()}


@pytest.fixture
def bare(tmp_path: Path, identity: dict[str, str]) -> Path:
    """A bare fleet repository with two rollout statuses and a fleet status,
    as the daemon leaves it."""
    statuses = [
        make_status(
            "llama-canary", "running", [("gpu-a1", 1, "succeeded"), ("gpu-a2", 2, "pending")]
        ),
        make_status("qwen-next", "completed", [("gpu-a1", 1, "succeeded")]),
    ]
    files = {p: t for s in statuses for p, t in status_text(s).items()}
    work = make_repo(tmp_path / "seed", {"rollouts/.keep": "", **files, **fleet_files()})
    target = tmp_path / "fleet.git"
    git("clone", "--quiet", "--bare", str(work), str(target), cwd=tmp_path)
    return target


def printed(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = cli.main(list(argv))
    out = capsys.readouterr().out
    assert code == 0, out
    return out


# --- -o and yaml ----------------------------------------------------------------


@pytest.mark.parametrize(
    "verb",
    [["status"], ["status", "llama-canary"], ["status", "--active"], ["fleet"]],
    ids=["status", "status NAME", "status --active", "fleet"],
)
def test_yaml_holds_the_same_data_as_json_and_o_is_format(
    verb: list[str], bare: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    as_json = json.loads(printed(capsys, *verb, "--repo", str(bare), "--format", "json"))
    short = printed(capsys, *verb, "--repo", str(bare), "-o", "json")
    as_yaml = printed(capsys, *verb, "--repo", str(bare), "-o", "yaml")

    assert json.loads(short) == as_json
    assert load_yaml(as_yaml) == as_json
    assert not as_yaml.lstrip().startswith(("{", "["))  # block style, not JSON's flow
    assert "\n  " in as_yaml or "\n- " in as_yaml


def test_fleet_yaml_without_a_fleet_status_yet(
    tmp_path: Path, identity: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    repo = make_repo(tmp_path / "fleet", {"rollouts/.keep": ""})
    out = printed(capsys, "fleet", "--repo", str(repo), "-o", "yaml")
    assert load_yaml(out) == {"kind": "FleetStatus", "nodes": None}


def test_o_is_format_for_validate(
    tmp_path: Path, identity: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    repo = make_repo(tmp_path / "fleet", {"rollouts/bad.yaml": "kind: Rollout\n"})
    assert cli.main(["validate", str(repo), "-o", "github"]) == 1
    assert capsys.readouterr().out.startswith("::error file=")
