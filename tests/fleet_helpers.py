"""Small helpers for the operator-workflow tests: a fleet working tree made
with the real ``git`` binary, with an identity that does not depend on the
machine's git config."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from reconciler.spec.model import Target
from reconciler.spec.rollout_status import (
    BatchRecord,
    FrozenSpec,
    Hold,
    NodeRecord,
    RolloutStatus,
    TransitionRecord,
    count_progress,
    status_files,
)
from reconciler.spec.safe_yaml import dump_yaml

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


# -- status files written with the engine's own values ----------------------

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def make_status(
    name: str,
    phase: str,
    nodes: Sequence[tuple[str, int, str]] = (),
    *,
    live: bool = True,
    hold: str | None = None,
    hold_nodes: Sequence[str] = (),
    operator_paused: bool = False,
    batch_size: int = 1,
    transitions: Sequence[tuple[str, str, str]] = (),
    **fields: Any,
) -> RolloutStatus:
    """A status as the engine records it: ``nodes`` are (name, batch, state)."""
    records = tuple(
        NodeRecord(
            name=node,
            batch=batch,
            state=state,
            attempt=0 if state == "pending" else 1,
            job_id=None if state == "pending" else f"{name}-{node}-1",
            verdict={"succeeded": "passed", "failed": "failed"}.get(state),
            error="agent: exit 1" if state == "failed" else "",
        )
        for node, batch, state in nodes
    )
    states_by_batch: dict[int, set[str]] = {}
    for record in records:
        states_by_batch.setdefault(record.batch, set()).add(record.state)

    def batch_state(states: set[str]) -> str:
        if states == {"succeeded"}:
            return "done"
        return "pending" if states == {"pending"} else "running"

    batches = tuple(
        BatchRecord(index, batch_state(states)) for index, states in sorted(states_by_batch.items())
    )
    started = phase not in ("pending", "scheduled")
    return RolloutStatus(
        name=name,
        phase=phase,
        hold=Hold(
            hold,
            f"{', '.join(hold_nodes) or 'a node'}: {hold}",
            T0,
            tuple(hold_nodes),
            len(hold_nodes),
        )
        if hold
        else None,
        operator_paused=operator_paused,
        spec_commit="0" * 40,
        start_commit="0" * 40 if started else None,
        first_seen_commit="0" * 40,
        frozen=FrozenSpec(
            target=Target("hermes", "ollama", "llama3.1-8b"),
            batch_size=batch_size,
            live=live,
            on_failure="pause",
            selector=(("role", "canary"),),
        )
        if started
        else None,
        started_at=T0 if started else None,
        progress=count_progress(records),
        batches=batches,
        nodes=records,
        transitions=tuple(
            TransitionRecord(T0, before, after, reason, "0" * 40)
            for before, after, reason in transitions
        ),
        **fields,
    )


def status_text(status: RolloutStatus) -> dict[str, str]:
    """The status files of ``status`` as the daemon writes them."""
    return {path: dump_yaml(record).decode() for path, record in status_files(status).items()}
