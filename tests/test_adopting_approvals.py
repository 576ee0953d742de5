"""Turning verification and approvals on for a fleet already in use: the
daemon's own finished statuses stay as they are, claim no nodes, and a new
rollout on the same nodes starts once signed and approved. Real `git`,
`ssh-keygen` signatures and approvals, the daemon's ``run --once`` (a
restart every pass) against the simulated fleet.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.cli.main import main
from reconciler.daemon.state import DaemonState, default_state_root
from reconciler.git.approval import Approver, load_allowed_signers
from reconciler.git.store import GitStore
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.git import git
from tests.kit.keys import make_key
from tests.kit.signed import NEW, NODES, OLD, Repo


def test_turning_approvals_on_keeps_finished_rollouts_and_starts_a_new_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kit = FleetKit.create(tmp_path, NODES)
    try:
        repo = Repo(kit, tmp_path)
        bob = make_key(tmp_path / "bob", comment="bob").private
        repo.signers.write_text(
            repo.signers.read_text() + f"bob@example.com {bob.with_suffix('.pub').read_text()}"
        )
        repo.extra = ["--sign-commits"]
        for name, target in (("old", OLD), ("new", NEW)):
            spec = rollout_yaml(name, target=target, nodeIds=["web-1", "web-2"], live=True)
            repo.push({f"rollouts/{name}.yaml": spec}, f"Roll out {name}", signed=True)
            repo.run_until(lambda name=name: repo.phase(name) == "completed")  # type: ignore[misc]
        before = git("show", "main:status/README.md", cwd=kit.bare)
        assert "old" in before and "new" in before

        # The daemon restarts with approvals asked for: nothing it wrote is
        # called tampered, and the finished rollouts stay on the dashboard.
        repo.extra = ["--sign-commits", "--require-approvals", "1"]
        capsys.readouterr()
        for _ in range(3):
            repo.run_once()
        err = capsys.readouterr().err
        assert "status_tampered" not in err and "verified_moved_back" not in err, err
        dashboard = git("show", "main:status/README.md", cwd=kit.bare)
        assert "status_tampered" not in dashboard
        assert "old" in dashboard and "new" in dashboard
        assert repo.phase("old") == repo.phase("new") == "completed"
        daemon_key = str(kit.root / "keys" / "reconciler.pub")
        approvals = ("--require-approvals", "1", "--daemon-key", daemon_key)
        code, out = repo.verify(capsys, *approvals)
        assert "status_tampered" not in out, out  # verify agrees: nothing tampered

        # A new rollout on the same nodes, signed by ada and approved by bob.
        spec = rollout_yaml("newer", target=OLD, nodeIds=["web-1", "web-2"], live=True)
        change = repo.push({"rollouts/newer.yaml": spec}, "Roll out newer", signed=True)
        argv = ["approve", change, "--key", str(bob), "--repo", str(kit.work), "--push"]
        assert main(argv) == 0
        repo.run_until(lambda: repo.phase("newer") == "completed")
        status = repo.status("newer") or {}
        assert [a["principal"] for a in status["approvedBy"]] == ["bob@example.com"]
        assert "waits for rollout" not in git("show", "main:status/README.md", cwd=kit.bare)
        code, out = repo.verify(capsys, *approvals)
        assert code == 0, out
    finally:
        kit.close()


def test_an_approval_that_arrives_later_releases_a_rollout_started_before_approvals(
    tmp_path: Path,
) -> None:
    behaviour = "default: succeed\nnodes:\n  web-1: {action: succeed, delay: 1.5}\n"
    kit = FleetKit.create(tmp_path, NODES, behaviour=behaviour)
    try:
        repo = Repo(kit, tmp_path)
        bob = make_key(tmp_path / "bob", comment="bob").private
        repo.signers.write_text(
            repo.signers.read_text() + f"bob@example.com {bob.with_suffix('.pub').read_text()}"
        )
        spec = rollout_yaml("r", target=NEW, nodeIds=["web-1", "web-2"], live=True)
        start = repo.push({"rollouts/r.yaml": spec}, "Roll out r", signed=True)
        repo.run_until(lambda: any(p["node"] == "web-1" for p in repo.accepted()))

        # One long-running daemon, now asking for an approval: r is held as
        # started under the old policy ...
        state = DaemonState.for_branch(default_state_root(), str(kit.bare), "main")
        store = GitStore.open(str(kit.bare), "main")
        approver = Approver(
            store.repository(), load_allowed_signers(repo.signers), required_approvals=1
        )
        daemon = kit.daemon(approver=approver, state=state)
        for _ in range(3):
            daemon.run_pass()
        dashboard = git("show", "main:status/README.md", cwd=kit.bare)
        assert "not verifiable under the current policy" in dashboard
        assert [p["node"] for p in repo.accepted()] == ["web-1"]

        # ... until bob approves the commit it started from.
        assert main(["approve", start, "--key", str(bob), "--repo", str(kit.work), "--push"]) == 0
        kit.run_until(daemon, lambda s: s["r"]["phase"] == "completed", timeout=60)
    finally:
        kit.close()
