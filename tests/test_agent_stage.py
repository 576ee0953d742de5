"""Stage jobs on a real agent, from a real nginx: signed and journalled
like an apply, never downloading what is held, refusing an apply whose
artifacts are not held, resuming after the agent was SIGKILLed
mid-download, and pointing the runtime's config at the files."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconciler.protocol.signing import SigningKey
from reconciler.spec.artifacts import Artifact
from reconciler.spec.model import Target
from reconciler.spec.safe_yaml import load_yaml
from tests.kit.agents import AgentThread, start_agent
from tests.kit.jobs import envelope, job
from tests.kit.keys import Key, make_key
from tests.kit.nginx import NginxServer, make_ca_and_cert
from tests.kit.waiting import wait_for

MiB = 1024 * 1024
OLD_CONFIG = b"provider: vllm\nmodel: llama3-old\nprofile: default\n"


def _blob(size: int) -> bytes:
    block = hashlib.sha256(b"model").digest() * 2048
    return (block * (size // len(block) + 1))[:size]


@pytest.fixture
def owner(tmp_path: Path) -> Key:
    return make_key(tmp_path / "keys" / "reconciler")


@pytest.fixture
def key(owner: Key) -> SigningKey:
    return owner.signing


@pytest.fixture
def weights(tmp_path: Path) -> tuple[Path, bytes]:
    folder = tmp_path / "files"
    folder.mkdir()
    data = _blob(4 * MiB)
    (folder / "model.gguf").write_bytes(data)
    return folder, data


@pytest.fixture
def nginx(tmp_path: Path, weights: tuple[Path, bytes]) -> Iterator[NginxServer]:
    with NginxServer(tmp_path / "nginx", weights[0]) as server:
        yield server


@pytest.fixture
def state(tmp_path: Path) -> Path:
    config = tmp_path / "state" / "runtimes" / "hermes.yaml"
    config.parent.mkdir(parents=True)
    config.write_bytes(OLD_CONFIG)
    return tmp_path / "state"


def _artifact(nginx: NginxServer, data: bytes, **changes: object) -> Artifact:
    fields: dict[str, object] = {
        "name": "weights",
        "url": nginx.url("model.gguf"),
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
    }
    fields.update(changes)
    return Artifact(**fields)  # type: ignore[arg-type]


def test_a_stage_job_downloads_once_and_an_apply_then_points_the_config_at_the_file(
    state: Path, key: SigningKey, nginx: NginxServer, weights: tuple[Path, bytes]
) -> None:
    data = weights[1]
    artifact = _artifact(nginx, data)
    agent = AgentThread(state, [key])
    try:
        status, accepted = agent.post(
            envelope(job("stage-1", kind="stage", artifacts=(artifact,)), key)
        )
        assert status == 202 and accepted["state"] == "accepted"
        staged = agent.wait_finished("stage-1")
        assert staged["state"] == "succeeded", staged
        assert staged["detail"] == f"weights: downloaded {len(data)} bytes"
        assert (state / "runtimes" / "hermes.yaml").read_bytes() == OLD_CONFIG  # untouched

        # The same job again is answered from the journal; a new one finds the file held.
        status, again = agent.post(
            envelope(job("stage-1", kind="stage", artifacts=(artifact,)), key)
        )
        assert status == 200 and again["state"] == "succeeded"
        agent.post(envelope(job("stage-2", kind="stage", attempt=2, artifacts=(artifact,)), key))
        assert agent.wait_finished("stage-2")["detail"] == "weights: already held"
        assert [r.split()[:3] for r in nginx.requests(at_least=1)] == [
            ["GET", "/model.gguf", "200"]
        ]

        agent.post(envelope(job("apply-1", artifacts=(artifact,)), key))
        applied = agent.wait_finished("apply-1")
    finally:
        agent.close()
    assert applied["state"] == "succeeded", applied
    config = load_yaml("hermes.yaml", (state / "runtimes" / "hermes.yaml").read_bytes())
    held = state.absolute() / "artifacts" / "sha256" / artifact.sha256
    assert config["artifacts"] == {"weights": {"path": str(held), "sha256": artifact.sha256}}
    assert config["model"] == "llama3.1-8b"
    assert held.read_bytes() == data
    timings = applied["timings"]
    assert timings["drainStartedAt"] is None and timings["drainedAt"] is None
    assert timings["activatedAt"] <= timings["warmedAt"] <= timings["servingAt"]


def test_an_apply_whose_artifacts_are_not_held_is_refused_not_staged_and_nothing_is_recorded(
    state: Path, key: SigningKey, nginx: NginxServer, weights: tuple[Path, bytes]
) -> None:
    agent = AgentThread(state, [key])
    try:
        status, answer = agent.post(
            envelope(job("apply-1", artifacts=(_artifact(nginx, weights[1]),)), key)
        )
    finally:
        agent.close()
    assert status == 409 and answer["error"] == "not_staged"
    assert "weights" in answer["message"]
    assert list((state / "jobs").glob("*.json")) == []
    assert (state / "runtimes" / "hermes.yaml").read_bytes() == OLD_CONFIG


def test_a_stage_that_fails_says_its_code_and_changes_nothing(
    state: Path, key: SigningKey, nginx: NginxServer, weights: tuple[Path, bytes]
) -> None:
    wrong = _artifact(nginx, weights[1], sha256="ab" * 32)
    missing = _artifact(nginx, weights[1], url=nginx.url("gone.gguf"))
    huge = _artifact(nginx, weights[1], size=1 << 60)
    agent = AgentThread(state, [key])
    try:
        for n, artifact in enumerate((wrong, missing, huge), start=1):
            agent.post(
                envelope(job(f"stage-{n}", kind="stage", attempt=n, artifacts=(artifact,)), key)
            )
        failures = [agent.wait_finished(f"stage-{n}")["error"] for n in (1, 2, 3)]
    finally:
        agent.close()
    assert failures[0].startswith("digest_mismatch: weights: expected ")
    assert failures[1].startswith("download_failed: weights: GET ") and "404" in failures[1]
    assert failures[2].startswith(f"insufficient_space: needed {1 << 60} bytes, free ")
    assert list((state / "artifacts" / "sha256").iterdir()) == []
    assert (state / "runtimes" / "hermes.yaml").read_bytes() == OLD_CONFIG


def test_a_dry_run_stage_reports_the_size_and_whether_it_is_held_and_downloads_nothing(
    state: Path, key: SigningKey, nginx: NginxServer, weights: tuple[Path, bytes]
) -> None:
    artifact = _artifact(nginx, weights[1])
    agent = AgentThread(state, [key])
    try:
        agent.post(envelope(job("dry-1", kind="stage", mode="dry_run", artifacts=(artifact,)), key))
        record = agent.wait_finished("dry-1")
    finally:
        agent.close()
    assert record["state"] == "succeeded"
    assert (
        record["detail"]
        == f"would stage: weights: not held; the server reports {len(weights[1])} bytes"
    )
    assert [r.split()[0] for r in nginx.requests(at_least=1)] == ["HEAD"]
    assert list((state / "artifacts" / "sha256").iterdir()) == []


def test_an_agent_sigkilled_mid_download_resumes_from_the_partial_file_after_restart(
    tmp_path: Path, owner: Key, weights: tuple[Path, bytes]
) -> None:
    data = weights[1]
    with NginxServer(tmp_path / "nginx", weights[0], rate=MiB) as nginx:
        artifact = _artifact(nginx, data)
        agent = start_agent(
            tmp_path / "a1", "node-a", owner.public, config=OLD_CONFIG, keep_port=True
        )
        try:
            body = envelope(job("stage-1", kind="stage", artifacts=(artifact,)), owner.signing)
            assert (
                httpx.post(f"{agent.url}/v1/nodes/node-a/jobs", json=body, timeout=10).status_code
                == 202
            )
            partial = agent.state / "artifacts" / "sha256" / f"{artifact.sha256}.partial"
            wait_for(
                lambda: partial.exists() and partial.stat().st_size >= MiB,
                what="a partial download",
                timeout=60,
            )
            agent.process.send_signal(signal.SIGKILL)
            agent.process.wait()
            kept = partial.stat().st_size
            assert 0 < kept < len(data)

            agent.restart()
            failed = agent.get("jobs/stage-1")
            assert failed["state"] == "failed"
            assert failed["error"].startswith("agent restarted while staging")
            again = envelope(
                job("stage-2", kind="stage", attempt=2, artifacts=(artifact,)), owner.signing
            )
            httpx.post(f"{agent.url}/v1/nodes/node-a/jobs", json=again, timeout=10)
            done = wait_for(
                lambda: (r := agent.get("jobs/stage-2"))["state"] in ("succeeded", "failed") and r,
                what="the second stage job",
                timeout=120,
            )
        finally:
            agent.close()
        lines = nginx.requests(at_least=2)
    assert done["state"] == "succeeded", done
    assert "resumed from byte" in done["detail"]
    resumed_at = int(done["detail"].rsplit(" ", 1)[1].rstrip(")"))
    assert resumed_at >= kept  # what the killed run wrote is kept, not fetched again
    assert lines[-1].split()[-1] == f"bytes={resumed_at}-"
    assert (agent.state / "artifacts" / "sha256" / artifact.sha256).read_bytes() == data
    journal = [json.loads(p.read_bytes()) for p in (agent.state / "jobs").glob("*.json")]
    assert sorted(r["job_id"] for r in journal) == ["stage-1", "stage-2"]


def test_retention_over_many_rollouts_keeps_what_a_restore_needs_and_bounds_the_rest(
    tmp_path: Path, state: Path, key: SigningKey
) -> None:
    files = tmp_path / "files"
    files.mkdir()
    blobs = [_blob(1000 + n) for n in range(12)]
    for n, blob in enumerate(blobs):
        (files / f"m{n}.bin").write_bytes(blob)
    held_dir = state / "artifacts" / "sha256"
    with NginxServer(tmp_path / "nginx", files) as nginx:
        agent = AgentThread(state, [key], keep_artifacts=1)
        try:
            for n, blob in enumerate(blobs):
                artifact = Artifact(
                    "weights", nginx.url(f"m{n}.bin"), hashlib.sha256(blob).hexdigest(), len(blob)
                )
                rollout = f"r{n}"
                agent.post(
                    envelope(
                        job(f"s{n}", kind="stage", rollout=rollout, artifacts=(artifact,)), key
                    )
                )
                assert agent.wait_finished(f"s{n}")["state"] == "succeeded"
                agent.post(
                    envelope(
                        job(f"a{n}", rollout=rollout, target=_target(n), artifacts=(artifact,)), key
                    )
                )
                assert agent.wait_finished(f"a{n}")["state"] == "succeeded"
                held = {p.name for p in held_dir.iterdir()}
                current = hashlib.sha256(blob).hexdigest()
                assert current in held
                if n:
                    assert hashlib.sha256(blobs[n - 1]).hexdigest() in held  # the previous config's
                assert len(held) <= 2 + 1  # current, previous, and one more at most
        finally:
            agent.close()


def _target(n: int) -> Target:
    return Target("hermes", "vllm", f"model-{n}", "default")


def test_the_agent_command_takes_the_artifact_options_and_refuses_bad_ones(
    tmp_path: Path, owner: Key
) -> None:
    agent = start_agent(
        tmp_path / "a1",
        "node-a",
        owner.public,
        config=OLD_CONFIG,
        extra=["--stage-rate", "1000", "--keep-artifacts", "3", "--drain-command", "true"],
    )
    agent.close()
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate\n")
    refused = subprocess.run(
        [sys.executable, "-m", "reconciler", "agent", "--node", "n", "--state-dir", str(tmp_path / "s"),
         "--trust-key", str(owner.public), "--runtime", "hermes", "--ca-file", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "--ca-file" in refused.stderr


def test_an_apply_with_artifacts_cut_off_by_a_crash_is_reported_as_having_left_the_config_new(
    state: Path, key: SigningKey, nginx: NginxServer, weights: tuple[Path, bytes]
) -> None:
    artifact = _artifact(nginx, weights[1])
    agent = AgentThread(state, [key])
    try:
        agent.post(envelope(job("stage-1", kind="stage", artifacts=(artifact,)), key))
        agent.wait_finished("stage-1")
        agent.post(envelope(job("apply-1", artifacts=(artifact,)), key))
        assert agent.wait_finished("apply-1")["state"] == "succeeded"
    finally:
        agent.close()
    # As a crash after the config was written and before the verdict leaves it.
    record_file = state / "jobs" / "apply-1.json"
    record = json.loads(record_file.read_bytes())
    record.update(state="accepted", finished_at=None, backup_id=None, detail="", timings=None)
    record_file.write_text(json.dumps(record))

    agent = AgentThread(state, [key])
    try:
        status, recovered = agent.get("jobs/apply-1")
    finally:
        agent.close()
    assert status == 200 and recovered["state"] == "failed"
    assert recovered["error"] == "agent restarted during apply; config left as new"
    assert recovered["backupId"]  # the old config is still there to restore


def test_an_https_mirror_is_trusted_only_through_the_agents_ca_file(
    tmp_path: Path, key: SigningKey, weights: tuple[Path, bytes]
) -> None:
    folder, data = weights
    ca, cert, tls_key = make_ca_and_cert(tmp_path / "tls")
    state_a, state_b = tmp_path / "a", tmp_path / "b"
    for state in (state_a, state_b):
        (state / "runtimes").mkdir(parents=True)
        (state / "runtimes" / "hermes.yaml").write_bytes(OLD_CONFIG)
    with NginxServer(tmp_path / "nginx-tls", folder, tls=(cert, tls_key)) as nginx:
        artifact = _artifact(nginx, data)
        send = envelope(job("stage-1", kind="stage", artifacts=(artifact,)), key)
        plain = AgentThread(state_a, [key])
        trusting = AgentThread(state_b, [key], ca_file=str(ca))
        try:
            plain.post(send)
            trusting.post(send)
            refused = plain.wait_finished("stage-1")
            staged = trusting.wait_finished("stage-1")
        finally:
            plain.close()
            trusting.close()
    assert refused["state"] == "failed"
    assert refused["error"].startswith("download_failed: weights: the certificate of 127.0.0.1:")
    assert "--ca-file" in refused["error"]
    assert staged["state"] == "succeeded", staged


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Each sample of a Prometheus scrape by name and sorted labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_real_agent_counts_bytes_downloaded_stage_seconds_and_its_store_size(
    tmp_path: Path, owner: Key, nginx: NginxServer, weights: tuple[Path, bytes]
) -> None:
    """The staging metrics through a scrape of a real agent process: a
    download's bytes once, a file already held adds none, every live stage
    job is timed, and the store's size is read at the scrape."""
    data = weights[1]
    artifact = _artifact(nginx, data)
    agent = start_agent(tmp_path / "a1", "node-a", owner.public, config=OLD_CONFIG)
    try:
        before = _samples(httpx.get(f"{agent.url}/metrics", timeout=10).text)
        for n in (1, 2):  # the second finds the file held
            body = envelope(
                job(f"stage-{n}", kind="stage", attempt=n, artifacts=(artifact,)), owner.signing
            )
            posted = httpx.post(f"{agent.url}/v1/nodes/node-a/jobs", json=body, timeout=10)
            assert posted.status_code == 202, posted.text
            agent.wait_idle(timeout=60)
            assert agent.get(f"jobs/stage-{n}")["state"] == "succeeded"

        # The job's record is written before its metrics are counted.
        def counted() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            got = _samples(httpx.get(f"{agent.url}/metrics", timeout=10).text)
            return got if got[("reconciler_agent_stage_seconds_count", ())] == 2 else None

        after = wait_for(counted, timeout=30, what="the second stage job counted")
    finally:
        agent.close()
    assert before[("reconciler_agent_downloaded_bytes_total", ())] == 0
    assert before[("reconciler_agent_store_bytes", ())] == 0
    assert after[("reconciler_agent_downloaded_bytes_total", ())] == len(data)
    assert after[("reconciler_agent_stage_seconds_count", ())] == 2
    assert after[("reconciler_agent_stage_seconds_bucket", (("le", "+Inf"),))] == 2
    assert after[("reconciler_agent_stage_seconds_sum", ())] > 0
    assert after[("reconciler_agent_store_bytes", ())] == len(data)
