"""Deployment attestations end to end (docs/attestations.md): real
``reconciler agent`` processes signing their answers with ``--key``, node
files carrying their ``agentKey``, the in-process daemon driving a live
rollout to completion, then ``reconciler attest`` on the committed status.

The attestation is checked twice over: by a separate Python process that
imports only securesystemslib and json, as any in-toto consumer would,
and by ``reconciler verify --attestation``, which must refuse a changed
byte, swapped evidence, a wrong key and a predicate the repository does
not hold, each with a reason that names what is wrong."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from reconciler.attestations.attestation import PREDICATE_TYPE, reported_digest, sign
from reconciler.cli.main import main as cli
from reconciler.daemon.agent_client import AgentClient
from reconciler.daemon.logs import EventLog
from reconciler.daemon.loop import Daemon
from reconciler.git.approval import Approver, load_allowed_signers
from reconciler.git.store import GitStore
from reconciler.protocol.signing import SigningKey, canonical_json, generate_key, load_private_key
from reconciler.spec.safe_yaml import load_yaml
from tests.kit.alertmanager import AlertmanagerServer
from tests.kit.documents import node_map, rollout_yaml
from tests.kit.fleets import AgentFleet
from tests.kit.git import git, git_env
from tests.kit.keys import make_key
from tests.kit.nginx import NginxServer
from tests.kit.waiting import wait_for

REPO = Path(__file__).resolve().parent.parent
SCHEMA = REPO / "schemas" / "deployment-attestation.schema.json"
OLD = b"provider: ollama\nmodel: llama3-8b\nprofile: default\n"
FAST_OFFLINE = "apiVersion: reconciler/v1\nkind: Settings\nspec: {offlineAfter: 5s}\n"
NODES = ("gpu-a1", "gpu-a2")
TERMINAL = ("completed", "failed", "aborted")


@dataclass
class Attested:
    fleet: AgentFleet
    path: Path  # the attestation reconciler attest wrote
    public: Path  # the daemon's public key

    @property
    def envelope(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.path.read_text())
        return data

    @property
    def statement(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(base64.b64decode(self.envelope["payload"]))
        return data


def signed_fleet(root: Path) -> AgentFleet:
    return AgentFleet.create(
        root,
        {name: {"config": OLD, "agent_key": "own"} for name in NODES},
        files={"reconciler.yaml": FAST_OFFLINE},
    )


def complete(fleet: AgentFleet, name: str, **spec: Any) -> dict[str, Any]:
    fleet.push({f"rollouts/{name}.yaml": rollout_yaml(name, nodeIds=list(NODES), **spec)})
    statuses = fleet.run_until(
        fleet.daemon(), lambda s: s.get(name, {}).get("phase") == "completed"
    )
    status: dict[str, Any] = statuses[name]
    return status


@pytest.fixture(scope="module")
def attested(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Attested]:
    root = tmp_path_factory.mktemp("attested")
    fleet = signed_fleet(root)
    try:
        complete(fleet, "r", live=True)
        out = root / "r.attestation.json"
        code = cli(["attest", "r", "--repo", str(fleet.bare), "--key", str(fleet.key_path)])
        assert code == 0
        code = cli(
            [
                "attest",
                "r",
                "--repo",
                str(fleet.bare),
                "--key",
                str(fleet.key_path),
                "--out",
                str(out),
            ]
        )
        assert code == 0
        yield Attested(fleet, out, fleet.key_path.with_name("reconciler.pub"))
    finally:
        fleet.close()


def verify(
    attested: Attested,
    path: Path,
    capsys: pytest.CaptureFixture[str],
    *,
    repo: bool = True,
    key: Path | None = None,
) -> tuple[int, str]:
    capsys.readouterr()
    args = ["verify", "--attestation", str(path), "--key", str(key or attested.public)]
    if repo:
        args += ["--repo", str(attested.fleet.bare)]
    code = cli(args)
    return code, re.sub(" {2,}", " ", capsys.readouterr().out)  # columns vary


def resigned(attested: Attested, statement: dict[str, Any], path: Path) -> Path:
    """``statement`` signed by the daemon's own key: the envelope verifies,
    so only what is inside can fail."""
    path.write_text(json.dumps(sign(statement, load_private_key(attested.fleet.key_path))))
    return path


# -- an in-toto consumer ------------------------------------------------------

CONSUMER = """
import json
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey

with open({path!r}) as handle:
    envelope = Envelope.from_dict(json.load(handle))
key = SSlibKey({keyid!r}, "ed25519", "ed25519", {{"public": {public!r}}})
envelope.verify([key], 1)
print(json.dumps({{"payloadType": envelope.payload_type, "statement": json.loads(envelope.payload)}}))
"""


def consumer(path: Path, public: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Verify ``path`` in a fresh interpreter that imports only
    securesystemslib and json, given the key the way ssh-keygen shows it."""
    keyid = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(public)], check=True, capture_output=True, text=True
    ).stdout.split()[1]
    blob = base64.b64decode(public.read_text().split()[1])
    script = CONSUMER.format(path=str(path), keyid=keyid, public=blob[-32:].hex())
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-c", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def imported(stderr: str) -> set[str]:
    """Top-level packages in ``-X importtime`` output."""
    return {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


def test_securesystemslib_alone_verifies_an_attestation_of_a_real_rollout(
    attested: Attested, tmp_path: Path
) -> None:
    done = consumer(attested.path, attested.public, tmp_path)

    assert done.returncode == 0, done.stderr[-2000:]
    modules = imported(done.stderr)
    assert "securesystemslib" in modules and "reconciler" not in modules
    answer = json.loads(done.stdout)
    assert answer["payloadType"] == "application/vnd.in-toto+json"
    statement = answer["statement"]
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == PREDICATE_TYPE
    # The subject is what each node now runs: the SHA-256 of its config
    # file on disk, as its own signed heartbeat reported it.
    assert statement["subject"] == [
        {
            "name": f"{node}/hermes",
            "digest": {
                "sha256": hashlib.sha256(
                    attested.fleet.agents[node].config_bytes() or b""
                ).hexdigest()
            },
        }
        for node in NODES
    ]
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(statement["predicate"])


def test_the_predicate_carries_the_chain_from_commit_to_node(attested: Attested) -> None:
    predicate = attested.statement["predicate"]
    bare = attested.fleet.bare
    spec = git("log", "-1", "--format=%H", "main", "--", "rollouts/r.yaml", cwd=bare).strip()
    status = attested.fleet.statuses()["r"]

    assert predicate["rollout"] == "r" and predicate["phase"] == "completed"
    assert predicate["specCommit"] == predicate["startCommit"] == spec
    assert predicate["statusCommit"] == git("rev-parse", "main", cwd=bare).strip()
    assert predicate["frozen"] == status["frozen"]
    assert predicate["approvals"] == []
    # Every node record exactly as the status holds it, signed evidence included.
    assert predicate["nodes"] == status["nodes"]
    assert {n["name"]: n["evidence"]["heartbeat"]["node"] for n in predicate["nodes"]} == {
        n: n for n in NODES
    }


def test_reconciler_verify_accepts_it_with_the_repository_and_says_what_it_left_out_without(
    attested: Attested, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = verify(attested, attested.path, capsys)
    assert code == 0, out
    assert "envelope ok: signed by SHA256:" in out
    assert "status ok: predicate matches status/r.yaml at statusCommit" in out
    for node in NODES:
        assert f"{node} ok: job record and heartbeat signed by SHA256:" in out
        assert f"deployed {node}/hermes sha256:" in out

    code, out = verify(attested, attested.path, capsys, repo=False)
    assert code == 0, out
    assert "repository not checked: no --repo:" in out
    assert "gpu-a1 ok: consistent (keys not checked)" in out


def test_an_attestation_is_the_same_bytes_each_time(attested: Attested) -> None:
    again = attested.path.with_name("again.json")
    fleet = attested.fleet
    args = ["attest", "r", "--repo", str(fleet.bare), "--key", str(fleet.key_path)]
    assert cli([*args, "--out", str(again)]) == 0
    assert again.read_bytes() == attested.path.read_bytes()


# -- what must fail ------------------------------------------------------------


def test_one_changed_byte_in_the_payload_fails(
    attested: Attested, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    envelope = attested.envelope
    payload = bytearray(base64.b64decode(envelope["payload"]))
    at = payload.index(b'"sha256":"') + len(b'"sha256":"')
    payload[at] = ord("0") if payload[at] != ord("0") else ord("1")
    envelope["payload"] = base64.b64encode(bytes(payload)).decode()
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(envelope))

    code, out = verify(attested, changed, capsys)

    assert code == 1
    assert "envelope FAILED: the signature by SHA256:" in out
    assert "does not match the payload: the attestation was changed after it was signed" in out
    assert "attestation does not verify: envelope" in out
    assert consumer(changed, attested.public, tmp_path).returncode != 0


def test_a_wrong_key_fails(
    attested: Attested, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, other = generate_key(tmp_path / "keys", "someone")
    daemon_id = attested.envelope["signatures"][0]["keyid"]

    code, out = verify(attested, attested.path, capsys, key=other)

    assert code == 1
    assert "envelope FAILED: not signed by the key given (SHA256:" in out
    assert f"{other}): signed by {daemon_id}" in out
    assert consumer(attested.path, other, tmp_path).returncode != 0


def test_one_nodes_evidence_swapped_for_anothers_fails_for_both_nodes(
    attested: Attested, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    statement = copy.deepcopy(attested.statement)
    a1, a2 = statement["predicate"]["nodes"]
    a1["evidence"], a2["evidence"] = a2["evidence"], a1["evidence"]
    swapped = resigned(attested, statement, tmp_path / "swapped.json")

    code, out = verify(attested, swapped, capsys)

    assert code == 1
    assert "envelope ok: signed by" in out  # the daemon's key signed it: only the inside fails
    assert "gpu-a1 FAILED: differs from status/r.yaml at statusCommit" in out
    assert "in: evidence; evidence: job record: signed by key SHA256:" in out
    assert "not by the node's agentKey" in out
    assert "gpu-a2 FAILED:" in out
    assert "attestation does not verify: status, gpu-a1, gpu-a2" in out

    # Without the repository the keys are out of reach, but the swap shows.
    code, out = verify(attested, swapped, capsys, repo=False)
    assert code == 1
    assert "gpu-a1 FAILED: evidence is about job 'apply-" in out
    assert "evidence heartbeat is from node 'gpu-a2'" in out


def test_a_predicate_the_repository_does_not_hold_fails_with_it(
    attested: Attested, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    statement = copy.deepcopy(attested.statement)
    statement["predicate"]["nodes"][1]["finishedAt"] = "2020-01-01T00:00:00Z"
    edited = resigned(attested, statement, tmp_path / "edited.json")

    code, out = verify(attested, edited, capsys)
    assert code == 1
    assert "gpu-a2 FAILED: differs from status/r.yaml at statusCommit" in out
    assert "in: finishedAt" in out
    assert "gpu-a1 ok:" in out

    statement = copy.deepcopy(attested.statement)
    statement["predicate"]["specCommit"] = "0" * 40
    unknown = resigned(attested, statement, tmp_path / "unknown.json")
    code, out = verify(attested, unknown, capsys)
    assert code == 1
    assert f"commits FAILED: not in {attested.fleet.bare}: specCommit {'0' * 40}" in out
    assert "predicate differs from status/r.yaml at statusCommit" in out
    assert "in: specCommit" in out
    assert "gpu-a1 FAILED: evidence not checked: specCommit is not in the repository" in out


def test_a_subject_its_predicate_does_not_support_fails(
    attested: Attested, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    statement = copy.deepcopy(attested.statement)
    statement["subject"][0]["digest"]["sha256"] = "ab" * 32
    statement["subject"].append({"name": "gpu-zz/hermes", "digest": {"sha256": "cd" * 32}})
    lying = resigned(attested, statement, tmp_path / "lying.json")

    code, out = verify(attested, lying, capsys, repo=False)

    assert code == 1
    assert "statement FAILED: subject names no node of the rollout: gpu-zz/hermes" in out
    assert f"gpu-a1 FAILED: subject says gpu-a1/hermes sha256:{'ab' * 6}" in out
    assert "gpu-a2 ok:" in out


def test_a_payload_that_is_not_our_statement_fails(
    attested: Attested, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    statement = copy.deepcopy(attested.statement)
    del statement["predicate"]["nodes"][0]["evidence"]["signatures"]
    broken = resigned(attested, statement, tmp_path / "broken.json")
    code, out = verify(attested, broken, capsys)
    assert code == 1
    assert "statement FAILED: predicate does not match its schema: nodes.0.evidence:" in out

    statement = copy.deepcopy(attested.statement)
    statement["predicate"]["nodes"].append(statement["predicate"]["nodes"][0])
    doubled = resigned(attested, statement, tmp_path / "doubled.json")
    code, out = verify(attested, doubled, capsys, repo=False)
    assert code == 1
    assert "the node records are not the frozen node list, in its order" in out

    statement = copy.deepcopy(attested.statement)
    statement["predicate"]["nodes"][0]["dispatchedAt"] = "2026-13-01T00:00:00Z"
    month = resigned(attested, statement, tmp_path / "month.json")
    code, out = verify(attested, month, capsys)
    assert code == 1
    assert "statement FAILED: a node record is unreadable: month must be in 1..12" in out

    garbage = tmp_path / "garbage.json"
    garbage.write_text('{"payload": "", "payloadType": "x"}')
    code, out = verify(attested, garbage, capsys)
    assert code == 1
    assert "envelope FAILED: not a DSSE envelope: field 'signatures' is missing" in out
    garbage.write_text("{not json")
    code, out = verify(attested, garbage, capsys)
    assert code == 1
    assert "envelope FAILED: not a DSSE envelope: not JSON: Expecting property name" in out


# -- what attest refuses -------------------------------------------------------


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[AgentFleet]:
    made = signed_fleet(tmp_path)
    try:
        yield made
    finally:
        made.close()


def attest(
    fleet: AgentFleet, name: str, out: Path, capsys: pytest.CaptureFixture[str], *more: str
) -> Any:
    capsys.readouterr()
    code = cli(
        [
            "attest", name, "--repo", str(fleet.bare), "--key", str(fleet.key_path),
            "--out", str(out), *more,
        ]
    )  # fmt: skip
    return code, capsys.readouterr().err


def phase(fleet: AgentFleet, name: str) -> str | None:
    try:
        text = git("show", f"main:status/{name}.yaml", cwd=fleet.bare)
    except Exception:
        return None
    return str(load_yaml(name, text.encode())["phase"])


def test_attest_refuses_a_status_whose_recorded_evidence_was_edited(
    fleet: AgentFleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = node_map(complete(fleet, "r", live=True))
    fleet.pull()
    path = fleet.work / "status" / "r.yaml"
    text = path.read_text()
    signature = nodes["gpu-a2"]["evidence"]["signatures"]["jobRecord"]
    at = text.index(signature, text.index("name: gpu-a2")) + 5
    path.write_text(text[:at] + ("B" if text[at] != "B" else "C") + text[at + 1 :])
    git("commit", "-qam", "Touch up the status", cwd=fleet.work)
    fleet.git_push()
    out = tmp_path / "r.json"

    code, err = attest(fleet, "r", out, capsys)

    assert code == 1
    assert "the recorded evidence does not verify for gpu-a2 (job record: bad signature" in err
    assert "the attestation would vouch for it" in err
    assert f"reconciler verify --evidence r --repo {fleet.bare}" in err
    assert not out.exists()


def test_attest_refuses_a_dry_run_and_an_unfinished_rollout(
    fleet: AgentFleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    complete(fleet, "dry")
    code, err = attest(fleet, "dry", tmp_path / "dry.json", capsys)
    assert code == 1
    assert "rollout dry: nothing to attest: it was a dry-run, which changes nothing" in err
    assert "agentKey" not in err

    fleet.push(
        {"rollouts/held.yaml": rollout_yaml("held", nodeIds=list(NODES), live=True, pauseAfter=[1])}
    )
    fleet.run_until(fleet.daemon(), lambda s: s.get("held", {}).get("phase") == "paused")
    code, err = attest(fleet, "held", tmp_path / "held.json", capsys)
    assert code == 1
    assert "rollout held is paused: an attestation describes a finished rollout" in err

    code, err = attest(fleet, "nonesuch", tmp_path / "none.json", capsys)
    assert code == 1
    assert "no readable status for rollout 'nonesuch'" in err
    assert not list(tmp_path.glob("*.json"))


def test_verify_attestation_usage_errors_exit_2(
    attested: Attested, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(["verify", "--attestation", str(attested.path)]) == 2
    assert "--attestation needs --key" in capsys.readouterr().err
    missing = tmp_path / "missing.json"
    assert cli(["verify", "--attestation", str(missing), "--key", str(attested.public)]) == 2
    assert f"cannot read {missing}" in capsys.readouterr().err
    assert cli(["verify", "--evidence", "r", "--key", str(attested.public)]) == 2
    assert "--key goes with --attestation" in capsys.readouterr().err


# -- the whole chain -----------------------------------------------------------


def person(root: Path, name: str) -> tuple[Path, str]:
    """An SSH key made by ssh-keygen, and its fingerprint as ssh-keygen shows it."""
    key = root / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True
    )
    listed = subprocess.run(
        ["ssh-keygen", "-l", "-f", f"{key}.pub"], check=True, capture_output=True, text=True
    )
    return key, listed.stdout.split()[1]


def test_an_attestation_records_the_signed_commit_and_the_approval_that_counted(
    fleet: AgentFleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "people").mkdir()
    alice, _ = person(tmp_path / "people", "alice")
    bob, bob_id = person(tmp_path / "people", "bob")
    signers = tmp_path / "allowed_signers"
    people = {"alice@example.com": alice, "bob@example.com": bob}
    signers.write_text(
        "".join(f"{who} {Path(f'{key}.pub').read_text()}" for who, key in people.items())
    )
    # alice writes and signs the rollout, bob approves it
    env = git_env("Alice", "alice@example.com")
    fleet.pull()
    (fleet.work / "rollouts").mkdir()
    (fleet.work / "rollouts" / "r.yaml").write_text(
        rollout_yaml("r", nodeIds=list(NODES), live=True)
    )
    git("add", "-A", cwd=fleet.work, env=env)
    git(
        "-c", "gpg.format=ssh", "-c", f"user.signingKey={alice}",
        "commit", "-q", "-S", "-m", "Roll out r", cwd=fleet.work, env=env,
    )  # fmt: skip
    git("push", "-q", "origin", "HEAD:main", cwd=fleet.work)
    change = git("rev-parse", "HEAD", cwd=fleet.work).strip()
    assert cli(["approve", change, "--key", str(bob), "--repo", str(fleet.work), "--push"]) == 0
    store = GitStore.open(str(fleet.bare), "main")
    approver = Approver(store.repository(), load_allowed_signers(signers), required_approvals=1)
    daemon = Daemon(
        store,
        AgentClient(load_private_key(fleet.key_path), timeout=fleet.agent_timeout),
        approver=approver,
        log=EventLog(stream=sys.stderr),
        clock=fleet.clock,
    )
    fleet.daemons.append(daemon)
    fleet.run_until(daemon, lambda s: s.get("r", {}).get("phase") == "completed")
    out = tmp_path / "r.json"

    code, err = attest(fleet, "r", out, capsys)

    assert code == 0, err
    predicate = json.loads(base64.b64decode(json.loads(out.read_text())["payload"]))["predicate"]
    assert predicate["startCommit"] == predicate["specCommit"] == change
    assert predicate["approvals"] == [
        {"principal": "bob@example.com", "keyId": bob_id, "rules": []}
    ]
    # The first link, checked by git itself: the commit the rollout started at is alice's.
    verified = subprocess.run(
        ["git", "-c", f"gpg.ssh.allowedSignersFile={signers}", "verify-commit", change],
        cwd=fleet.bare,
        capture_output=True,
        text=True,
    )
    assert verified.returncode == 0, verified.stderr
    assert 'Good "git" signature for alice@example.com' in verified.stderr
    capsys.readouterr()
    public = fleet.key_path.with_name("reconciler.pub")
    args = ["verify", "--attestation", str(out), "--key", str(public), "--repo", str(fleet.bare)]
    assert cli(args) == 0, capsys.readouterr().out


# -- a model rollout -------------------------------------------------------------


@pytest.mark.slow
def test_a_model_rollouts_attestation_names_the_models_digest_per_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The status is the one the daemon wrote for a rollout whose target
    declares artifacts, downloaded from Debian's nginx by the real agents."""
    files = tmp_path / "mirror"
    files.mkdir()
    data = hashlib.sha256(b"model weights").digest() * 4096
    (files / "model.gguf").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    fleet = signed_fleet(tmp_path)
    with NginxServer(tmp_path / "nginx", files) as nginx:
        try:
            artifact = (
                f"{{name: weights, url: '{nginx.url('model.gguf')}', "
                f"sha256: '{digest}', size: {len(data)}}}"
            )
            target = (
                "{runtime: hermes, provider: vllm, model: llama3.1-8b, profile: default, "
                f"artifacts: [{artifact}]}}"
            )
            status = complete(fleet, "model", live=True, target=target)
            assert status["frozen"]["artifacts"][0]["sha256"] == digest  # where status keeps them
            out = tmp_path / "model.json"
            code, err = attest(fleet, "model", out, capsys)
            assert code == 0, err
            statement = json.loads(base64.b64decode(json.loads(out.read_text())["payload"]))
            assert statement["subject"] == [
                {
                    "name": f"{node}/hermes",
                    "digest": {"sha256": digest},
                    "annotations": {"artifact": "weights"},
                }
                for node in NODES
            ]
            # verify derives the subject from the record the same way, and so
            # refuses the config digests the attestation once carried instead.
            public = fleet.key_path.with_name("reconciler.pub")
            capsys.readouterr()
            args = ["verify", "--attestation", str(out), "--key", str(public)]
            assert cli([*args, "--repo", str(fleet.bare)]) == 0, capsys.readouterr().out
            config_digests = dict(
                statement,
                subject=[
                    {
                        "name": f"{n['name']}/hermes",
                        "digest": {"sha256": reported_digest(n["evidence"], "hermes")},
                    }
                    for n in statement["predicate"]["nodes"]
                ],
            )
            wrong = tmp_path / "config-digests.json"
            wrong.write_text(json.dumps(sign(config_digests, load_private_key(fleet.key_path))))
            capsys.readouterr()
            assert cli(["verify", "--attestation", str(wrong), "--key", str(public)]) == 1
            assert (
                f"but its record shows gpu-a1/hermes sha256:{digest[:12]}"
                in capsys.readouterr().out
            )
        finally:
            fleet.close()


# -- a node failed by an alert ---------------------------------------------------


@pytest.mark.slow
def test_a_node_an_alert_failed_is_attested_as_failed_by_that_alert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Debian's Alertmanager has an alert naming gpu-a1 firing when its job
    is sent: the daemon fails it on that alert, before any agent answer,
    and the rollout goes on (observe) to gpu-a2."""
    with AlertmanagerServer(tmp_path) as alertmanager:
        settings = (
            "apiVersion: reconciler/v1\nkind: Settings\n"
            f"spec: {{offlineAfter: 5s, alertmanager: {{url: '{alertmanager.url}'}}}}\n"
        )
        fleet = AgentFleet.create(
            tmp_path,
            {name: {"config": OLD, "agent_key": "own"} for name in NODES},
            files={"reconciler.yaml": settings},
        )
        try:
            alertmanager.post_alert("GpuHot", node="gpu-a1", severity="page")  # before it starts
            health = "{soak: 3s, interval: 1s, alerts: {matchers: ['severity=\"page\"']}}"
            fleet.push(
                {
                    "rollouts/r.yaml": rollout_yaml(
                        "r", nodeIds=list(NODES), live=True, batchSize=1, onFailure="observe",
                        health=health,
                    )
                }
            )  # fmt: skip
            daemon = fleet.daemon()
            statuses = fleet.run_until(
                daemon, lambda s: s.get("r", {}).get("phase") in TERMINAL, timeout=120
            )
            nodes = node_map(statuses["r"])
            assert nodes["gpu-a1"]["state"] == "failed"
            alert = nodes["gpu-a1"]["failedByAlert"]
            assert alert["alertname"] == "GpuHot"
            assert alert["labels"] == {"alertname": "GpuHot", "node": "gpu-a1", "severity": "page"}
            assert nodes["gpu-a2"]["state"] == "succeeded"

            capsys.readouterr()
            assert cli(["verify", "--evidence", "r", "--repo", str(fleet.bare)]) == 0
            report = capsys.readouterr().out
            assert "gpu-a1 ok: failed by alert GpuHot (labels node=gpu-a1, severity=page" in re.sub(
                " {2,}", " ", report
            )
            out = tmp_path / "r.json"
            code, err = attest(fleet, "r", out, capsys)
            assert code == 0, err
            statement = json.loads(base64.b64decode(json.loads(out.read_text())["payload"]))
            assert [s["name"] for s in statement["subject"]] == ["gpu-a2/hermes"]
            attested = node_map(statement["predicate"])
            assert attested["gpu-a1"]["failedByAlert"] == alert
            public = fleet.key_path.with_name("reconciler.pub")
            args = ["verify", "--attestation", str(out), "--key", str(public)]
            assert cli([*args, "--repo", str(fleet.bare)]) == 0, capsys.readouterr().out
        finally:
            fleet.close()


def test_attest_refusing_a_rollout_where_no_node_succeeded_says_so_not_agent_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every agent signs with its key, and every apply fails: the
    after-apply command exits 1, so the agent restores the old config."""
    fleet = AgentFleet.create(
        tmp_path,
        {name: {"config": OLD, "agent_key": "own", "after_apply": "false"} for name in NODES},
        files={"reconciler.yaml": FAST_OFFLINE},
    )
    try:
        fleet.push(
            {
                "rollouts/r.yaml": rollout_yaml(
                    "r", nodeIds=list(NODES), live=True, onFailure="observe"
                )
            }
        )
        statuses = fleet.run_until(
            fleet.daemon(), lambda s: s.get("r", {}).get("phase") in TERMINAL
        )
        assert {n["state"] for n in statuses["r"]["nodes"]} == {"failed"}

        code, err = attest(fleet, "r", tmp_path / "r.json", capsys)

        assert code == 1
        assert (
            "rollout r: nothing to attest: no node succeeded (gpu-a1 failed, gpu-a2 failed)" in err
        )
        assert "agentKey" not in err and "--key" not in err
        assert "reconciler status r" in err
    finally:
        fleet.close()


# -- a deployment that never happened ------------------------------------------


def run_once(fleet: AgentFleet, signers: Path) -> None:
    """One pass of the real daemon, as it runs: verification and signed status commits."""
    argv = ["run", "--once", "--repo", str(fleet.bare), "--key", str(fleet.key_path)]
    assert cli([*argv, "--allowed-signers", str(signers), "--sign-commits"]) == 0


def forged_status(fleet: AgentFleet, spec_commit: str, key: SigningKey) -> str:
    """status/r.yaml as a pusher rewrites it: ``specCommit`` names their
    node-file commit, and gpu-a1's evidence says it runs a config it never
    ran, signed by their key."""
    status = load_yaml("r", git("show", "main:status/r.yaml", cwd=fleet.bare).encode())
    status["specCommit"] = spec_commit
    evidence = node_map(status)["gpu-a1"]["evidence"]
    for runtime in evidence["heartbeat"]["runtimes"]:
        runtime["configDigest"] = "sha256:" + "ee" * 32
    evidence["keyId"] = key.key_id
    evidence["signatures"] = {
        part: base64.b64encode(key.sign(canonical_json(evidence[part]))).decode()
        for part in ("jobRecord", "heartbeat")
    }
    return json.dumps(status, indent=1) + "\n"


@pytest.mark.slow
def test_attest_and_verify_refuse_a_deployment_two_unsigned_pushes_made_up(
    fleet: AgentFleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "people").mkdir()
    alice, _ = person(tmp_path / "people", "alice")
    daemon_pub = fleet.key_path.with_name("reconciler.pub")
    signers = tmp_path / "allowed_signers"
    signers.write_text(
        f"alice@example.com {Path(f'{alice}.pub').read_text()}"
        f"reconciler@fleet {daemon_pub.read_text()}"
    )
    env = git_env("Alice", "alice@example.com")
    fleet.pull()
    (fleet.work / "rollouts").mkdir()
    (fleet.work / "rollouts" / "r.yaml").write_text(
        rollout_yaml("r", nodeIds=list(NODES), live=True)
    )
    git("add", "-A", cwd=fleet.work, env=env)
    git(
        "-c", "gpg.format=ssh", "-c", f"user.signingKey={alice}",
        "commit", "-q", "-S", "-m", "Roll out r", cwd=fleet.work, env=env,
    )  # fmt: skip
    git("push", "-q", "origin", "HEAD:main", cwd=fleet.work)
    wait_for(
        lambda: run_once(fleet, signers) is None and phase(fleet, "r") == "completed",
        60,
        "r to complete",
    )
    as_run = ["--allowed-signers", str(signers), "--sign-commits"]
    real = tmp_path / "real.json"
    code, err = attest(fleet, "r", real, capsys, *as_run)
    assert code == 0, err  # the daemon's own status is attested under its own flags

    # A pusher without a key: their agent key in gpu-a1's node file, then
    # the status rewritten to name that commit and carry their signatures.
    theirs = load_private_key(make_key(tmp_path / "mallory" / "agent").private)
    fleet.pull()
    node_file = fleet.work / "nodes" / "gpu-a1.yaml"
    node_file.write_text(
        re.sub(r"agentKey: .*", f'agentKey: "{theirs.public_openssh}"', node_file.read_text())
    )
    git("commit", "-qam", "Rotate gpu-a1's key", cwd=fleet.work)
    fleet.git_push()
    pushed = git("rev-parse", "HEAD", cwd=fleet.work).strip()
    (fleet.work / "status" / "r.yaml").write_text(forged_status(fleet, pushed, theirs))
    git("commit", "-qam", "Record gpu-a1", cwd=fleet.work)
    fleet.git_push()
    capsys.readouterr()
    run_once(fleet, signers)
    assert "status_tampered: status/r.yaml is not verified" in capsys.readouterr().err

    forged = tmp_path / "forged.json"
    code, err = attest(fleet, "r", forged, capsys)  # as before: no flags
    assert code == 1
    assert "the daemon serving this repository acts under verification" in err
    code, err = attest(fleet, "r", forged, capsys, *as_run)
    assert code == 1
    assert "rollout r: the daemon would not act on status/r.yaml at " in err
    assert "not the daemon's: it differs from what the newest daemon-signed commit wrote" in err
    assert f"specCommit {pushed[:12]} is not a verified commit of main" in err
    assert not forged.exists()
    # Each of the daemon's settings is enough on its own (the first away
    # from the daemon's state, as on another machine).
    elsewhere = ["--state-dir", str(tmp_path / "elsewhere")]
    for alone in (["--sign-commits", *elsewhere], ["--allowed-signers", str(signers)]):
        code, err = attest(fleet, "r", forged, capsys, *alone)
        assert code == 1 and "the daemon would not act on status/r.yaml" in err, (alone, err)
    assert not forged.exists()

    capsys.readouterr()
    assert cli(["verify", "--evidence", "r", "--repo", str(fleet.bare)]) == 1  # as before: no flags
    assert "the daemon serving this repository acts under verification" in capsys.readouterr().out
    repo = ["--repo", str(fleet.bare), "--allowed-signers", str(signers)]
    assert cli(["verify", "--evidence", "r", *repo, "--daemon-key", str(daemon_pub)]) == 1
    out = capsys.readouterr().out
    assert "evidence NOT checked" in out and "not the daemon's" in out, out
    # The attestation of the real deployment still verifies against the
    # status it was made from, under the daemon's flags.
    args = ["verify", "--attestation", str(real), "--key", str(daemon_pub), *repo]
    assert cli([*args, "--daemon-key", str(daemon_pub)]) == 0, capsys.readouterr().out


# -- -o on verify, attest and approve ------------------------------------------


def printed(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = cli(list(argv))
    return code, capsys.readouterr().out


def test_o_is_format_on_verify_and_attest_and_yaml_holds_the_json(
    attested: Attested, capsys: pytest.CaptureFixture[str]
) -> None:
    bare, public = str(attested.fleet.bare), str(attested.public)
    key = str(attested.fleet.key_path)
    for argv in (
        ["verify", "--evidence", "r", "--repo", bare],
        ["verify", "--attestation", str(attested.path), "--key", public, "--repo", bare],
        ["attest", "r", "--repo", bare, "--key", key],
    ):
        code, as_json = printed(capsys, *argv, "-o", "json")
        assert code == 0, as_json
        same, as_yaml = printed(capsys, *argv, "-o", "yaml")
        assert same == 0
        assert load_yaml("out", as_yaml.encode()) == json.loads(as_json), argv
    _, evidence = printed(capsys, "verify", "--evidence", "r", "--repo", bare, "-o", "json")
    record = json.loads(evidence)
    assert record["ok"] is True and [n["name"] for n in record["nodes"]] == list(NODES)
    _, envelope = printed(capsys, "attest", "r", "--repo", bare, "--key", key, "-o", "json")
    assert json.loads(envelope) == attested.envelope


def test_o_is_format_on_approve_and_on_verify_of_a_commit(
    fleet: AgentFleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "people").mkdir()
    alice, _ = person(tmp_path / "people", "alice")
    bob, bob_id = person(tmp_path / "people", "bob")
    signers = tmp_path / "allowed_signers"
    signers.write_text(
        "".join(
            f"{who} {Path(f'{k}.pub').read_text()}"
            for who, k in (("alice@example.com", alice), ("bob@example.com", bob))
        )
    )
    env = git_env("Alice", "alice@example.com")
    fleet.pull()
    (fleet.work / "rollouts").mkdir()
    (fleet.work / "rollouts" / "r.yaml").write_text(rollout_yaml("r", nodeIds=list(NODES)))
    git("add", "-A", cwd=fleet.work, env=env)
    git(
        "-c", "gpg.format=ssh", "-c", f"user.signingKey={alice}",
        "commit", "-q", "-S", "-m", "Roll out r", cwd=fleet.work, env=env,
    )  # fmt: skip
    change = git("rev-parse", "HEAD", cwd=fleet.work).strip()
    approve = ["approve", change, "--key", str(bob), "--repo", str(fleet.work)]

    code, as_json = printed(capsys, *approve, "-o", "json")
    assert code == 0
    record = json.loads(as_json)
    assert record["commit"] == change and record["keyId"] == bob_id and record["added"] is True
    code, as_yaml = printed(capsys, *approve, "-o", "yaml")
    assert code == 0
    assert load_yaml("out", as_yaml.encode()) == dict(record, added=False)  # approved already

    verify = ["verify", "--repo", str(fleet.work), "--allowed-signers", str(signers)]
    verify += ["--require-approvals", "1", "HEAD"]
    code, as_json = printed(capsys, *verify, "-o", "json")
    record = json.loads(as_json)
    assert code == 0, as_json
    assert record["actedOn"] is True and record["newestSpecCommit"] == change
    code, as_yaml = printed(capsys, *verify, "-o", "yaml")
    assert load_yaml("out", as_yaml.encode()) == record
