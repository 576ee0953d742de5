"""A fleet whose spec commits a person signs with `ssh-keygen`, the
daemon's own ``run --once`` verifying them (a restart every pass), and a
clone to push from as a person without a key; for the trust tests.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli.main import main
from reconciler.spec.safe_yaml import load_yaml
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import RepoKit
from tests.kit.git import git, git_env
from tests.kit.keys import make_key
from tests.kit.waiting import wait_for

NODES = {"web-1": {"role": "web"}, "web-2": {"role": "web"}}
OLD = "{runtime: hermes, provider: ollama, model: model-old, profile: default}"
NEW = "{runtime: hermes, provider: ollama, model: model-new, profile: default}"


class Repo:
    """A FleetKit whose spec commits alice signs, the daemon's ``run --once``
    verifying them, and a clone to push from as a person without a key."""

    def __init__(self, kit: RepoKit, tmp_path: Path) -> None:
        self.kit = kit
        self.alice = tmp_path / "alice"
        make_key(self.alice, comment="alice")
        self.signers = tmp_path / "allowed_signers"
        self.signers.write_text(f"ada@example.com {self.alice.with_suffix('.pub').read_text()}")
        self.env = git_env()
        self.extra: list[str] = []
        self.status_branch = "main"  # where ``phase`` reads statuses

    def git(self, *args: str) -> str:
        return git(*args, cwd=self.kit.work, env=self.env)

    def push(self, files: dict[str, str | None], message: str, *, signed: bool) -> str:
        """Commit ``files`` on the branch's tip and push; made again on the
        new tip when a running daemon's status commit came first (a rebase
        would drop the signature)."""
        for _ in range(10):
            self.git("fetch", "-q", "origin", "main")
            self.git("reset", "-q", "--hard", "origin/main")
            for rel, text in files.items():
                path = self.kit.work / rel
                if text is None:
                    path.unlink()
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            self.git("add", "-A")
            sign = ["-c", "gpg.format=ssh", "-c", f"user.signingKey={self.alice}"] if signed else []
            self.git(*sign, "commit", "-q", *(["-S"] if signed else []), "-m", message)
            pushed = subprocess.run(
                ["git", "push", "-q", "origin", "HEAD:main"],
                cwd=self.kit.work, env=self.env, capture_output=True,
            )  # fmt: skip
            if pushed.returncode == 0:
                return self.git("rev-parse", "HEAD")
        raise AssertionError("could not push past the daemon's status commits")

    def run_once(self) -> None:
        argv = [
            "run", "--once", "--repo", str(self.kit.bare), "--key", str(self.kit.key_path),
            "--allowed-signers", str(self.signers), *self.extra,
        ]  # fmt: skip
        assert main(argv) == 0

    def run_until(self, done: Any, timeout: float = 60.0) -> None:
        def passed() -> bool:
            self.run_once()
            return bool(done())

        wait_for(passed, timeout=timeout, what="the daemon to get there")

    def status(self, name: str, ref: str = "main") -> dict[str, Any] | None:
        try:
            text = git("show", f"{ref}:status/{name}.yaml", cwd=self.kit.bare)
        except Exception:
            return None
        return dict(load_yaml(name, text.encode()))

    def phase(self, name: str) -> str | None:
        status = self.status(name, self.status_branch)
        return None if status is None else str(status["phase"])

    def accepted(self) -> list[dict[str, Any]]:
        """Every job payload an agent accepted, from the simulator's journal."""
        journal = self.kit.root / "sim" / "state" / "sim-journal.jsonl"
        if not journal.exists():
            return []
        events = [json.loads(line) for line in journal.read_text().splitlines() if line]
        return [e["payload"] for e in events if e.get("e") == "accept"]

    def finished(self) -> list[str]:
        journal = self.kit.root / "sim" / "state" / "sim-journal.jsonl"
        if not journal.exists():
            return []
        events = [json.loads(line) for line in journal.read_text().splitlines() if line]
        return [e["jobId"] for e in events if e.get("e") == "finish"]

    def verify(self, capsys: pytest.CaptureFixture[str], *more: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main(
            ["verify", "--repo", str(self.kit.bare), "--allowed-signers", str(self.signers), *more]
        )
        return code, capsys.readouterr().out


def old_then_new(
    repo: Repo, nodes: Iterable[str], reach: Callable[[Callable[[], bool]], Any]
) -> None:
    """Rollout ``old`` (model-old) completes on ``nodes``, then ``new``
    (model-new); both signed. ``reach(done)`` gets there: passes of
    ``run --once``, or waiting on a daemon that runs."""
    for name, target in (("old", OLD), ("new", NEW)):
        spec = rollout_yaml(name, target=target, nodeIds=list(nodes), live=True, batchSize=2)
        repo.push({f"rollouts/{name}.yaml": spec}, f"Roll out {name}", signed=True)
        reach(lambda name=name: repo.phase(name) == "completed")  # type: ignore[misc]
