"""Signed answers end to end (docs/trust.md): real ``reconciler
agent`` processes started with ``--key``, node files carrying
``spec.agentKey``, the in-process daemon with the real agent client, and
``reconciler verify --evidence`` reading the committed status.

The chain checked here: the daemon believes a node's answers only when its
own key signed them; the verdict keeps those answers in status; anyone can
check them offline against the node file at the rollout's specCommit."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli.main import main as cli
from reconciler.protocol.signing import canonical_json, generate_key, load_private_key
from reconciler.spec.safe_yaml import load_yaml
from tests.kit.documents import node_map, rollout_yaml
from tests.kit.fleets import AgentFleet
from tests.kit.git import git, git_env
from tests.kit.keys import make_key
from tests.kit.ports import HeldPort

OLD = b"provider: ollama\nmodel: llama3-8b\nprofile: default\n"
FAST_OFFLINE = "apiVersion: reconciler/v1\nkind: Settings\nspec: {offlineAfter: 5s}\n"


@pytest.fixture
def fleet(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[AgentFleet]:
    modes: dict[str, str] = request.param
    made = AgentFleet.create(
        tmp_path,
        {name: {"config": OLD, "agent_key": mode} for name, mode in modes.items()},
        files={"reconciler.yaml": FAST_OFFLINE},
    )
    try:
        yield made
    finally:
        made.close()


def verify_evidence(fleet: AgentFleet, name: str, capsys: pytest.CaptureFixture[str]) -> Any:
    capsys.readouterr()
    code = cli(["verify", "--evidence", name, "--repo", str(fleet.bare)])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("fleet", [{"gpu-a1": "own", "gpu-a2": "own"}], indirect=True)
def test_a_rollout_on_signed_evidence_completes_and_verifies_until_a_byte_changes(
    fleet: AgentFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet.push({"rollouts/r.yaml": rollout_yaml("r", nodeIds=["gpu-a1", "gpu-a2"], live=True)})
    daemon = fleet.daemon()
    statuses = fleet.run_until(daemon, lambda s: s.get("r", {}).get("phase") == "completed")

    nodes = node_map(statuses["r"])
    for name in ("gpu-a1", "gpu-a2"):
        evidence = nodes[name]["evidence"]
        assert evidence["jobRecord"]["jobId"] == nodes[name]["jobId"]
        assert evidence["jobRecord"]["state"] == "succeeded"
        assert evidence["heartbeat"]["node"] == name  # live: the heartbeat the verdict used
        assert evidence["keyId"].startswith("SHA256:")
    code, out = verify_evidence(fleet, "r", capsys)
    assert code == 0, out
    assert "gpu-a1  ok: job record and heartbeat signed by SHA256:" in out
    assert "gpu-a2  ok:" in out

    # Someone edits the recorded evidence of gpu-a2 in a commit: one byte.
    fleet.pull()
    path = fleet.work / "status" / "r.yaml"
    text = path.read_text()
    signature = nodes["gpu-a2"]["evidence"]["signatures"]["jobRecord"]
    at = text.index(signature, text.index("name: gpu-a2")) + 5
    changed = text[:at] + ("B" if text[at] != "B" else "C") + text[at + 1 :]
    assert changed != text and len(changed) == len(text)
    path.write_text(changed)
    git("commit", "-qam", "Touch up the status", cwd=fleet.work)
    fleet.git_push()

    code, out = verify_evidence(fleet, "r", capsys)
    assert code == 1
    assert "gpu-a2  FAILED: job record: bad signature" in out
    assert "gpu-a1  ok:" in out
    assert "evidence does not verify for: gpu-a2" in out


@pytest.mark.parametrize(
    "fleet",
    [{"gpu-a1": "other"}, {"gpu-a1": "unsigned"}],
    indirect=True,
    ids=["another-key", "no-key"],
)
def test_an_agent_without_the_nodes_key_never_gets_its_node_passed(fleet: AgentFleet) -> None:
    fleet.push({"rollouts/r.yaml": rollout_yaml("r", nodeIds=["gpu-a1"], live=True)})
    daemon = fleet.daemon()

    def held(statuses: dict[str, Any]) -> bool:
        fleet.clock.advance(2)  # offlineAfter is 5s of the daemon's clock
        return (statuses.get("r", {}).get("hold") or {}).get("reason") == "health_unknown"

    statuses = fleet.run_until(daemon, held)

    status = statuses["r"]
    node = node_map(status)["gpu-a1"]
    assert node["state"] == "unknown" and node["verdict"] == "unknown"
    assert "evidence" not in node
    assert node["error"].startswith("no evidence: "), node["error"]
    assert status["phase"] == "paused"
    conditions = {c["type"]: c["message"] for c in status["conditions"]}
    assert "gpu-a1" in conditions["unverified_evidence"]
    # The job itself went out (the daemon signs what it sends) and the agent ran it:
    # what was missing is only its believable word.
    assert [r["state"] for r in fleet.agents["gpu-a1"].journal()] == ["succeeded"]


def test_tls_with_the_pinned_certificate_completes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made = AgentFleet.create(
        tmp_path / "tls",
        {"gpu-a1": {"config": OLD, "agent_key": "own", "tls": "pinned"}},
    )
    try:
        assert made.agents["gpu-a1"].url.startswith("https://")
        made.push({"rollouts/r.yaml": rollout_yaml("r", nodeIds=["gpu-a1"], live=True)})
        daemon = made.daemon()
        statuses = made.run_until(daemon, lambda s: s.get("r", {}).get("phase") == "completed")
        assert node_map(statuses["r"])["gpu-a1"]["evidence"]["jobRecord"]["state"] == "succeeded"
        # The CLI verbs that talk to agents accept the pinned certificate too.
        capsys.readouterr()
        assert cli(["backups", "gpu-a1", "--repo", str(made.bare)]) == 0
        assert "gpu-a1 (https://127.0.0.1:" in capsys.readouterr().out
    finally:
        made.close()


@pytest.mark.parametrize(
    "mode", ["other", "downgrade"], ids=["another-certificate", "http-downgrade"]
)
def test_no_job_reaches_an_agent_that_is_not_the_pinned_one(
    tmp_path: Path, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    made = AgentFleet.create(
        tmp_path, {"gpu-a1": {"config": OLD, "tls": mode}}, files={"reconciler.yaml": FAST_OFFLINE}
    )
    try:
        made.push({"rollouts/r.yaml": rollout_yaml("r", nodeIds=["gpu-a1"], live=True)})
        daemon = made.daemon()

        def held(statuses: dict[str, Any]) -> bool:
            made.clock.advance(2)
            return (statuses.get("r", {}).get("hold") or {}).get("reason") == "health_unknown"

        made.run_until(daemon, held)
        assert made.agents["gpu-a1"].journal() == []  # nothing was delivered, ever
        assert made.agents["gpu-a1"].config_bytes() == OLD
        capsys.readouterr()
        assert cli(["backups", "gpu-a1", "--repo", str(made.bare)]) == 1
        err = capsys.readouterr().err
        assert "gpu-a1" in err
        if mode == "other":
            assert "is not the pinned one" in err and "nothing sent" in err
    finally:
        made.close()


def test_the_fleet_watch_checks_heartbeats_against_the_agent_key(tmp_path: Path) -> None:
    made = AgentFleet.create(
        tmp_path,
        {
            "gpu-a1": {"config": OLD, "agent_key": "own"},
            "gpu-a2": {"config": OLD, "agent_key": "other"},
            "gpu-a3": {"config": OLD},
        },
    )
    try:
        daemon = made.daemon()
        daemon.run_pass()  # reads the fleet, as every pass does before a sweep
        sweep = daemon.fleet_watch.sweep(
            [(agent.url, name) for name, agent in sorted(made.agents.items())]
        )
        verified = {s.name: s.verified for s in sweep.sightings}
        assert verified == {"gpu-a1": True, "gpu-a2": False, "gpu-a3": None}
    finally:
        made.close()


@pytest.mark.parametrize("fleet", [{"gpu-a1": "own", "gpu-a2": "own"}], indirect=True)
def test_a_rollback_on_signed_evidence_keeps_the_restore_record_and_verifies(
    fleet: AgentFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet.push({"rollouts/r.yaml": rollout_yaml("r", nodeIds=["gpu-a1", "gpu-a2"], live=True)})
    daemon = fleet.daemon()
    fleet.run_until(daemon, lambda s: s.get("r", {}).get("phase") == "completed")
    fleet.pull()
    done = subprocess.run(
        [sys.executable, "-m", "reconciler", "rollback", "r", "--nodes", "gpu-a1",
         "--repo", str(fleet.work), "--commit"],
        env=git_env("Rita Rollback", "rita@example.com"), capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    fleet.git_push()

    def rolled_back(statuses: dict[str, Any]) -> bool:
        return node_map(statuses.get("r", {})).get("gpu-a1", {}).get("state") == "rolled_back"

    statuses = fleet.run_until(daemon, rolled_back)
    restore = node_map(statuses["r"])["gpu-a1"]["restore"]
    assert fleet.agents["gpu-a1"].config_bytes() == OLD  # the restore ran
    kept = restore["evidence"]
    assert kept["jobRecord"]["jobId"] == restore["jobId"]
    assert kept["jobRecord"]["state"] == "succeeded"
    assert kept["heartbeat"] is None and kept["keyId"].startswith("SHA256:")
    code, out = verify_evidence(fleet, "r", capsys)
    assert code == 0, out
    assert "gpu-a1  ok: job record and heartbeat signed by SHA256:" in out
    assert "; restore job record signed by SHA256:" in out and "(rolled_back)" in out

    # One byte of the kept restore record changes in a commit: the node fails.
    fleet.pull()
    path = fleet.work / "status" / "r.yaml"
    text = path.read_text()
    at = text.index("backupId:", text.index("restore:", text.index("name: gpu-a1")))
    at = text.index("backupId:", text.index("evidence:", at)) + len("backupId: ") + 2
    changed = text[:at] + ("x" if text[at] != "x" else "y") + text[at + 1 :]
    assert changed != text
    path.write_text(changed)
    git("commit", "-qam", "Touch up the restore", cwd=fleet.work)
    fleet.git_push()
    code, out = verify_evidence(fleet, "r", capsys)
    assert code == 1
    assert "gpu-a1  FAILED: restore job record: bad signature" in out
    assert "gpu-a2  ok:" in out


@pytest.mark.parametrize("fleet", [{"gpu-a1": "own"}], indirect=True)
def test_a_restore_the_policy_decided_keeps_its_signed_record(
    fleet: AgentFleet, held_port: HeldPort, capsys: pytest.CaptureFixture[str]
) -> None:
    # The apply succeeds, its health check fails (nothing listens on the
    # port), so the rollback policy restores the node on its own.
    closed = held_port.port
    health = (
        "{interval: 1s, failureThreshold: 1, "
        f"checks: [{{name: ready, tcp: {{host: 127.0.0.1, port: {closed}}}}}]}}"
    )
    fleet.push(
        {
            "rollouts/r.yaml": rollout_yaml(
                "r", nodeIds=["gpu-a1"], live=True, onFailure="rollback", health=health
            )
        }
    )
    daemon = fleet.daemon()

    def restored(statuses: dict[str, Any]) -> bool:
        fleet.clock.advance(1)
        node = node_map(statuses.get("r", {})).get("gpu-a1", {})
        return (node.get("restore") or {}).get("finishedAt") is not None

    statuses = fleet.run_until(daemon, restored)
    node = node_map(statuses["r"])["gpu-a1"]
    assert node["restore"]["request"] == "policy"
    assert node["restore"]["evidence"]["jobRecord"]["jobId"] == node["restore"]["jobId"]
    code, out = verify_evidence(fleet, "r", capsys)
    assert code == 0, out
    assert "restore job record signed by" in out


def test_answers_signed_by_a_key_from_an_unsigned_node_file_do_not_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = AgentFleet.create(
        tmp_path,
        {"gpu-a1": {"config": OLD, "agent_key": "own"}},
        files={"reconciler.yaml": FAST_OFFLINE},
    )
    try:
        alice = make_key(tmp_path / "alice", comment="alice").private
        signers = tmp_path / "allowed_signers"
        signers.write_text(f"alice@example.com {alice.with_suffix('.pub').read_text()}")
        spec = fleet.work / "rollouts" / "r.yaml"
        spec.parent.mkdir(exist_ok=True)
        spec.write_text(rollout_yaml("r", nodeIds=["gpu-a1"], live=True))
        env = git_env()
        git("add", "-A", cwd=fleet.work, env=env)
        git("-c", "gpg.format=ssh", "-c", f"user.signingKey={alice}", "commit", "-qS",
            "-m", "Roll out r", cwd=fleet.work, env=env)  # fmt: skip
        fleet.git_push()
        fleet.run_until(fleet.daemon(), lambda s: s.get("r", {}).get("phase") == "completed")
        checked = ["verify", "--evidence", "r", "--repo", str(fleet.bare)]
        capsys.readouterr()
        assert cli([*checked, "--allowed-signers", str(signers)]) == 0, capsys.readouterr().out

        # Without a key: a node file naming the pusher's own agentKey, then a
        # status pointing specCommit at it, its answers signed by that key.
        mallory = load_private_key(generate_key(tmp_path / "mallory", "agent")[0])
        fleet.pull()
        node = fleet.work / "nodes" / "gpu-a1.yaml"
        text = node.read_text()
        line = next(x for x in text.splitlines() if "agentKey" in x)
        node.write_text(text.replace(line, f'  agentKey: "{mallory.public_openssh}"'))
        git("commit", "-qam", "Rotate the key", cwd=fleet.work, env=env)
        fake = git("rev-parse", "HEAD", cwd=fleet.work)
        path = fleet.work / "status" / "r.yaml"
        status = json.loads(json.dumps(load_yaml("r", path.read_bytes())))
        status["specCommit"] = fake
        evidence = node_map(status)["gpu-a1"]["evidence"]
        for part in ("jobRecord", "heartbeat"):
            signature = base64.b64encode(mallory.sign(canonical_json(evidence[part])))
            evidence["signatures"][part] = signature.decode("ascii")
        evidence["keyId"] = mallory.key_id
        text = json.dumps(status)  # YAML reads JSON
        path.write_text(text)
        git("commit", "-qam", "Record the answers", cwd=fleet.work, env=env)
        fleet.git_push()

        assert cli(checked) == 0  # the keys of the tip's history take it
        capsys.readouterr()
        assert cli([*checked, "--allowed-signers", str(signers)]) == 1
        out = capsys.readouterr().out
        assert f"specCommit {fake[:12]} is not a verified commit" in out
    finally:
        fleet.close()
