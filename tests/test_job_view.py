"""The node reads a job as one typed value, parsed from the signed payload the
same way at admission and when the journal is read back after a restart; the
journal keeps the payload exactly as it was signed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from reconciler.protocol.job_payload import payload_problems
from reconciler.protocol.job_view import (
    EvalRequest,
    JobDrain,
    JobSigner,
    JobTarget,
    JobWarmup,
    read_job,
)
from reconciler.protocol.signing import SigningKey
from tests.kit.agents import AgentThread
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key

SHA = "ab" * 32
SIGNATURE_SHA = "cd" * 32
SUITE_SHA = "ef" * 32


def _every_field() -> dict[str, Any]:
    """A live apply carrying every optional field an apply may carry."""
    return {
        "schema": "reconciler.job/v1",
        "jobId": "apply-0001",
        "kind": "apply",
        "node": "node-a",
        "rollout": "llama",
        "attempt": 2,
        "mode": "live",
        "target": {"runtime": "hermes", "provider": "vllm", "model": "m1", "profile": "p"},
        "sourceCommit": "0123456789abcdef",
        "issuedAt": "2026-12-01T09:00:00Z",
        "expiresAt": "2026-12-01T09:15:00Z",
        "artifacts": [
            {"name": "weights", "url": "http://127.0.0.1:9/w", "sha256": SHA, "size": 5},
            {
                "name": "tokenizer",
                "path": "tok/t.json",
                "url": "http://127.0.0.1:9/t",
                "sha256": SHA,
                "size": 7,
            },
        ],
        "signature": {"url": "http://127.0.0.1:9/s", "sha256": SIGNATURE_SHA, "size": 3},
        "signers": [{"name": "release", "publicKey": "PEM"}],
        "drain": {
            "timeoutSeconds": 30,
            "idle": {"url": "http://127.0.0.1:9/metrics", "metric": "busy", "max": 0},
        },
        "warmup": [
            {
                "url": "http://127.0.0.1:{slotPort}/health",
                "method": "GET",
                "body": "",
                "expectStatus": 200,
                "timeoutSeconds": 5,
                "times": 2,
            }
        ],
        "evals": [
            {
                "name": "golden",
                "url": "http://127.0.0.1:{slotPort}",
                "minPassRate": 90,
                "timeout": 60,
                "api": "chat",
                "request": {"maxTokens": 16, "temperature": 0},
                "suiteSha256": SUITE_SHA,
                "cases": [
                    {"name": "hello", "messages": [], "expect": {"contains": "hi"}},
                ],
            }
        ],
        "standby": {"keepPrevious": "untilSoaked"},
        "checks": [
            {
                "name": "up",
                "intervalSeconds": 10,
                "tcp": {"host": "127.0.0.1", "port": 9, "timeoutSeconds": 1},
            }
        ],
    }


def test_a_payload_with_every_field_reads_as_typed_records() -> None:
    signed = _every_field()
    assert payload_problems(signed) == []

    read = read_job(signed)

    assert read.signed is signed
    assert (read.job_id, read.kind, read.node, read.rollout) == (
        "apply-0001",
        "apply",
        "node-a",
        "llama",
    )
    assert (read.attempt, read.mode, read.live) == (2, "live", True)
    assert read.target == JobTarget("hermes", "vllm", "m1", "p")
    assert [a.name for a in read.artifacts] == ["weights", "tokenizer"]
    assert [a.path for a in read.artifacts] == [None, "tok/t.json"]
    assert read.artifact_entries() == signed["artifacts"]
    assert read.signature is not None and read.signature.sha256 == SIGNATURE_SHA
    assert read.signers == (JobSigner("release", "PEM"),)
    assert read.drain == JobDrain(30, "http://127.0.0.1:9/metrics", ("busy",), 0.0)
    assert read.warmup == (JobWarmup("http://127.0.0.1:{slotPort}/health", "GET", "", 200, 5, 2),)
    [suite] = read.evals
    assert (suite.name, suite.api, suite.min_pass_rate, suite.timeout) == (
        "golden",
        "chat",
        90.0,
        60,
    )
    assert suite.request == EvalRequest(16, 0, None)
    assert suite.cases == tuple(signed["evals"][0]["cases"])
    assert read.checks == tuple(signed["checks"])
    assert (read.standby, read.keep_previous) == (True, "untilSoaked")
    assert (read.backup_id, read.timeout_seconds) == (None, None)


def test_the_kinds_without_apply_fields_read_with_their_own() -> None:
    base = {k: v for k, v in _every_field().items() if k in _REQUIRED}
    restore = read_job({**base, "kind": "restore", "backupId": "hermes-1"})
    stage = read_job(
        {**base, "kind": "stage", "artifacts": _every_field()["artifacts"], "timeoutSeconds": 600}
    )
    evals = read_job({**base, "kind": "eval", "evals": _every_field()["evals"]})
    release = read_job({**base, "kind": "release"})

    assert (restore.kind, restore.backup_id, restore.standby) == ("restore", "hermes-1", False)
    assert (stage.kind, stage.timeout_seconds, len(stage.artifacts)) == ("stage", 600, 2)
    assert (evals.kind, [e.name for e in evals.evals]) == ("eval", ["golden"])
    assert (release.kind, release.artifacts, release.evals, release.drain) == (
        "release",
        (),
        (),
        None,
    )


_REQUIRED = (
    "schema", "jobId", "kind", "node", "rollout", "attempt", "mode", "target",
    "sourceCommit", "issuedAt", "expiresAt",
)  # fmt: skip


def test_a_slot_port_reaches_warmups_evals_and_case_urls_and_nothing_signed() -> None:
    signed = _every_field()
    signed["evals"][0]["cases"][0]["messages"] = [{"url": "http://127.0.0.1:{slotPort}/x"}]
    before = json.dumps(signed, sort_keys=True)

    on_slot = read_job(signed).on_slot_port(8081)

    assert [w.url for w in on_slot.warmup] == ["http://127.0.0.1:8081/health"]
    assert [e.url for e in on_slot.evals] == ["http://127.0.0.1:8081"]
    assert on_slot.evals[0].cases[0]["messages"] == [{"url": "http://127.0.0.1:8081/x"}]
    assert json.dumps(on_slot.signed, sort_keys=True) == before, "the signed payload changed"


def test_a_journalled_job_reads_back_after_a_restart_as_the_job_admitted(tmp_path: Path) -> None:
    key: SigningKey = make_key(tmp_path / "keys" / "reconciler").signing
    state = tmp_path / "state"
    (state / "runtimes").mkdir(parents=True)
    (state / "runtimes" / "hermes.yaml").write_text(
        "provider: vllm\nmodel: old\nprofile: default\n"
    )
    sent = envelope(job("apply-0001", mode="dry_run"), key)

    agent = AgentThread(state, [key])
    try:
        status, _ = agent.post(sent)
        agent.wait_finished("apply-0001")
        admitted = agent.agent.journal.jobs["apply-0001"].job
    finally:
        agent.close()
    stored = json.loads((state / "jobs" / "apply-0001.json").read_bytes())
    again = AgentThread(state, [key])
    try:
        restarted = again.agent.journal.jobs["apply-0001"].job
    finally:
        again.close()

    assert status == 202
    assert stored["payload"] == sent["payload"], "the journal must keep the signed payload"
    assert "job" not in stored, "the typed job must not reach the record on disk"
    assert restarted == admitted == read_job(sent["payload"])
    assert (restarted.kind, restarted.mode, restarted.target.runtime) == (
        "apply",
        "dry_run",
        "hermes",
    )


def test_node_commands_see_every_job_variable_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every RECONCILER_ variable an apply and then a restore of its backup
    give the after-apply command, compared whole: the typed job must leave
    them byte for byte as the signed payload gave them. The agent's own
    environment holds none, so every one seen is the job's."""
    for name in [n for n in os.environ if n.startswith("RECONCILER_")]:
        monkeypatch.delenv(name)
    key: SigningKey = make_key(tmp_path / "keys" / "reconciler").signing
    state = tmp_path / "state"
    (state / "runtimes").mkdir(parents=True)
    (state / "runtimes" / "hermes.yaml").write_text(
        "provider: vllm\nmodel: old\nprofile: default\n"
    )
    seen = tmp_path / "env"
    seen.mkdir()
    command = f'env | grep ^RECONCILER_ | sort > {seen}/"$RECONCILER_JOB_ID"'
    agent = AgentThread(state, [key], after_apply=command)
    try:
        agent.post(envelope(job("apply-0001", attempt=3), key))
        backup = agent.wait_finished("apply-0001")["backupId"]
        agent.post(envelope(job("restore-0001", kind="restore", backup_id=backup), key))
        restored = agent.wait_finished("restore-0001")
    finally:
        agent.close()

    def env(job_id: str) -> dict[str, str]:
        lines = (seen / job_id).read_text().splitlines()
        return dict(line.split("=", 1) for line in lines)

    common = {
        "RECONCILER_NODE": "node-a",
        "RECONCILER_ROLLOUT": "llama",
        "RECONCILER_MODE": "live",
        "RECONCILER_RUNTIME": "hermes",
        "RECONCILER_SOURCE_COMMIT": "0123456789abcdef0123456789abcdef01234567",
        "RECONCILER_CONFIG": str(state.absolute() / "runtimes" / "hermes.yaml"),
    }
    assert restored["state"] == "succeeded"
    assert env("apply-0001") == {
        **common,
        "RECONCILER_JOB_ID": "apply-0001",
        "RECONCILER_KIND": "apply",
        "RECONCILER_ATTEMPT": "3",
        "RECONCILER_BACKUP_ID": "",
        "RECONCILER_PROVIDER": "vllm",
        "RECONCILER_MODEL": "llama3.1-8b",
        "RECONCILER_PROFILE": "default",
    }
    assert env("restore-0001") == {
        **common,
        "RECONCILER_JOB_ID": "restore-0001",
        "RECONCILER_KIND": "restore",
        "RECONCILER_ATTEMPT": "1",
        "RECONCILER_BACKUP_ID": backup,
        "RECONCILER_PROVIDER": "vllm",
        "RECONCILER_MODEL": "old",
        "RECONCILER_PROFILE": "default",
    }
