"""The daemon's modes: status on its own branch, a remote repository,
verified spec commits and signed status commits (docs/configuration.md and docs/architecture.md and docs/trust.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.daemon.agent_client import AgentClient
from reconciler.daemon.loop import Daemon
from reconciler.git.approval import Approver, load_allowed_signers
from reconciler.git.sshsig import sign_commit_payload
from reconciler.git.store import GitStore
from reconciler.protocol.signing import load_private_key
from reconciler.spec.safe_yaml import load_yaml
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.git import git, git_env
from tests.kit.keys import make_key

NODES = {"web-1": {"role": "web"}, "web-2": {"role": "web"}}


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[FleetKit]:
    kit = FleetKit.create(tmp_path, NODES)
    yield kit
    kit.close()


def status_on(kit: FleetKit, branch: str, name: str) -> dict:  # type: ignore[type-arg]
    text = git("show", f"{branch}:status/{name}.yaml", cwd=kit.bare)
    return dict(load_yaml(name, text.encode()))


def run_until_phase(kit: FleetKit, daemon: Daemon, branch: str, name: str, phase: str) -> None:
    for _ in range(200):
        daemon.run_pass()
        try:
            if status_on(kit, branch, name)["phase"] == phase:
                return
        except AssertionError:
            pass  # no status yet
    raise AssertionError(f"{name} never reached {phase} on {branch}")


def test_with_a_status_branch_main_is_never_written(kit: FleetKit) -> None:
    settings = "apiVersion: reconciler/v1\nkind: Settings\nspec: {statusBranch: fleet-status}\n"
    main_before = kit.push(
        {"reconciler.yaml": settings, "rollouts/web.yaml": rollout_yaml("web", nodeIds=["web-1"])}
    )
    daemon = kit.daemon()

    run_until_phase(kit, daemon, "fleet-status", "web", "completed")

    assert git("rev-parse", "main", cwd=kit.bare) == main_before
    tree = git("ls-tree", "-r", "--name-only", "fleet-status", cwd=kit.bare).split()
    assert tree and all(path.startswith("status/") for path in tree)


def test_a_remote_repository_is_mirrored_and_pushed_to(kit: FleetKit, tmp_path: Path) -> None:
    kit.push({"rollouts/web.yaml": rollout_yaml("web", nodeIds=["web-1", "web-2"])})
    store = GitStore.open(f"file://{kit.bare}", "main", cache_dir=tmp_path / "cache")
    daemon = Daemon(store, AgentClient(load_private_key(kit.key_path)))
    kit.daemons.append(daemon)

    run_until_phase(kit, daemon, "main", "web", "completed")

    assert store.is_remote
    assert git("rev-parse", "main", cwd=kit.bare) == store.tip("main")


def test_an_unsigned_spec_change_is_not_acted_on_and_says_why(
    kit: FleetKit, tmp_path: Path
) -> None:
    alice = make_key(tmp_path / "alice").private
    signers = tmp_path / "allowed_signers"
    signers.write_text(f"alice@example.com {(alice.with_suffix('.pub')).read_text()}")
    sign = ["-c", "gpg.format=ssh", "-c", f"user.signingKey={alice}"]
    work = kit.work
    env = git_env()

    def commit(files: dict[str, str], message: str, signed: bool) -> None:
        git("pull", "-q", "--ff-only", "origin", "main", cwd=work, env=env)
        for rel, text in files.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(text)
        git("add", "-A", cwd=work, env=env)
        git(
            *(sign if signed else []),
            "commit",
            "-q",
            *(["-S"] if signed else []),
            "-m",
            message,
            cwd=work,
            env=env,
        )
        git("push", "-q", "origin", "HEAD:main", cwd=work, env=env)

    store = GitStore.open(str(kit.bare), "main")
    approver = Approver(store.repository(), load_allowed_signers(signers))
    daemon = Daemon(store, AgentClient(load_private_key(kit.key_path)), approver=approver)
    kit.daemons.append(daemon)
    commit(
        {"rollouts/web.yaml": rollout_yaml("web", nodeIds=["web-1"])},
        "Unsigned rollout",
        signed=False,
    )

    daemon.run_pass()

    # A name only a commit nobody signed has becomes no status file.
    assert git("ls-tree", "--name-only", "main", "status/web.yaml", cwd=kit.bare) == ""
    assert kit.fleet.stats()["received"] == {}

    commit(
        {"rollouts/web.yaml": rollout_yaml("web", nodeIds=["web-1"], batchSize=1)},
        "Signed",
        signed=True,
    )
    run_until_phase(kit, daemon, "main", "web", "completed")


def test_signed_status_commits_pass_git_verify_commit(kit: FleetKit, tmp_path: Path) -> None:
    kit.push({"rollouts/web.yaml": rollout_yaml("web", nodeIds=["web-1"])})
    key = load_private_key(kit.key_path)
    signers = tmp_path / "daemon_signers"
    signers.write_text(f"reconciler {key.public_openssh}\n")
    daemon = kit.daemon(sign=lambda payload: sign_commit_payload(key.private_key, payload))

    run_until_phase(kit, daemon, "main", "web", "completed")

    commits = git("log", "--author=reconciler", "--format=%H", "main", cwd=kit.bare).split()
    assert commits
    for sha in commits:
        git("-c", f"gpg.ssh.allowedSignersFile={signers}", "verify-commit", sha, cwd=kit.bare)


def test_turning_verification_on_with_nothing_signed_aborts_nothing(
    kit: FleetKit, tmp_path: Path
) -> None:
    # A rollout ran before verification was turned on; no spec commit is
    # signed yet. The daemon must hold it, not read its unverified file as
    # removed and abort it.
    kit.push({"rollouts/web.yaml": rollout_yaml("web", nodeIds=["web-1"], pauseAfter=[1])})
    run_until_phase(kit, kit.daemon(), "main", "web", "running")
    alice = make_key(tmp_path / "alice").private
    signers = tmp_path / "allowed_signers"
    signers.write_text(f"alice@example.com {(alice.with_suffix('.pub')).read_text()}")
    store = GitStore.open(str(kit.bare), "main")
    approver = Approver(store.repository(), load_allowed_signers(signers))
    daemon = Daemon(store, AgentClient(load_private_key(kit.key_path)), approver=approver)
    kit.daemons.append(daemon)

    for _ in range(5):
        daemon.run_pass()

    # It started from a change nobody signed: nothing it carries is
    # verified, so it is held as it stands (docs/trust.md).
    status = status_on(kit, "main", "web")
    assert status["phase"] in ("running", "paused")
    dashboard = git("show", "main:status/README.md", cwd=kit.bare)
    assert "status_tampered: status/web.yaml is not verified" in dashboard
