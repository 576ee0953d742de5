"""Signed answers (docs/trust.md): what the agent and the simulated
fleet sign, what the daemon's check believes, and how ``spec.agentKey`` is
validated. Real keys, real agents on 127.0.0.1."""

from __future__ import annotations

import base64
import hashlib
import json
import ssl
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reconciler.daemon.agent_client import AgentClient
from reconciler.daemon.answer_check import AnswerCheck
from reconciler.protocol.evidence import (
    derived_agent_key,
    evidence_problem,
    parse_agent_key,
    sign_answer,
    signed_answer_bytes,
    split_answer,
)
from reconciler.protocol.observations import JobObservation
from reconciler.protocol.signing import SigningKey, TrustedKey, generate_key, load_private_key
from reconciler.protocol.tls import parse_pin
from reconciler.spec.documents import parse_file
from reconciler.spec.model import Node
from tests.kit.agents import AgentThread, FleetThread
from tests.kit.http import request
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key


def node_file(agent_key: str) -> bytes:
    return (
        "apiVersion: reconciler/v1\nkind: Node\nmetadata: {name: gpu-a1}\n"
        f"spec:\n  agent: http://127.0.0.1:8710\n  agentKey: {agent_key}\n"
    ).encode()


def test_a_signed_answer_verifies_and_any_changed_field_does_not(tmp_path: Path) -> None:
    key = make_key(tmp_path / "k" / "reconciler").signing
    answer = sign_answer({"jobId": "j1", "state": "succeeded", "checks": [{"ok": True}]}, key)
    signed = split_answer(answer)
    assert signed is not None and evidence_problem(signed, key.trusted()) == ""

    tampered = split_answer({**answer, "state": "failed"})
    assert evidence_problem(tampered, key.trusted()) == f"bad signature for key {key.key_id}"
    # A field added later by someone else is covered too.
    added = split_answer({**answer, "extra": 1})
    assert "bad signature" in evidence_problem(added, key.trusted())
    assert "no evidence" in evidence_problem(split_answer({"state": "x"}), key.trusted())


def test_answer_bytes_encoded_once_read_back_as_the_signed_answer(tmp_path: Path) -> None:
    key = make_key(tmp_path / "k" / "reconciler").signing
    answer = {"jobId": "j1", "state": "succeeded", "detail": "über", "error": None}
    data = signed_answer_bytes(answer, key)
    assert json.loads(data) == sign_answer(answer, key)
    assert evidence_problem(split_answer(json.loads(data)), key.trusted()) == ""
    assert json.loads(signed_answer_bytes({}, key))["evidence"]["keyId"] == key.key_id
    assert json.loads(signed_answer_bytes(answer, None)) == answer


def test_a_remembered_verification_never_covers_a_changed_answer(tmp_path: Path) -> None:
    key = make_key(tmp_path / "k" / "reconciler").signing
    node = Node("node-a", "http://127.0.0.1:1", agent_key=key.public_openssh)
    check = AnswerCheck()
    seen = JobObservation(
        "j1", "running", signed=split_answer(sign_answer({"jobId": "j1", "state": "running"}, key))
    )
    assert check.job(node, seen) == (seen, "")
    assert check.job(node, seen) == (seen, "")  # remembered: same key, signature and bytes
    assert seen.signed is not None
    forged = replace(seen.signed, body={"jobId": "j1", "state": "succeeded"})
    believed, problem = check.job(node, replace(seen, state="succeeded", signed=forged))
    assert believed.state == "unreachable" and problem == f"bad signature for key {key.key_id}"


def test_an_answer_signed_by_another_key_names_both_keys(tmp_path: Path) -> None:
    node_key = make_key(tmp_path / "node" / "reconciler").signing
    other = make_key(tmp_path / "other" / "reconciler").signing
    signed = split_answer(sign_answer({"node": "gpu-a1"}, other))
    problem = evidence_problem(signed, node_key.trusted())
    assert other.key_id in problem and node_key.key_id in problem


def test_agent_key_lines_are_parsed_and_bad_ones_refused_with_file_line_and_column(
    tmp_path: Path,
) -> None:
    _, public = generate_key(tmp_path, "agent")
    line = public.read_text().strip()
    assert line.endswith(" agent")
    parsed = parse_file("nodes/gpu-a1.yaml", node_file(f'"{line}"'))
    assert parsed.node is not None and parsed.node.agent_key == line
    assert parse_agent_key(line).key_id == load_private_key(tmp_path / "agent").key_id

    rsa = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 someone"
    bad = parse_file("nodes/gpu-a1.yaml", node_file(f'"{rsa}"'))
    assert bad.node is None
    (problem,) = bad.problems
    assert (problem.path, problem.line, problem.column, problem.field) == (
        "nodes/gpu-a1.yaml",
        6,
        13,
        "spec.agentKey",
    )
    assert "ssh-ed25519" in problem.message


def test_keys_generate_with_a_name_writes_the_agents_pair(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reconciler", "keys", "generate", "--out", str(tmp_path),
         "--name", "agent"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert (tmp_path / "agent").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "agent.pub").read_text().startswith("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5")
    assert "spec.agentKey" in done.stdout and "agent --key" in done.stdout


def test_the_agent_signs_job_records_heartbeats_and_refusals(tmp_path: Path) -> None:
    daemon_key = make_key(tmp_path / "daemon" / "reconciler").signing
    agent_key = make_key(tmp_path / "agent" / "reconciler").signing
    agent = AgentThread(tmp_path / "state", [daemon_key], key=agent_key)
    try:
        status, posted = request(agent.url, "POST", "/v1/nodes/node-a/jobs",
                                 envelope(job(mode="dry_run"), daemon_key))  # fmt: skip
        assert status == 202
        record = agent.wait_finished("apply-0001")
        _, beat = request(agent.url, "GET", "/v1/nodes/node-a/heartbeat")
        _, refused = request(agent.url, "POST", "/v1/nodes/node-a/jobs", b"{}")
    finally:
        agent.close()
    for answer in (posted, record, beat, refused):
        assert evidence_problem(split_answer(answer), agent_key.trusted()) == "", answer
    assert refused["error"] == "invalid_job"


def test_the_daemon_check_believes_only_the_nodes_key(tmp_path: Path) -> None:
    daemon_key = make_key(tmp_path / "daemon" / "reconciler").signing
    fleet = FleetThread(tmp_path / "sim", [daemon_key], names=["node-a"], key_seed="s1")
    own = derived_agent_key("s1", "node-a").public_openssh
    other = derived_agent_key("s2", "node-a").public_openssh
    sent = job(mode="dry_run")
    try:
        with AgentClient(daemon_key, timeout=5) as client:
            answer = client.send_jobs([(fleet.url, sent)], datetime.now(UTC))[sent.job_id]
            beat = client.read_heartbeats([(fleet.url, "node-a")])["node-a"]
    finally:
        fleet.close()
    assert beat is not None and answer.signed is not None
    check = AnswerCheck()
    node = Node("node-a", fleet.url, agent_key=own)
    assert check.job(node, answer) == (answer, "")
    assert check.heartbeat(node, beat) == (beat, "")

    impostor = replace(node, agent_key=other)
    seen, problem = check.job(impostor, answer)
    assert seen.state == "unreachable" and seen.error == f"no evidence: {problem}"
    assert check.heartbeat(impostor, beat)[0] is None
    unsigned, problem = check.job(impostor, replace(answer, signed=None))
    assert unsigned.state == "unreachable" and "carries no evidence" in problem

    # Without agentKey: believed as in version 1, and nothing is kept as evidence.
    plain = replace(node, agent_key=None)
    assert check.job(plain, answer)[0] == replace(answer, signed=None)
    assert check.heartbeat(plain, beat)[0] == replace(beat, signed=None)


@pytest.mark.parametrize("seed", ["a", "b"])
def test_simulated_keys_are_one_per_node_and_stable(seed: str) -> None:
    one = derived_agent_key(seed, "sim-0001")
    assert one.key_id == derived_agent_key(seed, "sim-0001").key_id
    assert one.key_id != derived_agent_key(seed, "sim-0002").key_id
    assert parse_agent_key(one.public_openssh).key_id == one.key_id


def test_an_https_agent_without_a_pin_is_refused_at_its_agent_field() -> None:
    text = (
        b"apiVersion: reconciler/v1\nkind: Node\nmetadata: {name: gpu-a1}\n"
        b"spec:\n  agent: https://10.0.0.5:8710\n"
    )
    (problem,) = parse_file("nodes/gpu-a1.yaml", text).problems
    assert (problem.line, problem.column, problem.field) == (5, 10, "spec.agent")
    assert "agentCertSha256" in problem.message
    pinned = text + b"  agentCertSha256: " + b"ab" * 32 + b"\n"
    node = parse_file("nodes/gpu-a1.yaml", pinned).node
    assert node is not None and node.agent_cert_sha256 == "ab" * 32


def test_keys_tls_writes_a_private_key_and_prints_the_certificates_pin(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reconciler", "keys", "tls", "--out", str(tmp_path),
         "--name", "gpu-a1"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert (tmp_path / "gpu-a1.key").stat().st_mode & 0o777 == 0o600
    pem = (tmp_path / "gpu-a1.crt").read_bytes()
    der = ssl.PEM_cert_to_DER_cert(pem.decode())
    # quoted, as it is pasted into a node file: a digest of digits only would be a number
    assert f'agentCertSha256: "{hashlib.sha256(der).hexdigest()}"' in done.stdout.splitlines()
    assert parse_pin(hashlib.sha256(der).hexdigest()) == hashlib.sha256(der).digest()
    b64 = "sha256:" + base64.b64encode(hashlib.sha256(der).digest()).decode()
    assert parse_pin(b64) == hashlib.sha256(der).digest()


def test_recorded_evidence_is_checked_per_node(tmp_path: Path) -> None:
    from reconciler.attestations.evidence_check import _check_node
    from reconciler.spec.rollout_status import NodeEvidence, NodeRecord

    key = make_key(tmp_path / "agent" / "reconciler").signing
    other = make_key(tmp_path / "other" / "reconciler").signing

    def kept(answer: dict[str, object], by: SigningKey = key) -> NodeEvidence:
        signed = split_answer(sign_answer(answer, by))
        assert signed is not None
        return NodeEvidence(signed.key_id, signed.body, signed.signature)

    passed = NodeRecord("n1", 1, "succeeded", 1, "j1", verdict="passed")
    good = kept({"jobId": "j1", "state": "succeeded"})
    assert _check_node(replace(passed, evidence=good), key.trusted()).ok
    refused = kept({"error": "live_not_allowed", "message": "dry runs only"})
    verdict = _check_node(replace(passed, verdict="failed", evidence=refused), key.trusted())
    assert verdict.ok and verdict.message.startswith("refusal signed by")
    # Another job's record, another key, or a changed byte: each fails.
    assert not _check_node(replace(passed, job_id="j2", evidence=good), key.trusted()).ok
    assert not _check_node(replace(passed, evidence=kept({"jobId": "j1"}, other)), key.trusted()).ok
    changed = replace(good, job_record={"jobId": "j1", "state": "succeedeD"})
    assert "bad signature" in _check_node(replace(passed, evidence=changed), key.trusted()).message
    # Decided without evidence, though the node has a key: fails; without a key: unsigned.
    assert not _check_node(passed, key.trusted()).ok
    assert _check_node(passed, None).message == "unsigned evidence: the node has no agentKey"
    # Evidence kept, but the node file's key is gone or unreadable: fails, saying which.
    gone = _check_node(replace(passed, evidence=good), None)
    assert not gone.ok and gone.message == "evidence recorded, but the node file has no agentKey"
    unreadable = _check_node(replace(passed, evidence=good), "nodes/n1.yaml: spec.agentKey bad")
    assert not unreadable.ok and unreadable.message == "nodes/n1.yaml: spec.agentKey bad"


def test_an_agent_key_line_must_carry_exactly_an_ed25519_key(tmp_path: Path) -> None:
    key = make_key(tmp_path / "k" / "reconciler").signing
    blob = base64.b64decode(key.public_openssh.split()[1])
    assert parse_agent_key(key.public_openssh).key_id == key.key_id
    ecdsa = tmp_path / "ecdsa"
    make_key(ecdsa, kind="ecdsa")
    other = ecdsa.with_suffix(".pub").read_text().split()[1]
    for data in (blob[:-1], blob + b"\0", base64.b64decode(other), b"x" * 51):
        line = "ssh-ed25519 " + base64.b64encode(data).decode()
        with pytest.raises(ValueError, match="not a valid public key"):
            parse_agent_key(line)


def test_a_fleets_keys_are_parsed_as_it_is_read_and_judge_as_parsed_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``use_fleet`` parses every agentKey once, before any answer comes in;
    answers then check as they would against keys parsed on first use."""
    from reconciler.daemon import answer_check

    key = make_key(tmp_path / "k" / "reconciler").signing
    nodes = {
        "node-a": Node("node-a", "http://127.0.0.1:1", agent_key=key.public_openssh),
        "node-b": Node("node-b", "http://127.0.0.1:1", agent_key="ssh-ed25519 AAAA-not-a-key"),
        "node-c": Node("node-c", "http://127.0.0.1:1"),
    }
    parsed: list[str] = []
    real = answer_check.parse_agent_key

    def counting(line: str, source: str = "") -> TrustedKey:
        parsed.append(line)
        return real(line, source)

    monkeypatch.setattr(answer_check, "parse_agent_key", counting)
    early, late = AnswerCheck(), AnswerCheck()
    early.use_fleet(nodes)
    assert sorted(parsed) == sorted(n.agent_key for n in nodes.values() if n.agent_key)
    parsed.clear()
    late.nodes = nodes
    good = split_answer(sign_answer({"jobId": "j1", "state": "succeeded"}, key))
    assert good is not None
    seen = JobObservation("j1", "succeeded", signed=good)
    for name, node in nodes.items():
        assert early.job(node, seen) == late.job(node, seen), name
    assert len(parsed) == 2  # only the late check parsed, on first use


def test_an_answer_checked_early_is_believed_only_as_the_pass_would(tmp_path: Path) -> None:
    key = make_key(tmp_path / "k" / "reconciler").signing
    other = make_key(tmp_path / "other" / "reconciler").signing
    node = Node("node-a", "http://127.0.0.1:1", agent_key=key.public_openssh)
    check = AnswerCheck()
    check.nodes = {"node-a": node}
    good = split_answer(sign_answer({"jobId": "j1", "state": "succeeded"}, key))
    forged = split_answer(sign_answer({"jobId": "j1", "state": "succeeded"}, other))
    assert good is not None and forged is not None
    for signed in (good, forged, replace(good, body={"jobId": "j1", "state": "failed"})):
        check.prepare("node-a", signed)  # from the client's thread; never raises
    check.prepare("node-z", good)  # not in the fleet: nothing to check against
    check.prepare("node-a", replace(good, body={"x": object()}))  # not JSON
    seen = JobObservation("j1", "succeeded", signed=good)
    assert check.job(node, seen) == (seen, "")
    lied, problem = check.job(node, replace(seen, signed=forged))
    assert lied.state == "unreachable" and other.key_id in problem
