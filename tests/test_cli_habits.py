"""The command line's shared habits, on real repositories: ``-o`` for
``--format`` and ``yaml`` next to ``json`` on every verb that prints data,
``RECONCILER_REPO`` as every ``--repo``'s default, and shell completion
driven through a real ``bash``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def test_plan_yaml_holds_the_same_data_as_json(
    tmp_path: Path, identity: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    repo = make_repo(tmp_path / "fleet", {"rollouts/.keep": ""})
    git("checkout", "--quiet", "-b", "change", cwd=repo)
    (repo / "reconciler.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: Settings\nspec: {offlineAfter: 5m}\n"
    )
    git("add", "-A", cwd=repo)
    git("commit", "--quiet", "-m", "slower offline", cwd=repo)
    as_json = json.loads(printed(capsys, "plan", "--repo", str(repo), "--format", "json"))
    as_yaml = load_yaml(printed(capsys, "plan", "--repo", str(repo), "-o", "yaml"))

    assert isinstance(as_yaml, dict)
    as_yaml.pop("now"), as_json.pop("now")  # the clock, read by each run
    assert as_yaml == as_json
    assert as_json["setting_changes"] == [{"field": "offlineAfter", "before": "2m", "after": "5m"}]


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


# --- --repo and RECONCILER_REPO -------------------------------------------------


def test_reconciler_repo_is_the_default_repository_of_every_verb(
    bare: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("RECONCILER_REPO", str(bare))

    names = [r["metadata"]["name"] for r in json.loads(printed(capsys, "status", "-o", "json"))]
    assert names == ["llama-canary", "qwen-next"]
    assert json.loads(printed(capsys, "fleet", "-o", "json"))["counts"]["offline"] == 1
    assert json.loads(printed(capsys, "plan", "--base", "HEAD", "-o", "json"))["base"] == git(
        "rev-parse", "HEAD", cwd=bare
    )
    # run's --repo is required unless the environment names one
    parsed = cli.build_parser("run").parse_args(["run", "--key", "k"])
    assert parsed.repo == str(bare)
    for verb in ("status", "fleet", "backups", "attest", "plan", "approve", "pause", "verify"):
        action = next(a for a in _verb_parser(verb)._actions if "--repo" in a.option_strings)
        assert action.default == str(bare), verb


def _verb_parser(verb: str) -> object:
    import argparse

    parser = cli.build_parser(verb)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[verb]


def test_run_without_repo_or_the_variable_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RECONCILER_REPO", raising=False)
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "--key", "k", "--once"])
    assert exited.value.code == 2
    assert "--repo" in capsys.readouterr().err


def test_a_verb_that_needs_a_local_repository_says_so_for_a_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = "ssh://git@forge.invalid/fleet.git"
    for verb, says in (
        (["plan"], "plan compares commits of a local repository"),
        (["approve", "--key", "k"], "approve writes the approval into a local repository"),
        (["pause", "r"], "pause edits a rollout file in a working clone"),
    ):
        assert cli.main([*verb, "--repo", url]) == 2
        err = capsys.readouterr().err
        assert says in err and url in err, err
        assert f"git clone {url}" in err


def test_an_intent_verb_on_a_bare_repository_asks_for_a_working_clone(
    bare: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["pause", "llama-canary", "--repo", str(bare)]) == 1
    err = capsys.readouterr().err
    assert "is a bare repository" in err and "needs a working clone" in err
    assert f"git clone {bare}" in err


# --- shell completion -----------------------------------------------------------

COMPLETE = """
eval "$(reconciler completion bash)"
COMP_LINE="$LINE"
COMP_POINT=${#COMP_LINE}
read -ra COMP_WORDS <<< "$COMP_LINE"
if [[ "$COMP_LINE" == *" " ]]; then COMP_WORDS+=(""); fi
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
COMP_TYPE=9
_python_argcomplete reconciler
printf '%s\\n' "${COMPREPLY[@]}"
"""


def bash_completes(line: str, cwd: Path | None = None) -> list[str]:
    """What a real bash, with the script ``reconciler completion bash``
    prints sourced, offers for ``line`` with the cursor at its end."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "LINE": line,
    }
    env.pop("_ARGCOMPLETE", None)
    env.pop("RECONCILER_REPO", None)
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", COMPLETE],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [w.strip() for w in done.stdout.splitlines() if w.strip()]


def test_bash_completes_verbs_and_every_verbs_flags() -> None:
    assert bash_completes("reconciler sta") == ["status"]
    assert bash_completes("reconciler status --for") == ["--format"]
    assert bash_completes("reconciler plan -o ") == ["text", "markdown", "json", "yaml"]
    assert "--require-approvals" in bash_completes("reconciler run --req")
    assert bash_completes("reconciler keys gen") == ["generate"]
    assert bash_completes("reconciler keys generate --o") == ["--out"]
    assert bash_completes("reconciler unfr") == ["unfreeze"]
    assert bash_completes("reconciler freeze --f") == ["--for"]


NAMED_FLEET = {
    "rollouts/llama-canary.yaml": "",
    "rollouts/qwen-serving.yaml": "",
    "rollouts/README.md": "",
    "nodes/gpu-a1.yaml": "",
    "nodes/gpu-a2.yaml": "",
    "nodes/gpu-b1.yaml": "",
}


def test_bash_completes_rollout_and_node_names_from_the_working_tree(
    tmp_path: Path, identity: dict[str, str]
) -> None:
    work = make_repo(tmp_path / "fleet", NAMED_FLEET)

    assert bash_completes("reconciler pause l", work) == ["llama-canary"]
    assert bash_completes("reconciler resume q", work) == ["qwen-serving"]
    assert bash_completes("reconciler status --active q", work) == ["qwen-serving"]
    assert bash_completes("reconciler attest ll", work) == ["llama-canary"]
    assert bash_completes("reconciler verify --evidence q", work) == ["qwen-serving"]
    assert bash_completes("reconciler backups gpu-b", work) == ["gpu-b1"]
    assert bash_completes("reconciler skip llama-canary gpu-a1 gpu-", work) == ["gpu-a2", "gpu-b1"]
    assert bash_completes("reconciler rollback llama-canary --nodes gpu-a1,gpu-", work) == [
        "gpu-a1,gpu-a2",
        "gpu-a1,gpu-b1",
    ]
    # --repo names the repository the verb would use, wherever the shell is
    assert bash_completes(f"reconciler abort --repo {work} ll", tmp_path) == ["llama-canary"]
    assert bash_completes("reconciler abort ll", tmp_path) == []


def test_bash_completes_names_from_a_bare_repositorys_branch(
    tmp_path: Path, identity: dict[str, str]
) -> None:
    work = make_repo(tmp_path / "seed", NAMED_FLEET)
    bare = tmp_path / "fleet.git"
    git("clone", "--quiet", "--bare", str(work), str(bare), cwd=tmp_path)

    assert bash_completes(f"reconciler status --repo {bare} q") == ["qwen-serving"]
    assert bash_completes(f"reconciler backups --repo {bare} gpu-a") == ["gpu-a1", "gpu-a2"]
    assert bash_completes(f"reconciler status --repo {bare} --branch nowhere q") == []


# zsh's completion system runs only inside its line editor, so the sourced
# script's entry point is called with the words the editor would set, and
# zsh's own ``_describe`` (what it hands the candidates to) prints them.
ZSH_COMPLETE = """
autoload -Uz compinit is-at-least
compinit -u -D
eval "$(reconciler completion zsh)"
_describe() { local -a items; items=("${(@P)2}"); printf '%s\\n' "${items[@]}"; }
BUFFER="$LINE"; CURSOR=${#BUFFER}
words=(${=BUFFER}); [[ "$BUFFER" == *" " ]] && words+=("")
_python_argcomplete
"""

# fish completes a command line given to ``complete -C`` as it would at the
# prompt, with the sourced script's own ``complete`` rule.
FISH_COMPLETE = """
reconciler completion fish | source
complete -C "$LINE"
"""


def shell_completes(shell: str, line: str, cwd: Path | None = None) -> list[str]:
    """What a real zsh or fish, with ``reconciler completion SHELL`` sourced,
    offers for ``line``: the candidates alone, without their descriptions."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "LINE": line,
    }
    env.pop("_ARGCOMPLETE", None)
    env.pop("RECONCILER_REPO", None)
    argv = ["zsh", "-f", "-c", ZSH_COMPLETE] if shell == "zsh" else ["fish", "--no-config"]
    done = subprocess.run(
        argv,
        cwd=cwd,
        input=FISH_COMPLETE if shell == "fish" else None,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    split = ":" if shell == "zsh" else "\t"
    return sorted(w.split(split, 1)[0].strip() for w in done.stdout.splitlines() if w.strip())


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_complete_verbs_and_every_verbs_flags(shell: str) -> None:
    assert shell_completes(shell, "reconciler sta") == ["status"]
    assert shell_completes(shell, "reconciler unfr") == ["unfreeze"]
    assert shell_completes(shell, "reconciler status --for") == ["--format"]
    assert shell_completes(shell, "reconciler freeze --f") == ["--for"]
    assert shell_completes(shell, "reconciler plan -o ") == ["json", "markdown", "text", "yaml"]
    assert "--require-approvals" in shell_completes(shell, "reconciler run --req")
    assert shell_completes(shell, "reconciler keys generate --o") == ["--out"]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_complete_rollout_and_node_names(
    shell: str, tmp_path: Path, identity: dict[str, str]
) -> None:
    work = make_repo(tmp_path / "fleet", NAMED_FLEET)

    assert shell_completes(shell, "reconciler pause l", work) == ["llama-canary"]
    assert shell_completes(shell, "reconciler backups gpu-a", work) == ["gpu-a1", "gpu-a2"]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_a_script_for_each_shell(
    shell: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = printed(capsys, "completion", shell)
    assert "_ARGCOMPLETE" in out and "reconciler" in out
