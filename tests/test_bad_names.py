"""A path that is not valid UTF-8, or not a valid document name, is a
problem of that path alone: reported, ignored, and never a status file;
and no exception from one pass ends the daemon.

Real `git` commits made with plumbing (Git allows any bytes in a name),
the real daemon process (``reconciler run``) against the simulated fleet."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from reconciler.git.store import GitStore
from reconciler.git.watch import BranchWatcher
from reconciler.spec.paths import name_in, shown_path
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.git import git, git_env

# Each name git takes, none a rollout's: bytes that are not UTF-8, another
# suffix, an upper-case stem, an empty stem.
BAD_NAMES = [
    b"status/\xff.yaml",
    b"rollouts/\xff.yaml",
    b"nodes/\xfe.yaml",
    b"rollouts/x.yml",
    b"rollouts/README.md",
    b"rollouts/.yaml",
    b"status/READ.yaml",
]


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[FleetKit]:
    kit = FleetKit.create(tmp_path, {"n1": {"role": "web"}, "n2": {"role": "web"}})
    yield kit
    kit.close()


def push_raw_names(kit: FleetKit, names: list[bytes], message: str) -> None:
    """One commit adding an empty file at each of ``names``, as bytes, pushed."""
    work, env = kit.work, git_env()
    git("pull", "--quiet", "--rebase", "origin", "main", cwd=work)
    empty = git("hash-object", "-w", "--stdin", cwd=work, input="")
    for name in names:
        subprocess.run(
            [
                b"git",
                b"update-index",
                b"--add",
                b"--cacheinfo",
                b"100644," + empty.encode() + b"," + name,
            ],
            cwd=work,
            env=env,
            check=True,
        )
    git("commit", "--quiet", "-m", message, cwd=work)
    git("push", "--quiet", "origin", "HEAD:main", cwd=work)
    git("reset", "--quiet", "--hard", cwd=work)  # the files, in the working tree too


def status_names(kit: FleetKit) -> list[bytes]:
    listed = subprocess.run(
        ["git", "ls-tree", "-z", "--name-only", "main", "status/"],
        cwd=kit.bare,
        capture_output=True,
        check=True,
    )
    return [n for n in listed.stdout.split(b"\0") if n]


def wait_for(kit: FleetKit, done: Any, timeout: float, log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        statuses = kit.statuses()
        if done(statuses):
            return statuses
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout}s: {statuses}\n{log.read_text()}")
        time.sleep(0.1)


def test_name_in_takes_only_a_valid_name_with_the_yaml_suffix() -> None:
    assert name_in("rollouts", "rollouts/web-1.yaml") == "web-1"
    for path in (
        "rollouts/x.yml",
        "rollouts/README.md",
        "rollouts/.yaml",
        "rollouts/Web.yaml",
        "rollouts/\udcff.yaml",
        "rollouts/a/b.yaml",
        "nodes/web.yaml",
    ):
        assert name_in("rollouts", path) is None, path
    assert shown_path("status/\udcff.yaml") == "status/\\xff.yaml"


@pytest.mark.parametrize("plain", [False, True], ids=["fast", "plain"])
def test_names_no_rollout_can_have_are_ignored_by_a_running_daemon(
    kit: FleetKit, tmp_path: Path, plain: bool
) -> None:
    log = tmp_path / "daemon.log"
    args = [sys.executable, "-m", "reconciler", "run", "--repo", str(kit.bare)]
    args += ["--key", str(kit.key_path), "--interval", "1s", *(["--plain"] if plain else [])]
    with log.open("w") as out:
        daemon = subprocess.Popen(args, stderr=out, stdout=out)
    try:
        push_raw_names(kit, BAD_NAMES, "files no rollout can own")
        kit.push({"rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"})})

        wait_for(kit, lambda s: s.get("web", {}).get("phase") == "completed", 60, log)

        assert daemon.poll() is None, log.read_text()
        # Only the rollout's status, the dashboard: no file from a bad name.
        assert set(status_names(kit)) == {
            b"status/README.md",
            b"status/READ.yaml",
            b"status/\xff.yaml",
            b"status/web.yaml",
        }
        dashboard = git("show", "main:status/README.md", cwd=kit.bare)
        assert "`status/\\xff.yaml`: not a rollout's status file" in dashboard
        assert "`status/READ.yaml`: not a rollout's status file" in dashboard
        # A later commit still acts: the daemon did not stop at them.
        kit.push({"rollouts/db.yaml": rollout_yaml("db", nodeIds=["n1"])})
        wait_for(kit, lambda s: s.get("db", {}).get("phase") == "completed", 60, log)
        assert daemon.poll() is None, log.read_text()
    finally:
        daemon.terminate()
        daemon.wait(20)
    text = log.read_text()
    assert "Traceback" not in text and "pass_failed" not in text, text
    assert "status_ignored" in text and "status/\\xff.yaml" in text
    assert "rollouts/\\xff.yaml is not valid UTF-8" in text
    assert "nodes/\\xfe.yaml is not valid UTF-8" in text


def test_a_pass_that_raises_is_logged_counted_and_retried(kit: FleetKit) -> None:
    # The clock is an edge we do not own: one that fails for the first
    # passes stands for any defect a pass may meet. serve logs each with
    # its traceback, counts it, and passes again after a backoff.
    failures = [2]

    def clock() -> datetime:
        if failures[0] > 0:
            failures[0] -= 1
            raise OSError("the clock is gone")
        return datetime.now(UTC).replace(microsecond=0)

    stream = (kit.root / "serve.log").open("w")
    from reconciler.daemon.logs import EventLog

    daemon = kit.daemon(clock=clock)
    daemon.log = EventLog(stream=stream)
    kit.push({"rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"})})
    watcher = BranchWatcher.for_store(GitStore.open(str(kit.bare), "main"))
    thread = threading.Thread(target=daemon.serve, args=(watcher,), kwargs={"interval": 0.2})
    thread.start()
    try:
        wait_for(
            kit,
            lambda s: s.get("web", {}).get("phase") == "completed",
            60,
            kit.root / "serve.log",
        )
        assert thread.is_alive()
    finally:
        daemon.stop()
        thread.join(20)
        stream.close()
    text = (kit.root / "serve.log").read_text()
    assert text.count("pass_failed") == 2, text
    assert "unexpected OSError: the clock is gone" in text
    assert "Traceback (most recent call last)" in text
    metrics = generate_latest(daemon.metrics.registry).decode()
    assert 'reconciler_pass_errors_total{kind="unexpected"} 2.0' in metrics


def test_names_in_an_unverified_tree_never_become_status_files(
    kit: FleetKit, tmp_path: Path
) -> None:
    # With verification on, an unsigned commit of files no rollout can own
    # (not UTF-8, another suffix, no valid stem) leaves no status file and
    # does not stop the daemon; the signed rollout beside it completes.
    alice = tmp_path / "alice"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "alice", "-f", str(alice)],
        check=True,
    )
    signers = tmp_path / "allowed_signers"
    signers.write_text(f"alice@example.com {alice.with_suffix('.pub').read_text()}")
    work = kit.work
    git("pull", "--quiet", "--rebase", "origin", "main", cwd=work)
    (work / "rollouts").mkdir(exist_ok=True)
    (work / "rollouts" / "web.yaml").write_text(rollout_yaml("web", selector={"role": "web"}))
    git("add", "-A", cwd=work)
    sign = ["-c", "gpg.format=ssh", "-c", f"user.signingKey={alice}"]
    git(*sign, "commit", "--quiet", "-S", "-m", "Signed rollout", cwd=work)
    git("push", "--quiet", "origin", "HEAD:main", cwd=work)
    log = tmp_path / "daemon.log"
    args = [sys.executable, "-m", "reconciler", "run", "--repo", str(kit.bare)]
    args += ["--key", str(kit.key_path), "--interval", "1s", "--allowed-signers", str(signers)]
    with log.open("w") as out:
        daemon = subprocess.Popen(args, stderr=out, stdout=out)
    try:
        push_raw_names(
            kit,
            [b"rollouts/\xff.yaml", b"rollouts/x.yml", b"rollouts/README.md", b"rollouts/.yaml"],
            "unsigned files no rollout can own",
        )

        wait_for(kit, lambda s: s.get("web", {}).get("phase") == "completed", 60, log)

        assert daemon.poll() is None, log.read_text()
        assert set(status_names(kit)) == {b"status/README.md", b"status/web.yaml"}
    finally:
        daemon.terminate()
        daemon.wait(20)
    text = log.read_text()
    assert "Traceback" not in text and "pass_failed" not in text, text
