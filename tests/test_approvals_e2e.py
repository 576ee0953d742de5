"""The two-person rule end to end (docs/trust.md): the real daemon
(``reconciler run --require-approvals 1``, watching a local repository or
polling a remote), real ``reconciler agent`` processes, commits signed by
the real ``git commit -S``, approvals by ``reconciler approve --push``, and
``git verify-commit`` and ``ssh-keygen -Y verify`` agreeing with every
verdict."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli.main import main
from reconciler.git.approval_notes import NOTES_REF, approval_message, signature_blocks
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import AgentFleet
from tests.kit.git import clone, git, git_env
from tests.kit.keys import Key, make_key


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[AgentFleet]:
    kit = AgentFleet.create(tmp_path, {"gpu-a1": {"live": False}})
    try:
        yield kit
    finally:
        kit.close()


def wait_for(
    what: str, check: Callable[[], Any], timeout: float, seen: Callable[[], Any] = lambda: ""
) -> float:
    """Seconds until ``check()`` is true; fails naming ``what`` (and ``seen()``)
    after ``timeout``."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not within {timeout}s; seen: {seen()}")
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_rollout_starts_only_once_someone_else_approves_it(
    fleet: AgentFleet, tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tmp_path / "people"
    keys.mkdir()
    alice, bob = make_key(keys / "alice").private, make_key(keys / "bob").private
    signers = tmp_path / "allowed_signers"
    signers.write_text(f"alice@example.com {Key(alice).text}\nbob@example.com {Key(bob).text}\n")
    # alice writes and signs the rollout; bob reviews from a clone of his own
    alice_env = git_env("Alice", "alice@example.com")
    (fleet.work / "rollouts").mkdir()
    (fleet.work / "rollouts" / "r.yaml").write_text(rollout_yaml("r", nodeIds=["gpu-a1"]))
    git("add", "-A", cwd=fleet.work, env=alice_env)
    git(
        "-c", "gpg.format=ssh", "-c", f"user.signingKey={alice}",
        "commit", "-q", "-S", "-m", "Roll out r", cwd=fleet.work, env=alice_env,
    )  # fmt: skip
    git("push", "-q", "origin", "HEAD:main", cwd=fleet.work, env=alice_env)
    change = git("rev-parse", "HEAD", cwd=fleet.work)
    bob_work = clone(fleet.bare, tmp_path / "bob-work")

    repo = str(fleet.bare) if where == "local" else f"file://{fleet.bare}"
    daemon = subprocess.Popen(
        [sys.executable, "-m", "reconciler", "run", "--repo", repo,
         "--key", str(fleet.key_path), "--allowed-signers", str(signers),
         "--require-approvals", "1", "--interval", "0.2s", "--poll", "0.5s",
         "--cache-dir", str(tmp_path / "cache")],
        env={**os.environ},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:

        def status() -> dict[str, Any]:
            return dict(fleet.statuses().get("r") or {"phase": "", "message": ""})

        wait_for("a pending status", lambda: status()["phase"] == "pending", 30)
        assert "needs 1 approval besides alice@example.com's; has 0" in status()["message"]

        # alice approves her own change: it still does not start
        assert main(["approve", change, "--key", str(alice), "--repo", str(fleet.work)]) == 0
        # an approval bob made of another commit, copied onto this one
        seed = git("rev-parse", f"{change}~1", cwd=bob_work)
        assert main(["approve", seed, "--key", str(bob), "--repo", str(bob_work)]) == 0
        copied = git("notes", "--ref", NOTES_REF, "show", seed, cwd=bob_work)
        git("notes", "--ref", NOTES_REF, "append", "-m", copied, change, cwd=fleet.work)
        git("notes", "--ref", NOTES_REF, "append", "-m", "LGTM", change, cwd=fleet.work)
        git("push", "-q", "origin", NOTES_REF, cwd=fleet.work)
        wait_for(
            "the refusal naming both ignored approvals",
            lambda: "made for another commit?" in status()["message"],
            30,
            status,
        )
        message = status()["message"]
        assert status()["phase"] == "pending"
        assert "alice@example.com signed the commit; an author cannot approve it" in message
        assert "has 0" in message
        assert "text that is not an SSH signature ('LGTM')" in message
        assert fleet.agents["gpu-a1"].journal() == []
        dashboard = git("show", "main:status/README.md", cwd=fleet.bare)
        assert "waiting for approval" in dashboard

        # bob's approval starts it, woken by the notes push (no re-read for 60 s)
        git("fetch", "-q", "origin", f"+{NOTES_REF}:{NOTES_REF}", cwd=bob_work)
        started = time.monotonic()
        assert main(["approve", change, "--key", str(bob), "--repo", str(bob_work), "--push"]) == 0
        took = time.monotonic() - started
        took += wait_for(
            "the rollout to start", lambda: status()["phase"] in ("running", "completed"), 20
        )
        wait_for("the rollout to complete", lambda: status()["phase"] == "completed", 30)
        assert status()["approvedBy"] == [
            {"principal": "bob@example.com", "keyId": Key(bob).fingerprint}
        ]
        # one wakeup (watch, or a 0.5 s poll), not the 60 s periodic re-read
        assert took < 15, took
    finally:
        daemon.send_signal(signal.SIGTERM)
        out, _ = daemon.communicate(timeout=20)
    assert daemon.returncode == 0, out
    assert "Traceback" not in out

    # git and ssh-keygen agree with every verdict
    verify_env = git_env(extra={})
    verified = subprocess.run(
        ["git", "-c", f"gpg.ssh.allowedSignersFile={signers}", "verify-commit", change],
        cwd=fleet.bare,
        env=verify_env,
        capture_output=True,
    )
    assert verified.returncode == 0
    note = git("notes", "--ref", NOTES_REF, "show", change, cwd=fleet.bare)
    blocks, garbage = signature_blocks(note)
    assert garbage == ["LGTM"] and len(blocks) == 3
    verdicts = [
        _ssh_keygen_verifies(signers, who, block, approval_message(change), tmp_path)
        for who, block in zip(
            ("alice@example.com", "bob@example.com", "bob@example.com"), blocks, strict=True
        )
    ]
    # alice's is a good signature refused by the rule; the copied one is bad here
    assert verdicts == [True, False, True]
    capsys.readouterr()
    verify_args = ["verify", change, "--repo", str(fleet.bare), "--require-approvals", "1"]
    assert main([*verify_args, "--allowed-signers", str(signers)]) == 0
    out = capsys.readouterr().out
    assert f"counted: bob@example.com ({Key(bob).fingerprint})" in out
    assert "signature 1: alice@example.com signed the commit" in out
    assert "signature 2: bad signature" in out


def _ssh_keygen_verifies(
    signers: Path, principal: str, block: str, message: bytes, tmp: Path
) -> bool:
    sig = tmp / "one.sig"
    sig.write_text(block + "\n")
    result = subprocess.run(
        ["ssh-keygen", "-Y", "verify", "-f", str(signers), "-I", principal,
         "-n", "reconciler-approval", "-s", str(sig)],
        input=message,
        capture_output=True,
    )  # fmt: skip
    return result.returncode == 0
