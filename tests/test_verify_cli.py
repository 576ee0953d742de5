"""``reconciler verify``: what it prints and its exit codes, on a real
repository signed by the real ``git commit -S``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.cli.main import main
from tests.kit.git import git, git_env
from tests.kit.keys import make_key

ENV = git_env("Alice", "alice@example.com")


def commit(repo: Path, name: str, text: str, message: str, key: Path | None = None) -> str:
    (repo / name).parent.mkdir(parents=True, exist_ok=True)
    (repo / name).write_text(text)
    git("add", name, cwd=repo, env=ENV)
    sign = (
        ["-c", "gpg.format=ssh", "-c", f"user.signingKey={key}", "commit", "-S"]
        if key
        else ["commit"]
    )
    git(*sign, "-q", "-m", message, cwd=repo, env=ENV)
    return git("rev-parse", "HEAD", cwd=repo, env=ENV)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(repository, allowed-signers file, alice's key)"""
    key = make_key(tmp_path / "alice")
    signers = tmp_path / "allowed_signers"
    signers.write_text(f"alice@example.com {key.text}\n")
    repo = tmp_path / "fleet"
    repo.mkdir()
    git("init", "-q", "-b", "main", cwd=repo, env=ENV)
    return repo, signers, key.private


def verify(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["verify", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_signed_spec_change_would_be_acted_on(
    setup: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    repo, signers, key = setup
    signed = commit(repo, "rollouts/llama.yaml", "kind: Rollout\n", "Start llama", key)
    commit(repo, "README.md", "# fleet\n", "Docs")

    code, out, _ = verify(capsys, "--repo", str(repo), "--allowed-signers", str(signers))

    assert code == 0
    assert out.splitlines()[0].endswith(": would be acted on")
    assert out.splitlines()[0].startswith("main (")
    assert f'newest spec change: {signed[:12]} "Start llama" by Alice <alice@example.com>' in out
    assert "good signature by alice@example.com with ED25519 key SHA256:" in out


def test_an_unsigned_spec_change_is_refused_and_names_the_fallback(
    setup: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    repo, signers, key = setup
    signed = commit(repo, "rollouts/llama.yaml", "abort: false\n", "Start llama", key)
    refused = commit(repo, "rollouts/llama.yaml", "abort: true\n", "Abort llama")

    code, out, _ = verify(capsys, "--repo", str(repo), "--allowed-signers", str(signers))

    assert code == 1
    lines = out.splitlines()
    assert lines[0] == f"main ({refused[:12]}): would NOT be acted on"
    assert (
        lines[1]
        == f'  newest spec change: {refused[:12]} "Abort llama" by Alice <alice@example.com>'
    )
    assert lines[2] == "  refused: the commit is not signed"
    assert (
        lines[3]
        == f'  the daemon falls back to: {signed[:12]} "Start llama" by Alice <alice@example.com>'
    )


def test_rev_checks_an_older_commit(
    setup: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    repo, signers, key = setup
    signed = commit(repo, "nodes/gpu-a1.yaml", "kind: Node\n", "Add node", key)
    commit(repo, "nodes/gpu-a1.yaml", "kind: Node # edited\n", "Edit node")

    code, out, _ = verify(
        capsys, signed[:10], "--repo", str(repo), "--allowed-signers", str(signers)
    )

    assert code == 0
    assert out.startswith(f"{signed[:10]} ({signed[:12]}): would be acted on")


def test_nothing_verified_says_the_daemon_acts_on_no_rollouts(
    setup: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    repo, signers, _ = setup
    commit(repo, "reconciler.yaml", "kind: Settings\n", "Settings")
    commit(repo, "rollouts/llama.yaml", "kind: Rollout\n", "Start llama")

    code, out, _ = verify(capsys, "--repo", str(repo), "--allowed-signers", str(signers))

    assert code == 1
    assert "older spec changes, also refused:" in out
    assert '"Settings" by Alice' in out
    assert "the daemon falls back to: nothing" in out


def test_a_repository_with_no_spec_files_is_fine(
    setup: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    repo, signers, _ = setup
    commit(repo, "README.md", "# fleet\n", "Docs")

    code, out, _ = verify(capsys, "--repo", str(repo), "--allowed-signers", str(signers))

    assert code == 0
    assert "nothing needs a signature" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--allowed-signers", "{missing}"], "cannot read allowed-signers file"),
        (["--allowed-signers", "{empty}"], "lists no signers"),
        (["--allowed-signers", "{bad}"], "bad_signers:2: key type 'ssh-dss' is not supported"),
        (["nosuchrev", "--allowed-signers", "{signers}"], "nosuchrev is not a commit"),
        (["--branch", "trunk", "--allowed-signers", "{signers}"], "branch trunk does not exist"),
        (
            ["--repo", "https://example.com/fleet.git", "--allowed-signers", "{signers}"],
            "local repository",
        ),
    ],
)
def test_usage_errors_exit_2(
    setup: tuple[Path, Path, Path],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    argv: list[str],
    message: str,
) -> None:
    repo, signers, key = setup
    commit(repo, "rollouts/llama.yaml", "kind: Rollout\n", "Start llama", key)
    bad = tmp_path / "bad_signers"
    bad.write_text("# comment\nbob@example.com ssh-dss AAAA\n")
    empty = tmp_path / "empty_signers"
    empty.write_text("# nobody yet\n")
    filled = [
        a.format(missing=tmp_path / "none", bad=bad, empty=empty, signers=signers) for a in argv
    ]
    if "--repo" not in filled:
        filled += ["--repo", str(repo)]

    code, out, err = verify(capsys, *filled)

    assert code == 2
    assert out == ""
    assert message in err


def test_missing_allowed_signers_flag_is_a_usage_error(
    setup: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # --allowed-signers also goes with --evidence, so argparse cannot require it.
    assert main(["verify", "--repo", str(setup[0])]) == 2
    assert "--allowed-signers" in capsys.readouterr().err


def test_the_installed_command_exits_1_on_a_refusal(setup: tuple[Path, Path, Path]) -> None:
    repo, signers, _ = setup
    commit(repo, "rollouts/llama.yaml", "kind: Rollout\n", "Start llama")

    result = subprocess.run(
        [sys.executable, "-m", "reconciler", "verify", "--allowed-signers", str(signers)],
        cwd=repo,
        capture_output=True,
        text=True,
    )

    assert result.returncode == 1
    assert "refused: the commit is not signed" in result.stdout


def test_a_shallow_clone_without_the_signed_commit_says_so(
    setup: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    repo, signers, key = setup
    commit(repo, "rollouts/llama.yaml", "abort: false\n", "Start llama", key)
    commit(repo, "rollouts/llama.yaml", "abort: true\n", "Abort llama")
    shallow = tmp_path / "shallow"
    git("clone", "-q", "--depth", "1", f"file://{repo}", str(shallow), cwd=tmp_path, env=ENV)

    code, out, _ = verify(capsys, "--repo", str(shallow), "--allowed-signers", str(signers))

    assert code == 1
    assert "the daemon falls back to: nothing" in out
    assert "shallow clone" in out
