"""Keys, key ids and signed envelopes: what the daemon signs is what every
agent verifies, and the key id is the one ssh-keygen shows."""

from __future__ import annotations

import copy
import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from reconciler.protocol.job_ids import job_id
from reconciler.protocol.job_payload import (
    JOB_TTL,
    _validators,
    build_payload,
    payload_problems,
    same_job,
)
from reconciler.protocol.signing import (
    JobRefused,
    canonical_json,
    envelope_bytes,
    generate_key,
    load_private_key,
    load_public_key,
    load_trusted_keys,
    make_envelope,
    verify_envelope,
)
from reconciler.spec.artifacts import Artifact, Drain, Warmup
from reconciler.spec.errors import KeyFileError
from reconciler.spec.evals import Eval, EvalCase, EvalSuite
from tests.kit.jobs import job
from tests.kit.keys import make_key

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def ssh_keygen_fingerprint(path: Path) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-lf", str(path)], check=True, capture_output=True, text=True
    ).stdout
    return out.split()[1]


def test_generated_key_id_is_what_ssh_keygen_prints(tmp_path: Path) -> None:
    private, public = generate_key(tmp_path / "keys")

    key = load_private_key(private)

    assert key.key_id.startswith("SHA256:")
    assert key.key_id == ssh_keygen_fingerprint(public)
    assert key.key_id == ssh_keygen_fingerprint(private)
    assert load_public_key(public).key_id == key.key_id


def test_generated_files_are_openssh_and_the_private_key_is_0600(tmp_path: Path) -> None:
    old_umask = os.umask(0)  # a careless umask must not make the key readable
    try:
        private, public = generate_key(tmp_path / "keys")
    finally:
        os.umask(old_umask)

    assert private.name == "reconciler" and public.name == "reconciler.pub"
    assert private.stat().st_mode & 0o777 == 0o600
    assert private.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    derived = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(private)], check=True, capture_output=True, text=True
    ).stdout
    assert derived.split()[:2] == public.read_text().split()[:2]


def test_a_key_made_by_ssh_keygen_loads_with_the_same_id(tmp_path: Path) -> None:
    path = tmp_path / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ops", "-f", str(path)], check=True
    )

    assert load_private_key(path).key_id == ssh_keygen_fingerprint(path)
    assert load_public_key(path.with_suffix(".pub")).key_id == ssh_keygen_fingerprint(path)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_a_private_key_readable_by_others_is_refused_with_the_fix(
    tmp_path: Path, mode: int
) -> None:
    private, _ = generate_key(tmp_path / "keys")
    private.chmod(mode)

    with pytest.raises(KeyFileError) as refused:
        load_private_key(private)

    assert "accessible by others" in str(refused.value)
    assert refused.value.hint == f"make it private: chmod 600 {private}"


def test_a_world_readable_file_that_is_no_key_is_named_as_no_key_not_given_chmod_advice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``keys id /etc/passwd`` used to advise ``chmod 600 /etc/passwd``."""
    from reconciler.cli import main as cli

    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    passwd.chmod(0o644)

    with pytest.raises(KeyFileError) as refused:
        load_private_key(passwd)
    assert "is not an unencrypted OpenSSH private key" in str(refused.value)
    assert "chmod" not in (refused.value.hint or "")

    assert cli.main(["keys", "id", str(passwd)]) == 1
    err = capsys.readouterr().err
    assert "not an unencrypted OpenSSH private key" in err and "chmod" not in err


def test_generate_never_overwrites_a_key(tmp_path: Path) -> None:
    private, _ = generate_key(tmp_path / "keys")
    before = private.read_bytes()

    with pytest.raises(KeyFileError, match="already exists"):
        generate_key(tmp_path / "keys")

    assert private.read_bytes() == before


def test_missing_and_wrong_key_files_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="does not exist"):
        load_private_key(tmp_path / "nothing")
    junk = tmp_path / "junk.pub"
    junk.write_text("not a key\n")
    with pytest.raises(KeyFileError, match="not an OpenSSH public key"):
        load_public_key(junk)
    rsa = tmp_path / "id_rsa"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "rsa", "-b", "1024", "-N", "", "-f", str(rsa)], check=True
    )
    with pytest.raises(KeyFileError, match="not an Ed25519"):
        load_private_key(rsa)
    with pytest.raises(KeyFileError, match="no trust key"):
        load_trusted_keys([])


def test_canonical_json_sorts_keys_without_spaces_and_keeps_utf8() -> None:
    assert canonical_json({"b": 1, "a": {"é": "ü", "c": [1, 2]}}) == (
        '{"a":{"c":[1,2],"é":"ü"},"b":1}'.encode()
    )


def test_payload_has_every_field_and_expires_after_fifteen_minutes() -> None:
    payload = build_payload(job(), NOW)

    assert payload == {
        "schema": "reconciler.job/v1",
        "jobId": "apply-0001",
        "kind": "apply",
        "node": "node-a",
        "rollout": "llama",
        "attempt": 1,
        "mode": "live",
        "target": {
            "runtime": "hermes",
            "provider": "vllm",
            "model": "llama3.1-8b",
            "profile": "default",
        },
        "sourceCommit": "0123456789abcdef0123456789abcdef01234567",
        "issuedAt": "2026-12-01T09:00:00Z",
        "expiresAt": "2026-12-01T09:15:00Z",
    }
    assert timedelta(minutes=15) == JOB_TTL
    restore = build_payload(job(kind="restore", backup_id="hermes-1"), NOW)
    assert restore["backupId"] == "hermes-1"
    assert payload_problems(payload) == [] and payload_problems(restore) == []


def test_a_stage_job_carries_its_artifacts_and_no_checks() -> None:
    weights = Artifact("weights", "https://mirror.example/m.gguf", "0f" * 32, 4920734976)
    stage_id = job_id("llama", "c" * 40, "node-a", 1, "stage")

    payload = build_payload(job(stage_id, kind="stage", artifacts=(weights,)), NOW)

    assert stage_id.startswith("stage-")
    assert stage_id != job_id("llama", "c" * 40, "node-a", 1, "apply")
    assert payload["kind"] == "stage"
    assert payload["artifacts"] == [
        {
            "name": "weights",
            "url": "https://mirror.example/m.gguf",
            "sha256": "0f" * 32,
            "size": 4920734976,
        }
    ]
    assert not {"checks", "backupId", "drain", "warmup"} & payload.keys()
    assert payload_problems(payload) == []
    for refused in ("checks", "drain", "warmup", "backupId"):
        donor = build_payload(job(mode="live", drain=DRAIN, warmup=(WARMUP,)), NOW)
        donor |= {"backupId": "b-1", "checks": [{"name": "up", "intervalSeconds": 5}]}
        assert payload_problems(payload | {refused: donor[refused]}) != [], refused
    assert payload_problems({k: v for k, v in payload.items() if k != "artifacts"}) != []


def test_a_live_apply_carries_drain_and_warmup_for_its_own_node() -> None:
    drain = Drain(300, "http://{node}:8000/metrics", "vllm:num_requests_running", 0)
    warmup = Warmup("http://{node}:8000/v1/completions", "POST", '{"prompt":"hi"}', 200, 60, 2)
    send = job(mode="live", artifacts=(WEIGHTS,), drain=drain, warmup=(warmup,))

    payload = build_payload(send, NOW)

    assert payload["drain"] == {
        "timeoutSeconds": 300,
        "idle": {
            "url": "http://node-a:8000/metrics",
            "metric": "vllm:num_requests_running",
            "max": 0,
        },
    }
    assert payload["warmup"] == [
        {
            "url": "http://node-a:8000/v1/completions",
            "method": "POST",
            "body": '{"prompt":"hi"}',
            "expectStatus": 200,
            "timeoutSeconds": 60,
            "times": 2,
        }
    ]
    assert payload["artifacts"][0]["name"] == "weights"
    assert payload_problems(payload) == []
    dry_run = payload | {"mode": "dry_run"}
    assert payload_problems(dry_run) != []
    assert (
        payload_problems({k: v for k, v in dry_run.items() if k not in ("drain", "warmup")}) == []
    )
    restore = build_payload(job(kind="restore", backup_id="b-1"), NOW)
    assert payload_problems(restore | {"artifacts": payload["artifacts"]}) != []


def test_same_job_ignores_only_the_send_times() -> None:
    first = build_payload(job(), NOW)
    later = build_payload(job(), NOW + timedelta(minutes=7))

    assert same_job(first, later)
    assert not same_job(first, build_payload(job(attempt=2), NOW))


def test_envelope_round_trip_and_its_bytes(tmp_path: Path) -> None:
    key = make_key(tmp_path / "reconciler").signing
    payload = build_payload(job(), NOW)

    env = make_envelope(payload, key)

    assert set(env) == {"payload", "keyId", "signature"}
    assert env["keyId"] == key.key_id
    assert verify_envelope(env, {key.key_id: key.trusted()}) == payload
    assert envelope_bytes(payload, key) == canonical_json(env)


def refusal(env: Any, trusted: dict[str, Any]) -> str:
    with pytest.raises(JobRefused) as refused:
        verify_envelope(env, trusted)
    return refused.value.code


def test_verification_refuses_in_the_documented_order(tmp_path: Path) -> None:
    key = make_key(tmp_path / "a" / "reconciler").signing
    stranger = make_key(tmp_path / "b" / "reconciler").signing
    trusted = {key.key_id: key.trusted()}
    good = make_envelope(build_payload(job(), NOW), key)

    assert refusal([good], trusted) == "invalid_job"
    assert refusal({**good, "extra": 1}, trusted) == "invalid_job"
    broken = copy.deepcopy(good)
    del broken["payload"]["sourceCommit"]
    assert refusal(broken, trusted) == "invalid_job"
    # a stranger's envelope that is also malformed: the schema speaks first
    strange = make_envelope(build_payload(job(), NOW), stranger)
    assert refusal({**strange, "signature": "x"}, trusted) == "invalid_job"
    assert refusal(strange, trusted) == "untrusted_key"
    forged = {**strange, "keyId": key.key_id}
    assert refusal(forged, trusted) == "bad_signature"


def test_several_trust_keys_accept_either_signer(tmp_path: Path) -> None:
    made = make_key(tmp_path / "old" / "reconciler")
    old, old_pub = made.signing, made.public
    made = make_key(tmp_path / "new" / "reconciler")
    new, new_pub = made.signing, made.public
    trusted = load_trusted_keys([old_pub, new_pub])
    payload = build_payload(job(), NOW)

    assert verify_envelope(make_envelope(payload, old), trusted) == payload
    assert verify_envelope(make_envelope(payload, new), trusted) == payload


def test_any_change_to_a_signed_payload_is_refused(tmp_path: Path) -> None:
    key = make_key(tmp_path / "reconciler").signing
    trusted = {key.key_id: key.trusted()}
    env = make_envelope(build_payload(job(kind="restore", backup_id="b-1"), NOW), key)
    changes = {
        "jobId": "apply-0002",
        "kind": "apply",
        "node": "node-b",
        "rollout": "other",
        "attempt": 2,
        "backupId": "b-2",
        "sourceCommit": "f" * 40,
        "issuedAt": "2026-12-01T09:00:01Z",
        "expiresAt": "2026-12-01T09:14:00Z",
    }
    for field, value in changes.items():
        tampered = copy.deepcopy(env)
        tampered["payload"][field] = value
        assert refusal(tampered, trusted) in ("bad_signature", "invalid_job"), field
    for field in ("runtime", "provider", "model", "profile"):
        tampered = copy.deepcopy(env)
        tampered["payload"]["target"][field] = "x" + tampered["payload"]["target"][field]
        assert refusal(tampered, trusted) == "bad_signature", field


# -- the schema's fast path agrees with jsonschema --------------------------------

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 3),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.sampled_from(["apply", "restore", "live", "dry_run", "x\n", "a" * 300, "Node", "-a"]),
    st.just({}),
    st.just([]),
)


WEIGHTS = Artifact("weights", "https://mirror.example/m.gguf", "0f" * 32, 4920734976)
TOKENIZER = Artifact("tokenizer", "http://127.0.0.1:8080/t.json", "a1" * 32, 1)
DRAIN = Drain(300, "http://{node}:8000/metrics", "vllm:num_requests_running", 0)
WARMUP = Warmup("http://127.0.0.1:8000/v1/completions", "POST", '{"prompt":"hi"}', 200, 60, 2)

GOLDEN = Eval(
    "golden",
    "golden",
    "http://127.0.0.1:8080",
    suite=EvalSuite(
        "golden", "ab" * 32, (EvalCase("same", "matchesBaseline", "true", prompt="Hi"),)
    ),
)

# A job of each shape the daemon sends, to mutate.
SHAPES = {
    "apply": job(mode="live"),
    "apply-dry-run": job(mode="dry_run", artifacts=(WEIGHTS,)),
    "apply-artifacts": job(
        mode="live", artifacts=(WEIGHTS, TOKENIZER), drain=DRAIN, warmup=(WARMUP,)
    ),
    "restore": job(kind="restore", backup_id="b-1", mode="live"),
    "stage": job("stage-0001", kind="stage", mode="live", artifacts=(WEIGHTS, TOKENIZER)),
    "stage-dry-run": job("stage-0001", kind="stage", mode="dry_run", artifacts=(WEIGHTS,)),
    "apply-standby": job(mode="live", warmup=(WARMUP,), standby="untilSoaked"),
    "eval": job("eval-0001", kind="eval", mode="live", evals=(GOLDEN,)),
    "release": job("release-0001", kind="release", mode="live"),
}
# Where a mutation may land inside a nested field, and the keys it may touch.
INNER = {
    "target": ["runtime", "provider", "model", "profile", "x"],
    "artifacts/0": ["name", "url", "sha256", "size", "x"],
    "drain": ["timeoutSeconds", "idle", "x"],
    "drain/idle": ["url", "metric", "max", "x"],
    "warmup/0": ["url", "method", "body", "expectStatus", "timeoutSeconds", "times", "x"],
    "standby": ["keepPrevious", "x"],
}
NESTED_VALUES = st.one_of(
    VALUES,
    st.sampled_from(["0f" * 32, "0F" * 32, "ftp://x", "http://h\n", "POST", "GET ", "a:b_c"]),
    st.sampled_from([1, 2**40, 599, 600, 86401, 0.5, -0.0]),
)


def _inner(document: dict[str, Any], where: str) -> Any:
    value: Any = document
    for step in where.split("/"):
        if isinstance(value, list):
            value = value[int(step)] if value and step.isdigit() else None
        elif isinstance(value, dict):
            value = value.get(step)
        else:
            return None
    return value if isinstance(value, dict) else None


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    shape = draw(st.sampled_from(sorted(SHAPES)))
    base = build_payload(SHAPES[shape], NOW)
    document: dict[str, Any] = copy.deepcopy(base)
    fields = [
        *sorted(base),
        *("kind", "mode", "backupId", "artifacts", "drain", "warmup", "standby", "evals", "extra"),
    ]
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from([*fields, *INNER]))
        if where in INNER:
            inner = _inner(document, where)
            if inner is None:
                continue
            key = draw(st.sampled_from(INNER[where]))
            if draw(st.booleans()) and key in inner:
                del inner[key]
            else:
                inner[key] = draw(NESTED_VALUES)
        elif draw(st.booleans()) and where in document:
            del document[where]
        elif where == "kind":
            document[where] = draw(
                st.sampled_from(["apply", "restore", "stage", "eval", "release", "Stage"])
            )
        elif where in base or where == "extra":
            document[where] = draw(VALUES)
        else:
            # a field another shape carries, moved onto this one
            donor = build_payload(SHAPES["apply-artifacts"], NOW) | {
                "backupId": "b-1",
                "standby": {"keepPrevious": "untilCompleted"},
                "evals": build_payload(SHAPES["eval"], NOW)["evals"],
            }
            document[where] = copy.deepcopy(donor[where])
    return document


def _integral_floats(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_integral_floats(v) for v in value.values())
    if isinstance(value, list):
        return any(_integral_floats(v) for v in value)
    return type(value) is float and value.is_integer()


def _newlines(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_newlines(v) for v in value.values())
    if isinstance(value, list):
        return any(_newlines(v) for v in value)
    return isinstance(value, str) and value.endswith("\n")


@settings(max_examples=400, deadline=None)
@given(mutated())
def test_the_fast_check_never_accepts_what_the_schema_refuses(document: dict[str, Any]) -> None:
    validator: Draft202012Validator = _validators()[0]

    if not payload_problems(document):
        assert validator.is_valid(document)
    elif validator.is_valid(document):
        # the corners refused on purpose (see job_payload.py); "max" is a
        # number, so an integral float is plain there
        idle = _inner(document, "drain/idle")
        floats = dict(document, drain={**document["drain"], "idle": {}}) if idle else document
        assert _newlines(document) or _integral_floats(floats) or _bad_dates(document)


def _bad_dates(document: dict[str, Any]) -> bool:
    """issuedAt/expiresAt that match the pattern but are no such date, or
    expire too late: the schema cannot say either."""
    try:
        issued = datetime.fromisoformat(document["issuedAt"])
        expires = datetime.fromisoformat(document["expiresAt"])
    except ValueError:
        return True
    return not issued < expires <= issued + JOB_TTL


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_the_daemon_sends_passes_both_checks(shape: str) -> None:
    payload = build_payload(SHAPES[shape], NOW)

    assert payload_problems(payload) == []
    assert _validators()[0].is_valid(payload)
