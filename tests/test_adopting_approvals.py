"""Turning verification and approvals on for a fleet already in use: the
daemon's own finished statuses stay as they are, claim no nodes, the
fleet's desired state (``status/fleet.yaml``) stays, and a new rollout on
the same nodes starts once signed and approved. Real `git`,
`ssh-keygen` signatures and approvals, the daemon's ``run --once`` (a
restart every pass) against the simulated fleet.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli.main import main
from reconciler.daemon.state import DaemonState, default_state_root
from reconciler.git.approval import Approver, load_allowed_signers
from reconciler.git.sshsig import parse_allowed_signers, sign_commit_payload
from reconciler.git.store import GitStore
from reconciler.git.watch import BranchWatcher
from reconciler.protocol.signing import load_private_key
from reconciler.readers.fleet_reader import read_fleet_status
from reconciler.spec.fleet_status import FleetStatus
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import AgentFleet, FleetKit
from tests.kit.git import git
from tests.kit.keys import make_key
from tests.kit.signed import NEW, NODES, OLD, Repo
from tests.kit.waiting import wait_for


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


FLEET_SETTINGS = (
    "apiVersion: reconciler/v1\nkind: Settings\n"
    "spec:\n  offlineAfter: 3s\n  fleetCheck: {interval: 1s}\n"
)
AGENT_CONFIG = b"provider: ollama\nmodel: llama3-8b\nprofile: default\n"
HAND_EDITED = b"provider: ollama\nmodel: hand-edited\nprofile: default\n"


def _fleet_status(fleet: AgentFleet) -> FleetStatus | None:
    listed = git("ls-tree", "--name-only", "main", "status/", cwd=fleet.bare).split()
    if "status/fleet.yaml" not in listed:
        return None
    data = git("show", "main:status/fleet.yaml", cwd=fleet.bare).encode()
    return read_fleet_status("status/fleet.yaml", data)


def _desired(fleet: AgentFleet) -> dict[str, tuple[str, str, str] | None]:
    status = _fleet_status(fleet)
    found: dict[str, tuple[str, str, str] | None] = {}
    for node in status.nodes if status is not None else ():
        wanted = node.runtimes[0].desired if node.runtimes else None
        found[node.name] = None if wanted is None else (node.state, wanted.model, wanted.rollout)
    return found


class _Serving:
    """One long-running daemon loop (``Daemon.serve`` with its branch watch
    and fleet watch) in a thread, as ``reconciler run`` runs it."""

    def __init__(self, fleet: AgentFleet, approver: Approver, **daemon: Any) -> None:
        state = DaemonState.for_branch(default_state_root(), str(fleet.bare), "main")
        self.daemon = fleet.daemon(approver=approver, state=state, **daemon)
        self.watcher = BranchWatcher.local(fleet.bare, ["main"])
        self.thread = threading.Thread(
            target=self.daemon.serve, args=(self.watcher,), kwargs={"interval": 0.2}
        )
        self.thread.start()

    def stop(self) -> None:
        self.daemon.stop()
        self.thread.join(30)
        self.watcher.close()
        assert not self.thread.is_alive()


def test_the_fleets_desired_state_survives_turning_on_approvals_on_a_running_fleet(
    tmp_path: Path,
) -> None:
    nodes = {name: {"config": AGENT_CONFIG} for name in ("gpu-a1", "gpu-a2")}
    fleet = AgentFleet.create(tmp_path, nodes, files={"reconciler.yaml": FLEET_SETTINGS})
    ada = make_key(tmp_path / "ada", comment="ada").private
    signers = tmp_path / "allowed_signers"
    signers.write_text(f"ada@example.com {ada.with_suffix('.pub').read_text()}")
    store = GitStore.open(str(fleet.bare), "main")
    allowed = load_allowed_signers(signers)
    serving: _Serving | None = None
    try:
        # In use with signed commits: a live rollout, and the fleet watch's desired state.
        serving = _Serving(fleet, Approver(store.repository(), allowed))
        spec = rollout_yaml("llama", nodeIds=["gpu-a1", "gpu-a2"], batchSize=2, live=True)
        (fleet.work / "rollouts").mkdir()
        (fleet.work / "rollouts" / "llama.yaml").write_text(spec)
        # Signed as ada's git config says, the replay onto the daemon's commits too.
        for key, value in (("gpg.format", "ssh"), ("user.signingKey", str(ada))):
            git("config", key, value, cwd=fleet.work)
        git("config", "commit.gpgsign", "true", cwd=fleet.work)
        git("add", "-A", cwd=fleet.work)
        git("commit", "-q", "-m", "Roll out llama", cwd=fleet.work)
        fleet.git_push()
        settled = dict.fromkeys(nodes, ("ok", "llama3.1-8b", "llama"))
        wait_for(lambda: _desired(fleet) == settled, 90, "every node ok as llama left it")
        serving.stop()

        # The same daemon restarted asking for an approval of every spec commit.
        serving = _Serving(fleet, Approver(store.repository(), allowed, required_approvals=1))
        wait_for(lambda: serving.daemon.fleet_watch.sweeps >= 3, 60, "three sweeps")
        kept = _desired(fleet)
        phase = fleet.statuses()["llama"]["phase"]

        # Drift is still told from the desired state.
        fleet.agents["gpu-a1"].config_path.write_bytes(HAND_EDITED)
        drifted = wait_for(
            lambda: (d := _desired(fleet)).get("gpu-a1", ("",))[0] == "drift" and d,
            60,
            "gpu-a1 to drift",
        )
    finally:
        if serving is not None:
            serving.stop()
        fleet.close()

    assert kept == settled
    assert phase == "completed"
    assert drifted == {"gpu-a1": ("drift", "llama3.1-8b", "llama"), "gpu-a2": settled["gpu-a2"]}


def test_verify_from_an_operators_clone_reads_the_daemons_state_of_the_bare_repository(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The daemon runs on the bare repository; a person checks from a clone
    of it, on the same machine, as the docs' step 4 says."""
    kit = FleetKit.create(tmp_path, NODES)
    try:
        repo = Repo(kit, tmp_path)
        plain = ["run", "--once", "--repo", str(kit.bare), "--key", str(kit.key_path)]
        spec = rollout_yaml("old", target=OLD, nodeIds=["web-1", "web-2"], live=True)
        repo.push({"rollouts/old.yaml": spec}, "Roll out old", signed=False)
        wait_for(lambda: main(plain) == 0 and repo.phase("old") == "completed", 60, "old to end")
        state = DaemonState.for_branch(default_state_root(), str(kit.bare), "main")
        assert state.folder.is_dir()

        # The state directory exists, but the daemon never acted under verification.
        signed = repo.push(
            {"rollouts/new.yaml": rollout_yaml("new", target=NEW, nodeIds=["web-1"], live=True)},
            "Roll out new", signed=True,
        )  # fmt: skip
        code, out = repo.verify(capsys)
        assert "not on this machine" not in out, out
        assert f"the daemon's state ({state.folder}) holds no verified commit yet" in out, out

        repo.run_once()  # verification on: the daemon records its position
        clone_dir = kit.work
        git("fetch", "-q", "origin", cwd=clone_dir)
        git("reset", "-q", "--hard", "origin/main", cwd=clone_dir)
        for where in (kit.bare, clone_dir):
            capsys.readouterr()
            code = main(["verify", "--repo", str(where), "--allowed-signers", str(repo.signers)])
            out = capsys.readouterr().out
            assert code == 0, (where, out)
            assert "status_tampered" not in out and "would NOT" not in out, (where, out)
            assert f"last acted on {signed[:12]} (the daemon's state, {state.folder})" in out
    finally:
        kit.close()


def test_turning_on_signed_status_commits_as_the_docs_say_keeps_the_daemons_earlier_statuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/trust.md, "Turning on verification and approvals", step by
    step, with ``run --once`` against the simulated fleet: a fleet in use
    without any of it, then --allowed-signers and --sign-commits at once."""
    kit = FleetKit.create(tmp_path, NODES)
    try:
        repo = Repo(kit, tmp_path)
        plain = ["run", "--once", "--repo", str(kit.bare), "--key", str(kit.key_path)]
        spec = rollout_yaml("old", target=OLD, nodeIds=["web-1", "web-2"], live=True)
        repo.push({"rollouts/old.yaml": spec}, "Roll out old", signed=False)
        wait_for(lambda: main(plain) == 0 and repo.phase("old") == "completed", 60, "old to end")
        assert main(plain) == 0

        # Step 2: the daemon's key joins the people's in the allowed-signers
        # file, and a signed commit changes a spec path.
        daemon_pub = kit.root / "keys" / "reconciler.pub"
        repo.signers.write_text(
            repo.signers.read_text() + f"reconciler@fleet {daemon_pub.read_text()}"
        )
        spec = rollout_yaml("new", target=NEW, nodeIds=["web-1"], live=True)
        repo.push({"rollouts/new.yaml": spec}, "Roll out new", signed=True)

        # Step 3: restart with --allowed-signers FILE --sign-commits.
        repo.extra = ["--sign-commits"]
        capsys.readouterr()
        repo.run_until(lambda: repo.phase("new") == "completed")
        err = capsys.readouterr().err
        assert "status_tampered" not in err, err
        titles = git("log", "--format=%s", "main", cwd=kit.bare).splitlines()
        assert not [t for t in titles if t.startswith("unreadable status of")], titles
        dashboard = git("show", "main:status/README.md", cwd=kit.bare)
        assert "status_tampered" not in dashboard and "old" in dashboard
        assert repo.phase("old") == "completed"
        capsys.readouterr()
        assert main(["status", "--repo", str(kit.bare), "-o", "json"]) == 0
        listed = capsys.readouterr().out
        assert '"old"' in listed and '"new"' in listed

        # Step 4: verify on the daemon's machine, as the daemon judges.
        code, out = repo.verify(capsys, "--daemon-key", str(daemon_pub))
        assert code == 0, out
        assert "status_tampered" not in out

        # A person's unsigned edit of the adopted status is still held.
        text = git("show", "main:status/old.yaml", cwd=kit.bare)
        repo.push(
            {"status/old.yaml": text.rstrip("\n") + "\n# edited by hand\n"}, "Edit", signed=False
        )
        capsys.readouterr()
        repo.run_once()
        assert "status_tampered: status/old.yaml is not verified" in capsys.readouterr().err
    finally:
        kit.close()


def test_the_fleets_desired_state_and_drift_survive_turning_on_signed_status_commits(
    tmp_path: Path,
) -> None:
    """As the audit found it: a fleet under --allowed-signers, its daemon
    restarted with --sign-commits; drift must stay drift."""
    nodes = {name: {"config": AGENT_CONFIG} for name in ("gpu-a1", "gpu-a2")}
    fleet = AgentFleet.create(tmp_path, nodes, files={"reconciler.yaml": FLEET_SETTINGS})
    ada = make_key(tmp_path / "ada", comment="ada").private
    signers = tmp_path / "allowed_signers"
    daemon_key = load_private_key(fleet.key_path)
    signers.write_text(
        f"ada@example.com {ada.with_suffix('.pub').read_text()}"
        f"reconciler@fleet {daemon_key.public_openssh}\n"
    )
    store = GitStore.open(str(fleet.bare), "main")
    approver = Approver(store.repository(), load_allowed_signers(signers))
    serving: _Serving | None = None
    try:
        serving = _Serving(fleet, approver)
        spec = rollout_yaml("llama", nodeIds=["gpu-a1", "gpu-a2"], batchSize=2, live=True)
        (fleet.work / "rollouts").mkdir()
        (fleet.work / "rollouts" / "llama.yaml").write_text(spec)
        for key, value in (("gpg.format", "ssh"), ("user.signingKey", str(ada))):
            git("config", key, value, cwd=fleet.work)
        git("config", "commit.gpgsign", "true", cwd=fleet.work)
        git("add", "-A", cwd=fleet.work)
        git("commit", "-q", "-m", "Roll out llama", cwd=fleet.work)
        fleet.git_push()
        settled = dict.fromkeys(nodes, ("ok", "llama3.1-8b", "llama"))
        wait_for(lambda: _desired(fleet) == settled, 90, "every node ok as llama left it")
        serving.stop()

        # The same daemon restarted with --sign-commits.
        own = parse_allowed_signers(f'reconciler namespaces="git" {daemon_key.public_openssh}\n')
        serving = _Serving(
            fleet,
            Approver(store.repository(), load_allowed_signers(signers)),
            sign=lambda payload: sign_commit_payload(daemon_key.private_key, payload),
            status_signers=(*own, *approver.allowed),
        )
        wait_for(lambda: serving.daemon.fleet_watch.sweeps >= 3, 60, "three sweeps")
        kept = _desired(fleet)
        assert kept == settled, kept  # the desired state drawn from the daemon's own status
        phase = fleet.statuses()["llama"]["phase"]
        fleet.agents["gpu-a1"].config_path.write_bytes(HAND_EDITED)
        drifted = wait_for(
            lambda: (d := _desired(fleet)).get("gpu-a1", ("",))[0] == "drift" and d,
            60,
            "gpu-a1 to drift",
        )
    finally:
        if serving is not None:
            serving.stop()
        fleet.close()

    titles = git("log", "--format=%s", "main", cwd=fleet.bare).splitlines()
    assert not [t for t in titles if t.startswith("unreadable status of")], titles
    assert phase == "completed"
    assert drifted == {"gpu-a1": ("drift", "llama3.1-8b", "llama"), "gpu-a2": settled["gpu-a2"]}
