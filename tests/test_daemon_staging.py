"""Staging end to end: the daemon, a real bare repository and the simulated
fleet as a real process on 127.0.0.1, whose nodes download at a scripted
rate, fail their stage as scripted, and report drain and warm-up timings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from reconciler.spec.times import parse_time
from tests.kit.alertmanager import AlertmanagerServer
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit

DIGEST = "0f" * 32
ARTIFACT = f"{{name: weights, url: 'http://127.0.0.1:9/w.gguf', sha256: {DIGEST}, size: 50000000}}"
TARGET = f"{{runtime: hermes, provider: ollama, model: llama3.1-8b, artifacts: [{ARTIFACT}]}}"
THREE = {f"gpu-{i}": {"role": "gpu"} for i in range(1, 4)}
DRAIN = '{idle: {url: "http://127.0.0.1:8000/metrics", metric: inflight}}'
WARMUP = '[{http: {url: "http://127.0.0.1:8000/v1/completions", method: POST}}]'


def staged_rollout(**spec: Any) -> dict[str, str]:
    spec.setdefault("selector", {"role": "gpu"})
    spec.setdefault("live", True)
    return {"rollouts/llama.yaml": rollout_yaml("llama", target=TARGET, **spec)}


def nodes_of(statuses: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in statuses["llama"]["nodes"]}


def phase(name: str, *phases: str) -> Any:
    return lambda s: s.get(name, {}).get("phase") in phases


def held_for(reason: str) -> Any:
    return lambda s: (s.get("llama", {}).get("hold") or {}).get("reason") == reason


def in_state(node: str, state: str) -> Any:
    return lambda s: "llama" in s and nodes_of(s)[node]["state"] == state


def test_the_next_node_stages_while_the_previous_applies_and_each_is_out_of_service_briefly(
    tmp_path: Path,
) -> None:
    # Downloads take 0.5 s, applies 1 s: with one stage slot the pipeline
    # stages gpu-2 while gpu-1 applies.
    behaviour = (
        "default: {action: succeed, delay: 1, drain: 0.3, warmup: 0.2, stage: {rate: 100000000}}\n"
    )
    kit = FleetKit.create(tmp_path, THREE, behaviour=behaviour)
    try:
        kit.push(staged_rollout(stage="{ahead: 1, maxConcurrent: 1}", drain=DRAIN, warmup=WARMUP))
        done = kit.run_until(kit.daemon(), phase("llama", "completed"), timeout=60)
        stats = kit.fleet.stats()
    finally:
        kit.close()

    nodes = nodes_of(done)
    first, second = nodes["gpu-1"], nodes["gpu-2"]
    assert parse_time(second["stage"]["startedAt"]) <= parse_time(first["dispatchedAt"])
    assert parse_time(second["stage"]["startedAt"]) < parse_time(first["finishedAt"])
    assert all(
        n["stage"]["state"] == "staged" and n["stage"]["attempt"] == 1 for n in nodes.values()
    )
    assert all(n["outOfService"] == 0.5 for n in nodes.values())
    assert nodes["gpu-3"]["timings"]["drainStartedAt"] is not None
    assert stats["maxExecuted"] == 1 and stats["maxPayloadVariants"] == 1
    assert len(stats["executed"]) == 6  # a stage and an apply per node
    assert sum(1 for j in stats["executed"] if j.startswith("stage-")) == 3


@pytest.mark.parametrize(
    ("policy", "script", "code"),
    [
        ("pause", "digest_mismatch", "digest_mismatch"),
        ("stop", "no_space", "insufficient_space"),
        ("rollback", "download_failed", "download_failed"),
    ],
)
def test_a_failed_stage_holds_stage_failed_under_pause_stop_and_rollback(
    tmp_path: Path, policy: str, script: str, code: str
) -> None:
    behaviour = f"default: succeed\nnodes:\n  gpu-1: {{stage: {script}}}\n"
    kit = FleetKit.create(tmp_path, THREE, behaviour=behaviour)
    try:
        kit.push(staged_rollout(onFailure=policy, stage={"ahead": 2, "maxConcurrent": 3}))
        daemon = kit.daemon()
        held = kit.run_until(daemon, held_for("stage_failed"))
        stats = kit.fleet.stats()
    finally:
        kit.close()

    node = nodes_of(held)["gpu-1"]
    assert node["state"] == "failed" and node["held"] == "stage_failed"
    assert code in node["error"] and code in node["stage"]["error"]
    assert code in held["llama"]["hold"]["message"]
    # nothing stopped, restored or applied while held; the first node staged
    # alone, so the others downloaded nothing
    assert all(j.startswith("stage-") for j in stats["executed"])
    assert len(stats["executed"]) <= 1
    assert nodes_of(held)["gpu-2"]["state"] == nodes_of(held)["gpu-3"]["state"] == "pending"


def test_retry_once_stages_the_node_once_more_then_holds(tmp_path: Path) -> None:
    behaviour = "default: succeed\nnodes:\n  gpu-2: {stage: digest_mismatch}\n"
    kit = FleetKit.create(tmp_path, THREE, behaviour=behaviour)
    try:
        kit.push(staged_rollout(onFailure="retry_once"))
        daemon = kit.daemon()
        held = kit.run_until(daemon, phase("llama", "paused"))
        stats = kit.fleet.stats()
    finally:
        kit.close()

    node = nodes_of(held)["gpu-2"]
    assert held["llama"]["hold"]["reason"] == "stage_failed"
    assert node["stage"]["attempt"] == 2 and node["autoRetried"] is True
    assert not any(j.startswith("restore-") for j in stats["executed"])


def test_observe_records_the_failed_stage_and_applies_the_others(tmp_path: Path) -> None:
    behaviour = "default: succeed\nnodes:\n  gpu-2: {stage: no_space}\n"
    kit = FleetKit.create(tmp_path, THREE, behaviour=behaviour)
    try:
        kit.push(staged_rollout(onFailure="observe"))
        done = kit.run_until(kit.daemon(), phase("llama", "failed", "completed"))
    finally:
        kit.close()

    nodes = nodes_of(done)
    assert done["llama"]["phase"] == "failed"
    assert nodes["gpu-2"]["state"] == "failed" and nodes["gpu-2"]["attempt"] == 0
    assert nodes["gpu-1"]["state"] == nodes["gpu-3"]["state"] == "succeeded"


def test_a_resume_stages_the_failed_node_again_once_the_cause_is_fixed(tmp_path: Path) -> None:
    behaviour = "default: succeed\nnodes:\n  gpu-1: {stage: no_space}\n"
    kit = FleetKit.create(tmp_path, THREE, behaviour=behaviour)
    try:
        kit.push(staged_rollout())
        daemon = kit.daemon()
        kit.run_until(daemon, phase("llama", "paused"))
        kit.fleet.set_behaviour("names: [gpu-1, gpu-2, gpu-3]\ndefault: succeed\n")
        kit.push(staged_rollout(resumeRequest='"space freed"'))
        done = kit.run_until(daemon, phase("llama", "completed"))
    finally:
        kit.close()

    node = nodes_of(done)["gpu-1"]
    assert node["stage"]["attempt"] == 2 and node["stage"]["state"] == "staged"
    assert node["state"] == "succeeded" and node["attempt"] == 1


def test_a_daemon_killed_while_batches_stage_executes_no_job_twice_after_restart(
    tmp_path: Path,
) -> None:
    # Downloads take about 2 s each: the daemon is killed while nodes stage.
    nodes = {f"gpu-{i}": {"role": "gpu"} for i in range(1, 5)}
    kit = FleetKit.create(tmp_path, nodes, behaviour="default: {stage: {rate: 25000000}}\n")
    try:
        kit.push(staged_rollout(batchSize=2, stage="{ahead: 1, maxConcurrent: 3}"))
        first = _daemon_process(kit)
        try:
            deadline = time.monotonic() + 60
            while not any(
                n["state"] == "staging" for n in kit.statuses().get("llama", {}).get("nodes", ())
            ):
                assert time.monotonic() < deadline, kit.statuses()
                time.sleep(0.05)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(15)
        assert first.returncode == -signal.SIGKILL
        restarted = _daemon_process(kit)
        try:
            deadline = time.monotonic() + 90
            while kit.statuses()["llama"]["phase"] != "completed":
                assert time.monotonic() < deadline, kit.statuses()
                time.sleep(0.1)
        finally:
            restarted.send_signal(signal.SIGTERM)
            restarted.wait(15)
        stats = kit.fleet.stats()
    finally:
        kit.close()

    assert stats["maxExecuted"] == 1 and stats["maxPayloadVariants"] == 1
    assert sum(1 for j in stats["executed"] if j.startswith("stage-")) == 4
    assert sum(1 for j in stats["executed"] if j.startswith("apply-")) == 4


def _daemon_process(kit: FleetKit) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "reconciler", "run", "--repo", str(kit.bare),
         "--key", str(kit.key_path), "--interval", "0.1s"],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip


def test_a_dry_run_with_artifacts_stages_as_a_dry_run_and_completes(tmp_path: Path) -> None:
    kit = FleetKit.create(tmp_path, THREE)
    try:
        kit.push(staged_rollout(live=False, batchSize=2))
        done = kit.run_until(kit.daemon(), phase("llama", "completed", "failed"))
        stats = kit.fleet.stats()
    finally:
        kit.close()

    assert done["llama"]["phase"] == "completed"
    assert all(n["stage"]["state"] == "staged" for n in done["llama"]["nodes"])
    assert all("outOfService" not in n for n in done["llama"]["nodes"])  # nothing switched
    assert stats["totals"]["executed"] == 6 and stats["maxExecuted"] == 1


def test_an_agent_gone_while_it_stages_is_unknown_and_holds_health_unknown(
    tmp_path: Path,
) -> None:
    settings = "apiVersion: reconciler/v1\nkind: Settings\nspec:\n  offlineAfter: 2s\n"
    slow = "default: succeed\nnodes:\n  gpu-1: {stage: {rate: 1000}}\n"  # 50 MB: 14 hours
    kit = FleetKit.create(tmp_path, THREE, behaviour=slow, files={"reconciler.yaml": settings})
    try:
        kit.push(staged_rollout())
        daemon = kit.daemon()
        kit.run_until(daemon, in_state("gpu-1", "staging"))
        kit.fleet.set_behaviour(
            "names: [gpu-1, gpu-2, gpu-3]\ndefault: succeed\nnodes:\n  gpu-1: unreachable\n"
        )
        held = kit.run_until(daemon, phase("llama", "paused"), pause=0.2)
    finally:
        kit.close()

    node = nodes_of(held)["gpu-1"]
    assert held["llama"]["hold"]["reason"] == "health_unknown"
    assert node["state"] == "unknown" and node["stage"]["state"] == "unknown"
    assert "unreachable" in node["error"]


def test_a_fleet_wide_alert_starts_no_stage_job_until_silenced(tmp_path: Path) -> None:
    # The daemon, the simulated fleet and Debian's prometheus-alertmanager:
    # an alert without a node label fires before the rollout starts.
    with AlertmanagerServer(tmp_path) as am:
        settings = (
            "apiVersion: reconciler/v1\nkind: Settings\nspec:\n"
            f"  alertmanager: {{url: '{am.url}'}}\n"
        )
        behaviour = "default: {action: succeed, delay: 0.2, stage: {rate: 100000000}}\n"
        kit = FleetKit.create(
            tmp_path, THREE, behaviour=behaviour, files={"reconciler.yaml": settings}
        )
        try:
            am.post_alert("DatacenterHot", severity="page")
            health = "{soak: 1s, interval: 1s, alerts: {matchers: ['severity=\"page\"']}}"
            kit.push(staged_rollout(stage="{ahead: 1, maxConcurrent: 1}", health=health))
            daemon = kit.daemon()
            waiting = kit.run_until(daemon, waits_for("alert_firing"), timeout=60)
            for _ in range(4):  # passes go by: still nothing staged
                daemon.run_pass()
            held = kit.statuses()
            executed_while_firing = list(kit.fleet.stats()["executed"])

            am.silence(alertname="DatacenterHot")
            done = kit.run_until(daemon, phase("llama", "completed"), timeout=60)
        finally:
            kit.close()

    alerts = waiting["llama"]["waiting"]["alerts"]
    assert [a["alertname"] for a in alerts] == ["DatacenterHot"]
    assert executed_while_firing == []
    assert all(n["state"] == "pending" and not n.get("stage") for n in nodes_of(held).values())
    assert all(n["stage"]["state"] == "staged" for n in nodes_of(done).values())
    assert done["llama"].get("waiting") is None


def waits_for(reason: str) -> Any:
    return lambda s: (s.get("llama", {}).get("waiting") or {}).get("reason") == reason
