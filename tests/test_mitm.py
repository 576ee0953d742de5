"""A man in the middle with no key, between the daemon's agent client and
a real agent on 127.0.0.1 (docs/trust.md): what it relays in place of the
agent's answers is no evidence for a node with ``agentKey``."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from reconciler.daemon.agent_client import AgentClient
from reconciler.daemon.answer_check import AnswerCheck
from reconciler.spec.model import Node, Target
from tests.kit.agents import AgentThread
from tests.kit.http import request
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.mitm import Mitm


def test_a_signed_heartbeat_relayed_as_a_refusal_refuses_nothing(tmp_path: Path) -> None:
    daemon_key = make_key(tmp_path / "d" / "reconciler").signing
    agent_key = make_key(tmp_path / "a" / "reconciler").signing
    agent = AgentThread(tmp_path / "state", [daemon_key], key=agent_key)
    _, beat = request(agent.url, "GET", "/v1/nodes/node-a/heartbeat")
    heartbeat = json.dumps(beat).encode()

    def refuse_with_heartbeat(
        method: str, target: str, status: int, body: bytes
    ) -> tuple[int, bytes]:
        return (400, heartbeat) if method == "POST" else (status, body)

    mitm = Mitm(agent.url, refuse_with_heartbeat)
    node = Node("node-a", mitm.url, agent_key=agent_key.public_openssh)
    check = AnswerCheck()
    sent = job("apply-0001", mode="dry_run")
    try:
        with AgentClient(daemon_key, timeout=5) as client:
            seen = client.send_jobs([(mitm.url, sent)], datetime.now(UTC))[sent.job_id]
    finally:
        mitm.close()
        agent.close()
    assert seen.state == "refused" and seen.signed is not None  # the heartbeat's evidence verifies
    believed, problem = check.job(node, seen)
    assert believed.state == "unreachable"
    assert problem == "the refusal is not signed over job apply-0001"
    # A node without agentKey is believed as in version 1: the 400 refuses.
    plain = replace(node, agent_key=None)
    assert check.job(plain, seen) == (replace(seen, signed=None), "")


def test_a_refusal_counts_only_for_the_job_it_names(tmp_path: Path) -> None:
    daemon_key = make_key(tmp_path / "d" / "reconciler").signing
    agent_key = make_key(tmp_path / "a" / "reconciler").signing
    # Dry runs only: a live job is refused, signed, as live_not_allowed.
    agent = AgentThread(tmp_path / "state", [daemon_key], key=agent_key, allow_live=False)
    first, second = job("apply-0001"), job("apply-0002")
    refusals: dict[str, bytes] = {}

    def swap(method: str, target: str, status: int, body: bytes) -> tuple[int, bytes]:
        # The first refusal is kept, and relayed in place of every later one.
        if method != "POST":
            return status, body
        return status, refusals.setdefault("first", body)

    mitm = Mitm(agent.url, swap)
    node = Node("node-a", mitm.url, agent_key=agent_key.public_openssh)
    check = AnswerCheck()
    try:
        with AgentClient(daemon_key, timeout=5) as client:
            one = client.send_jobs([(mitm.url, first)], datetime.now(UTC))[first.job_id]
            two = client.send_jobs([(mitm.url, second)], datetime.now(UTC))[second.job_id]
    finally:
        mitm.close()
        agent.close()
    assert check.job(node, one) == (one, "")
    assert one.state == "refused" and one.error.startswith("live_not_allowed")
    believed, problem = check.job(node, two)
    assert two.state == "refused" and believed.state == "unreachable"
    assert problem == "the refusal is not signed over job apply-0002"


def test_a_refusal_of_a_body_with_no_job_id_names_no_job(tmp_path: Path) -> None:
    daemon_key = make_key(tmp_path / "d" / "reconciler").signing
    agent_key = make_key(tmp_path / "a" / "reconciler").signing
    agent = AgentThread(tmp_path / "state", [daemon_key], key=agent_key)
    try:
        _, broken = request(agent.url, "POST", "/v1/nodes/node-a/jobs", b"not json")
        _, empty = request(agent.url, "POST", "/v1/nodes/node-a/jobs", b"{}")
    finally:
        agent.close()
    for refusal in (broken, empty):
        assert refusal["error"] == "invalid_job" and refusal["node"] == "node-a"
        assert "jobId" not in refusal and "evidence" in refusal


def test_a_replayed_older_heartbeat_is_no_evidence(tmp_path: Path) -> None:
    daemon_key = make_key(tmp_path / "d" / "reconciler").signing
    agent_key = make_key(tmp_path / "a" / "reconciler").signing
    agent = AgentThread(tmp_path / "state", [daemon_key], key=agent_key)
    kept: list[bytes] = []

    def replay_first(method: str, target: str, status: int, body: bytes) -> tuple[int, bytes]:
        return status, kept[0] if kept else body

    mitm = Mitm(agent.url, replay_first)
    node = Node("node-a", mitm.url, agent_key=agent_key.public_openssh)
    check = AnswerCheck()
    try:
        with AgentClient(daemon_key, timeout=5) as client:
            old = client.read_heartbeats([(mitm.url, "node-a")])["node-a"]
            assert old is not None
            evidence = {"keyId": old.signed.key_id, "signature": old.signed.signature}
            kept.append(json.dumps(old.signed.body | {"evidence": evidence}).encode())
            # The agent's own newer heartbeat is believed ...
            fresh = client.read_heartbeats([(agent.url, "node-a")])["node-a"]
            replayed = client.read_heartbeats([(mitm.url, "node-a")])["node-a"]
    finally:
        mitm.close()
        agent.close()
    assert old is not None and fresh is not None and replayed is not None
    assert check.heartbeat(node, old) == (old, "")
    assert fresh.time > old.time and check.heartbeat(node, fresh) == (fresh, "")
    # ... and the old one, signed and replayed after it, is not.
    assert replayed.time == old.time
    believed, problem = check.heartbeat(node, replayed)
    assert believed is None and "older than one already believed" in problem
    # The same heartbeat read twice is not a replay of an older one.
    assert check.heartbeat(node, fresh) == (fresh, "")
    # Without agentKey nothing is checked, as in version 1.
    plain = replace(node, agent_key=None)
    assert check.heartbeat(plain, replayed) == (replace(replayed, signed=None), "")


def test_a_relabelled_backup_list_is_no_evidence(tmp_path: Path) -> None:
    daemon_key = make_key(tmp_path / "d" / "reconciler").signing
    agent_key = make_key(tmp_path / "a" / "reconciler").signing
    (tmp_path / "state" / "runtimes").mkdir(parents=True)
    (tmp_path / "state" / "runtimes" / "hermes.yaml").write_text(
        "provider: vllm\nmodel: m-base\nprofile: default\n"
    )
    agent = AgentThread(tmp_path / "state", [daemon_key], key=agent_key)
    for n, model in ((1, "m-old"), (2, "m-new")):
        target = Target("hermes", "vllm", model, "default")
        send = job(f"apply-000{n}", attempt=n, target=target, rollout=f"r{n}")
        assert agent.post(envelope(send, daemon_key))[0] == 202
        assert agent.wait_finished(send.job_id)["state"] == "succeeded"

    def relabel(method: str, target: str, status: int, body: bytes) -> tuple[int, bytes]:
        # The older backup claims to be the one this rollout's job took.
        data = json.loads(body)
        if "backups" in target and isinstance(data, dict):
            for backup in data["backups"]:
                backup["jobId"], backup["rollout"] = "apply-0002", "r2"
        return status, json.dumps(data).encode()

    mitm = Mitm(agent.url, relabel)
    node = Node("node-a", mitm.url, agent_key=agent_key.public_openssh)
    check = AnswerCheck()
    try:
        with AgentClient(daemon_key, timeout=5) as client:
            honest = client.read_backups([(agent.url, "node-a")])["node-a"]
            relabelled = client.read_backups([(mitm.url, "node-a")])["node-a"]
    finally:
        mitm.close()
        agent.close()
    assert honest is not None and relabelled is not None
    assert [b.job_id for b in honest.backups] == ["apply-0002", "apply-0001"]
    assert check.backups(node, honest) == (honest, "")
    assert [b.job_id for b in relabelled.backups] == ["apply-0002", "apply-0002"]
    believed, problem = check.backups(node, relabelled)
    assert believed is None and problem == f"bad signature for key {agent_key.key_id}"
    # A bare list, as the agent answers without ?signed=1, carries no evidence.
    bare = replace(honest, signed=None)
    assert check.backups(node, bare)[0] is None
    # A node without agentKey is believed as in version 1.
    plain = replace(node, agent_key=None)
    assert check.backups(plain, relabelled) == (replace(relabelled, signed=None), "")
