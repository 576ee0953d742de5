"""Pushes without a signing key that try to replay or undo what verified
history says: a deleted or rewound status, a deleted never-backwards
marker. Each runs real `git`, real `ssh-keygen` signatures, the daemon's
own ``run --once`` against the simulated fleet (a restart every pass), and
``reconciler verify``, which must agree with the daemon.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli.main import main
from reconciler.spec.safe_yaml import load_yaml
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.git import git, git_env
from tests.kit.keys import make_key
from tests.kit.waiting import wait_for

NODES = {"web-1": {"role": "web"}, "web-2": {"role": "web"}}
OLD = "{runtime: hermes, provider: ollama, model: model-old, profile: default}"
NEW = "{runtime: hermes, provider: ollama, model: model-new, profile: default}"


class Repo:
    """A FleetKit whose spec commits alice signs, the daemon's ``run --once``
    verifying them, and a clone to push from as a person without a key."""

    def __init__(self, kit: FleetKit, tmp_path: Path) -> None:
        self.kit = kit
        self.alice = tmp_path / "alice"
        make_key(self.alice, comment="alice")
        self.signers = tmp_path / "allowed_signers"
        self.signers.write_text(f"ada@example.com {self.alice.with_suffix('.pub').read_text()}")
        self.env = git_env()
        self.extra: list[str] = []

    def git(self, *args: str) -> str:
        return git(*args, cwd=self.kit.work, env=self.env)

    def push(self, files: dict[str, str | None], message: str, *, signed: bool) -> str:
        self.git("pull", "-q", "--ff-only", "origin", "main")
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
        self.git("push", "-q", "origin", "HEAD:main")
        return self.git("rev-parse", "HEAD")

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
        status = self.status(name)
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


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[Repo]:
    kit = FleetKit.create(
        tmp_path,
        NODES,
        behaviour="default: succeed\nnodes:\n  web-1: {action: succeed, delay: 1.5}\n",
    )
    try:
        yield Repo(kit, tmp_path)
    finally:
        kit.close()


def test_a_deleted_acted_marker_and_an_older_signed_tip_do_not_undo_a_signed_pause(
    repo: Repo, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = rollout_yaml("r", target=NEW, nodeIds=["web-1", "web-2"], live=True)
    repo.push({"rollouts/r.yaml": spec}, "Start r", signed=True)
    repo.run_until(lambda: any(p["node"] == "web-1" for p in repo.accepted()))
    older = repo.git("ls-remote", "origin", "refs/heads/main").split()[0]
    repo.push({"rollouts/r.yaml": spec.replace("live: true", "live: true\n  paused: true")},
              "Pause r", signed=True)  # fmt: skip
    repo.run_until(lambda: (repo.status("r") or {}).get("operatorPaused") is True)

    # Without a key: the old marker goes, and main goes back to a tip whose
    # newest spec change (signed) is the one before the pause.
    repo.git("push", "-q", "origin", ":refs/reconciler/acted/main")
    repo.git("push", "-q", "--force", "origin", f"{older}:main")
    web_1 = next(p["jobId"] for p in repo.accepted() if p["node"] == "web-1")
    repo.run_until(lambda: web_1 in repo.finished())
    for _ in range(4):
        repo.run_once()

    assert [p["node"] for p in repo.accepted()] == ["web-1"], "the pause was undone"
    code, out = repo.verify(capsys)
    assert code == 1, out
    assert "does not descend by first parent" in out
    assert "the daemon's state" in out
