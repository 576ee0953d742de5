"""Pushes without a signing key that try to replay or undo what verified
history says: a deleted or rewound status, a deleted never-backwards
marker. Each runs real `git`, real `ssh-keygen` signatures, the daemon's
own ``run --once`` against the simulated fleet (a restart every pass), and
``reconciler verify``, which must agree with the daemon.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kit import signed
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.git import git
from tests.kit.keys import make_key
from tests.kit.signed import NEW, NODES, Repo

STATUS_BRANCH = (
    "apiVersion: reconciler/v1\nkind: Settings\nspec: {statusBranch: reconciler-status}\n"
)


@contextlib.contextmanager
def signed_fleet(tmp_path: Path, settings: str | None = None, **kit: str) -> Iterator[Repo]:
    """The simulated fleet in a repository alice signs for; the daemon signs
    its status commits when ``settings`` are given."""
    files = {"reconciler.yaml": settings} if settings else None
    fleet = FleetKit.create(tmp_path, NODES, files=files, **kit)
    try:
        repo = Repo(fleet, tmp_path)
        repo.extra = ["--sign-commits"] if settings else []
        yield repo
    finally:
        fleet.close()


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[Repo]:
    slow_web_1 = "default: succeed\nnodes:\n  web-1: {action: succeed, delay: 1.5}\n"
    with signed_fleet(tmp_path, behaviour=slow_web_1) as repo:
        yield repo


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


@pytest.fixture
def fast(tmp_path: Path) -> Iterator[Repo]:
    settings = "apiVersion: reconciler/v1\nkind: Settings\nspec: {offlineAfter: 2m}\n"
    with signed_fleet(tmp_path, settings) as repo:
        yield repo


@pytest.fixture
def on_status_branch(tmp_path: Path) -> Iterator[Repo]:
    """Statuses on ``reconciler-status``, where ``phase`` reads them."""
    with signed_fleet(tmp_path, STATUS_BRANCH) as repo:
        repo.status_branch = "reconciler-status"
        yield repo


def old_then_new(repo: Repo) -> list[str]:
    """``old`` then ``new`` on both nodes; the job ids agents accepted."""
    signed.old_then_new(repo, NODES, repo.run_until)
    jobs = [p["jobId"] for p in repo.accepted()]
    assert len(jobs) == 4
    return jobs


def assert_not_replayed(repo: Repo, jobs: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    for _ in range(5):
        repo.run_once()
    assert [p["jobId"] for p in repo.accepted()] == jobs, "an old rollout ran again"
    code, out = repo.verify(capsys, "--daemon-key", str(repo.kit.root / "keys" / "reconciler.pub"))
    assert code == 1, out
    assert "status/old.yaml is gone" in out


def test_deleting_a_status_and_touching_its_rollout_does_not_run_it_again(
    fast: Repo, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = old_then_new(fast)
    old = (fast.kit.work / "rollouts" / "old.yaml").read_text()
    fast.push({"status/old.yaml": None, "rollouts/old.yaml": old + "# again\n"},
              "Run old again", signed=False)  # fmt: skip
    assert_not_replayed(fast, jobs, capsys)


def test_a_status_only_deletion_after_a_signed_settings_change_does_not_run_it_again(
    fast: Repo, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = old_then_new(fast)
    settings = "apiVersion: reconciler/v1\nkind: Settings\nspec: {offlineAfter: 3m}\n"
    fast.push({"reconciler.yaml": settings}, "Wait longer for agents", signed=True)
    fast.run_once()
    fast.push({"status/old.yaml": None}, "Clean up", signed=False)
    assert_not_replayed(fast, jobs, capsys)


def test_deleting_the_status_branch_runs_nothing_again(
    on_status_branch: Repo, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = on_status_branch
    jobs = old_then_new(repo)
    repo.git("push", "-q", "origin", ":reconciler-status")
    for _ in range(5):
        repo.run_once()
    assert [p["jobId"] for p in repo.accepted()] == jobs, "old rollouts ran again"
    # Neither is started again on a status branch made anew.
    assert repo.status("old", "reconciler-status") is None
    assert repo.status("new", "reconciler-status") is None
    code, out = repo.verify(capsys)
    assert code == 1, out
    assert "status/old.yaml is gone" in out and "status/new.yaml is gone" in out


def test_an_unsigned_settings_commit_never_becomes_a_jobs_source_commit(repo: Repo) -> None:
    spec = rollout_yaml("r", target=NEW, nodeIds=["web-1", "web-2"], live=True)
    signed = repo.push({"rollouts/r.yaml": spec}, "Start r", signed=True)
    repo.run_until(lambda: any(p["node"] == "web-1" for p in repo.accepted()))
    settings = "apiVersion: reconciler/v1\nkind: Settings\nspec: {offlineAfter: 9m}\n"
    unsigned = repo.push({"reconciler.yaml": settings}, "Settings", signed=False)
    repo.run_until(lambda: any(p["node"] == "web-2" for p in repo.accepted()))

    sources = {p["node"]: p["sourceCommit"] for p in repo.accepted()}
    assert sources == {"web-1": signed, "web-2": signed}, unsigned
    assert (repo.status("r") or {})["specCommit"] == signed


def test_an_unverified_rollout_waits_as_unverified_with_what_is_missing_now(
    fast: Repo, tmp_path: Path
) -> None:
    bob = make_key(tmp_path / "bob", comment="bob").private
    fast.signers.write_text(
        fast.signers.read_text() + f"bob@example.com {bob.with_suffix('.pub').read_text()}"
    )
    fast.extra = ["--require-approvals", "1"]
    spec = rollout_yaml("r", target=NEW, nodeIds=["web-1"], live=True)
    fast.push({"rollouts/r.yaml": spec}, "Start r", signed=True)
    fast.run_until(lambda: fast.phase("r") == "pending")
    status = fast.status("r") or {}
    assert status["reason"] == "unverified", status
    assert "has 0" in status["message"]

    # Changed by a push without a key: the message says so, not the old why.
    fast.push({"rollouts/r.yaml": spec + "# unsigned\n"}, "Touch r", signed=False)
    fast.run_until(lambda: "not signed" in (fast.status("r") or {})["message"])
    status = fast.status("r") or {}
    assert status["reason"] == "unverified", status
    assert "has 0" not in status["message"]


def test_a_status_branch_forced_back_to_an_older_daemon_signed_commit_is_held(
    on_status_branch: Repo, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = on_status_branch
    spec = rollout_yaml("r", target=NEW, nodeIds=["web-1", "web-2"], live=True)
    repo.push({"rollouts/r.yaml": spec}, "Roll out r", signed=True)
    running = None
    while repo.phase("r") != "completed":
        repo.run_once()
        if repo.phase("r") == "running" and running is None:
            running = git("rev-parse", "reconciler-status", cwd=repo.kit.bare)
    assert running is not None
    repo.git("fetch", "-q", "origin", "reconciler-status")
    repo.git("push", "-q", "--force", "origin", f"{running}:refs/heads/reconciler-status")
    jobs = [p["jobId"] for p in repo.accepted()]
    capsys.readouterr()
    for _ in range(3):
        repo.run_once()
    assert "status/r.yaml went backwards" in capsys.readouterr().err
    assert [p["jobId"] for p in repo.accepted()] == jobs
    assert repo.phase("r") == "running"


def test_a_rollout_only_in_an_unsigned_commit_gets_no_status_file(
    fast: Repo, capsys: pytest.CaptureFixture[str]
) -> None:
    fast.push({"rollouts/newname.yaml": rollout_yaml("newname", target=NEW, nodeIds=["web-1"])},
              "A rollout nobody signed", signed=False)  # fmt: skip
    capsys.readouterr()
    for _ in range(3):
        fast.run_once()
    log = capsys.readouterr().err
    assert fast.status("newname") is None
    assert fast.accepted() == []
    assert "rollouts/newname.yaml is only in commits that are not verified" in log, log
    code, out = fast.verify(capsys)
    assert code == 1, out
    assert "rollouts/newname.yaml is only in commits that are not verified" in out, out
