"""Small helpers for the operator-workflow tests: a fleet working tree made
with the real ``git`` binary, with an identity that does not depend on the
machine's git config."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

IDENTITY = {
    "GIT_AUTHOR_NAME": "Alice Operator",
    "GIT_AUTHOR_EMAIL": "alice@example.com",
    "GIT_COMMITTER_NAME": "Alice Operator",
    "GIT_COMMITTER_EMAIL": "alice@example.com",
}


def git_env(home: Path) -> dict[str, str]:
    """An environment for git: fixed identity, no global or system config."""
    home.mkdir(parents=True, exist_ok=True)
    empty = home / "gitconfig"
    empty.touch()
    return {
        **os.environ,
        **IDENTITY,
        "GIT_CONFIG_GLOBAL": str(empty),
        "GIT_CONFIG_NOSYSTEM": "1",
    }


@pytest.fixture
def identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Make the in-process git calls use the test identity."""
    env = git_env(tmp_path / "home")
    for key in (*IDENTITY, "GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.delenv("NO_COLOR", raising=False)
    yield env


def git(cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    result = subprocess.run(
        ["git", "-C", str(cwd), *args],
        capture_output=True,
        text=True,
        env=dict(env) if env is not None else git_env(cwd.parent / ".githome"),
        check=False,
    )
    assert result.returncode == 0, f"git {' '.join(args)}: {result.stderr}"
    return result.stdout


def write_files(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def make_fleet(root: Path, files: Mapping[str, str], message: str = "fleet") -> Path:
    """A git working tree on branch main holding ``files``, committed."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "--quiet", "-b", "main")
    write_files(root, files)
    git(root, "add", "-A")
    git(root, "commit", "--quiet", "-m", message)
    return root


def commit_files(root: Path, files: Mapping[str, str], message: str) -> str:
    write_files(root, files)
    git(root, "add", "-A")
    git(root, "commit", "--quiet", "-m", message)
    return git(root, "rev-parse", "HEAD").strip()


def node_doc(name: str, labels: str = "{role: canary}", agent: str = "") -> str:
    agent = agent or "http://127.0.0.1:8710"
    return (
        "apiVersion: reconciler/v1\n"
        "kind: Node\n"
        f"metadata: {{name: {name}}}\n"
        "spec:\n"
        f"  agent: {agent}\n"
        f"  labels: {labels}\n"
    )
