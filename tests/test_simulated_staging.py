"""The simulated fleet's model artifacts: a stage job holds its artifacts
after its download time, a live apply of artifacts not held is refused
not_staged, stage failures answer with the agent's codes, and a live apply
with drain and warm-up reports its timings. The journal keeps what is held."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli.demo_mirror import Mirror
from reconciler.protocol.signing import SigningKey
from reconciler.simulation.fleet import ScriptError, StageScript, parse_script
from reconciler.spec.artifact_records import out_of_service
from reconciler.spec.artifacts import Artifact, Drain, Warmup
from tests.kit.agents import FleetThread
from tests.kit.http import request
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.waiting import wait_for

WEIGHTS = Artifact("weights", "http://127.0.0.1:9/w.gguf", "0f" * 32, 4_000_000)


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return make_key(tmp_path / "keys" / "reconciler").signing


def finished(fleet: FleetThread, job_id: str, node: str = "node-a") -> Any:
    def check() -> Any:
        status, record = request(fleet.url, "GET", f"/v1/nodes/{node}/jobs/{job_id}")
        return record if status == 200 and record["state"] in ("succeeded", "failed") else None

    return wait_for(check, what=f"{job_id} to finish")


def post(fleet: FleetThread, env: Any, node: str = "node-a") -> tuple[int, Any]:
    return request(fleet.url, "POST", f"/v1/nodes/{node}/jobs", env)


STAGE = job("stage-0001", kind="stage", artifacts=(WEIGHTS,))
APPLY = job("apply-0001", artifacts=(WEIGHTS,))


def test_an_apply_is_refused_until_its_artifacts_are_staged(
    tmp_path: Path, key: SigningKey
) -> None:
    fleet = FleetThread(tmp_path / "sim", [key], script="default: {stage: {rate: 8000000}}\n")
    try:
        status, refusal = post(fleet, envelope(APPLY, key))
        assert (status, refusal["error"]) == (409, "not_staged")
        assert post(fleet, envelope(STAGE, key))[0] == 202
        staged = finished(fleet, "stage-0001")
        accepted, _ = post(fleet, envelope(APPLY, key))
        applied = finished(fleet, "apply-0001")
        stats = fleet.stats()
    finally:
        fleet.close()

    assert staged["state"] == "succeeded"
    assert accepted == 202 and applied["state"] == "succeeded"
    assert stats["refusals"] == {"not_staged": 1}
    assert stats["executed"] == {"stage-0001": 1, "apply-0001": 1}


@pytest.mark.parametrize(
    ("outcome", "start"),
    [
        ("digest_mismatch", "digest_mismatch: weights: expected 0f0f"),
        ("no_space", "insufficient_space: needed 4000000 bytes, free 1024 bytes"),
        ("download_failed", "download_failed: http://127.0.0.1:9/w.gguf: 404 Not Found"),
    ],
)
def test_stage_failures_answer_with_the_agents_codes(
    tmp_path: Path, key: SigningKey, outcome: str, start: str
) -> None:
    fleet = FleetThread(tmp_path / "sim", [key], script=f"default: {{stage: {outcome}}}\n")
    try:
        post(fleet, envelope(STAGE, key))
        record = finished(fleet, "stage-0001")
        refused, _ = post(fleet, envelope(APPLY, key))
    finally:
        fleet.close()

    assert record["state"] == "failed" and record["error"].startswith(start)
    assert refused == 409


def test_a_dry_run_stage_downloads_nothing(tmp_path: Path, key: SigningKey) -> None:
    fleet = FleetThread(tmp_path / "sim", [key])
    try:
        post(
            fleet,
            envelope(job("stage-0002", kind="stage", mode="dry_run", artifacts=(WEIGHTS,)), key),
        )
        record = finished(fleet, "stage-0002")
        refused, _ = post(fleet, envelope(APPLY, key))
    finally:
        fleet.close()

    assert record["state"] == "succeeded"
    assert record["detail"] == "the server reports 4000000 bytes; 0 of 1 held"
    assert refused == 409


def test_drain_and_warm_up_give_timings_and_what_is_held_survives_a_restart(
    tmp_path: Path, key: SigningKey
) -> None:
    script = "default: {drain: 0.4, warmup: 0.3}\n"
    drain = Drain(60, "http://127.0.0.1:8000/metrics", "inflight", 0)
    warm = (Warmup("http://127.0.0.1:8000/", "GET", "", 200, 10, 1),)
    fleet = FleetThread(tmp_path / "sim", [key], script=script)
    try:
        post(fleet, envelope(STAGE, key))
        finished(fleet, "stage-0001")
    finally:
        fleet.close()
    again = FleetThread(tmp_path / "sim", [key], script=script)
    try:
        live = job("apply-0002", artifacts=(WEIGHTS,), drain=drain, warmup=warm)
        assert post(again, envelope(live, key))[0] == 202
        record = finished(again, "apply-0002")
    finally:
        again.close()

    assert record["state"] == "succeeded"
    timings = record["timings"]
    assert timings["drainStartedAt"] < timings["drainedAt"] <= timings["activatedAt"]
    assert out_of_service(timings) == 0.7


def test_the_stage_script_is_checked() -> None:
    script = parse_script({"default": {"stage": {"rate": 1e8, "breakOnce": 2}}})
    assert script.default.behaviour.stage == StageScript("ok", 1e8, 2.0)
    assert script.default.behaviour.stage.download_seconds(100_000_000) == 3.0
    with pytest.raises(ScriptError, match="outcome"):
        parse_script({"default": {"stage": "corrupt"}})
    with pytest.raises(ScriptError, match="rate and breakOnce"):
        parse_script({"default": {"stage": {"rate": -1}}})


def test_a_fetching_node_downloads_the_file_and_checks_its_digest(
    tmp_path: Path, key: SigningKey
) -> None:
    """``stage: fetch``: the simulated node really downloads from the URL, so
    a staged node holds what the server served, and a wrong digest fails."""
    data = b"weights " * 1000
    mirror = Mirror(tmp_path / "mirror", {"m/model.gguf": data})
    mirror.start()
    url = f"{mirror.url}/m/model.gguf"
    good = Artifact("weights", url, hashlib.sha256(data).hexdigest(), len(data))
    bad = Artifact("weights", url, "ab" * 32, len(data))
    fleet = FleetThread(tmp_path / "sim", [key], script="default: {stage: fetch}\n")
    try:
        post(fleet, envelope(job("stage-0003", kind="stage", artifacts=(bad,)), key))
        refused = finished(fleet, "stage-0003")
        post(fleet, envelope(job("stage-0004", kind="stage", artifacts=(good,)), key))
        staged = finished(fleet, "stage-0004")
    finally:
        fleet.close()
        mirror.stop()

    assert refused["state"] == "failed"
    assert refused["error"] == (
        f"digest_mismatch: weights: expected {'ab' * 32} ({len(data)} bytes), "
        f"got {good.sha256} ({len(data)} bytes)"
    )
    assert staged["state"] == "succeeded"
    assert mirror.downloads() == 2
