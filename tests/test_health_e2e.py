"""Health checks and soak end to end (docs/health.md): real agents
probing a real loopback endpoint whose answers the test changes, a real
Prometheus (Debian's) scraping an exporter the test changes, and the real
daemon stepping a bare repository. Soaks run on real clocks: seconds."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.daemon.loop import Daemon
from reconciler.spec.times import parse_time
from tests.kit.documents import node_map, rollout_yaml
from tests.kit.endpoint import ServiceEndpoint
from tests.kit.fleets import AgentFleet
from tests.kit.prometheus import Exporter, PrometheusServer, require_prometheus

OLD = b"provider: ollama\nmodel: llama3-8b\nprofile: default\n"
PAUSE = 0.25  # seconds between passes


@pytest.fixture
def endpoint() -> Iterator[ServiceEndpoint]:
    served = ServiceEndpoint(200, b"ready")
    yield served
    served.close()


def make_fleet(tmp_path: Path, settings: str = "") -> AgentFleet:
    files = {"reconciler.yaml": settings} if settings else None
    return AgentFleet.create(tmp_path, {"gpu-a1": {"config": OLD}}, files=files)


def settings_for(prom_url: str, offline_after: str = "2m") -> str:
    return (
        "apiVersion: reconciler/v1\nkind: Settings\n"
        f"spec:\n  offlineAfter: {offline_after}\n  prometheus: {{url: '{prom_url}'}}\n"
    )


def node(statuses: dict[str, Any]) -> dict[str, Any]:
    return dict(node_map(statuses.get("r", {}))["gpu-a1"]) if "r" in statuses else {}


def http_check(endpoint: ServiceEndpoint) -> str:
    return f"{{name: ready, http: {{url: '{endpoint.url}/ready', bodyContains: ready}}}}"


ERRORS = "{name: errors, prometheus: {query: 'errors_ratio{node=\"{node}\"}', max: 0.1}}"


def run_passes(
    fleet: AgentFleet, daemon: Daemon, until: Any, timeout: float = 40
) -> dict[str, Any]:
    return fleet.run_until(daemon, until, timeout=timeout, pause=PAUSE)


def agent_finished_at(fleet: AgentFleet) -> float:
    record = fleet.agents["gpu-a1"].jobs_of_kind("apply")[-1]
    return parse_time(record["finished_at"]).timestamp()


def test_a_healthy_node_passes_after_the_soak_and_not_before(
    tmp_path: Path, endpoint: ServiceEndpoint
) -> None:
    fleet = make_fleet(tmp_path)
    try:
        health = f"{{soak: 4s, interval: 1s, checks: [{http_check(endpoint)}]}}"
        fleet.push(
            {"rollouts/r.yaml": rollout_yaml("r", nodeIds=["gpu-a1"], live=True, health=health)}
        )
        daemon = fleet.daemon()
        seen: list[str] = []
        statuses = run_passes(
            fleet,
            daemon,
            lambda s: seen.append(node(s).get("state", "")) or node(s).get("state") == "succeeded",
        )
        record = node(statuses)
        # Status times are whole seconds, cut down: the pass ran up to 1 s later.
        soaked = parse_time(record["finishedAt"]).timestamp() + 1 - agent_finished_at(fleet)
        assert soaked >= 4, f"passed {soaked:.1f}s after the apply, before the 4s soak"
        assert seen.count("dispatched") >= 4  # it waited, pass after pass
        assert record["checks"] == [
            {"name": "ready", "ok": True, "detail": record["checks"][0]["detail"]}
        ]
        assert statuses["r"]["phase"] == "completed"
        assert endpoint.hits >= 4
    finally:
        fleet.close()


def test_a_node_turning_unhealthy_during_the_soak_fails_with_the_checks_name(
    tmp_path: Path, endpoint: ServiceEndpoint
) -> None:
    fleet = make_fleet(tmp_path)
    try:
        health = (
            f"{{soak: 1m, interval: 1s, failureThreshold: 2, checks: [{http_check(endpoint)}]}}"
        )
        fleet.push(
            {"rollouts/r.yaml": rollout_yaml("r", nodeIds=["gpu-a1"], live=True, health=health)}
        )
        daemon = fleet.daemon()
        fleet.run_until(daemon, lambda s: node(s).get("state") == "dispatched", timeout=20)
        agent = fleet.agents["gpu-a1"]
        deadline = time.monotonic() + 20
        while not any(c["ok"] for c in agent.get("heartbeat").get("checks", [])):
            assert time.monotonic() < deadline, "the agent never reported a healthy probe"
            daemon.run_pass()
            time.sleep(PAUSE)
        endpoint.set(503, b"out of memory")
        statuses = run_passes(fleet, daemon, lambda s: node(s).get("state") == "failed")
        record = node(statuses)
        assert record["error"].startswith("health check ready failed: failed 2 times in a row: ")
        assert "status 503 (expected 200)" in record["error"]
        assert statuses["r"]["hold"]["reason"] == "health_failed"
        assert record["checks"][0]["ok"] is False
    finally:
        fleet.close()


def test_a_metric_above_max_fails_the_node(tmp_path: Path) -> None:
    require_prometheus()
    with Exporter() as exporter, PrometheusServer(tmp_path, exporter) as prom:
        exporter.set("errors_ratio", 0.5, node="gpu-a1")
        prom.wait_for_value('errors_ratio{node="gpu-a1"}', 0.5)
        fleet = make_fleet(tmp_path, settings_for(prom.url))
        try:
            health = f"{{soak: 1m, interval: 1s, failureThreshold: 2, checks: [{ERRORS}]}}"
            fleet.push(
                {"rollouts/r.yaml": rollout_yaml("r", nodeIds=["gpu-a1"], live=True, health=health)}
            )
            statuses = run_passes(fleet, fleet.daemon(), lambda s: node(s).get("state") == "failed")
            record = node(statuses)
            assert record["error"] == (
                "health check errors failed: out of bounds 2 times in a row: "
                'errors_ratio{instance="' + exporter.address + '", job="exporter", '
                'node="gpu-a1"} = 0.5 (bounds: max 0.1)'
            )
            assert statuses["r"]["hold"]["reason"] == "health_failed"
        finally:
            fleet.close()


def test_prometheus_stopped_mid_soak_gives_unknown_and_the_rollout_holds(tmp_path: Path) -> None:
    require_prometheus()
    with Exporter() as exporter, PrometheusServer(tmp_path, exporter) as prom:
        exporter.set("errors_ratio", 0.0, node="gpu-a1")
        prom.wait_for_value('errors_ratio{node="gpu-a1"}', 0.0)
        fleet = make_fleet(tmp_path, settings_for(prom.url, offline_after="3s"))
        try:
            health = f"{{soak: 1m, interval: 1s, checks: [{ERRORS}]}}"
            fleet.push(
                {"rollouts/r.yaml": rollout_yaml("r", nodeIds=["gpu-a1"], live=True, health=health)}
            )
            daemon = fleet.daemon()
            run_passes(
                fleet,
                daemon,
                lambda s: (
                    (m := daemon.observer.metric_checks.get(("gpu-a1", "errors"))) is not None
                    and m.ok_since is not None
                ),
            )
            prom.stop()
            stopped = time.monotonic()
            statuses = run_passes(fleet, daemon, lambda s: node(s).get("state") == "unknown")
            # offlineAfter (3 s), not at once; the daemon's clock counts whole seconds
            assert time.monotonic() - stopped >= 2
            record = node(statuses)
            assert record["error"].startswith("no evidence for health check errors: ")
            assert statuses["r"]["phase"] == "paused"
            assert statuses["r"]["hold"]["reason"] == "health_unknown"
        finally:
            fleet.close()


def daemon_process(fleet: AgentFleet, log: Path) -> subprocess.Popen[bytes]:
    """``reconciler run`` on the fleet's bare repository, as a real process."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                sys.executable, "-m", "reconciler", "run",
                "--repo", str(fleet.bare), "--key", str(fleet.key_path), "--interval", "0.3s",
            ],
            stdout=out,
            stderr=out,
        )  # fmt: skip


def wait_statuses(fleet: AgentFleet, done: Any, timeout: float = 40) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        statuses = fleet.statuses()
        if done(statuses):
            return statuses
        assert time.monotonic() < deadline, f"not reached in {timeout}s: {statuses}"
        time.sleep(0.2)


def test_a_daemon_killed_mid_soak_and_restarted_does_not_pass_the_node_early(
    tmp_path: Path,
) -> None:
    require_prometheus()
    with Exporter() as exporter, PrometheusServer(tmp_path, exporter) as prom:
        exporter.set("errors_ratio", 0.0, node="gpu-a1")
        prom.wait_for_value('errors_ratio{node="gpu-a1"}', 0.0)
        fleet = make_fleet(tmp_path, settings_for(prom.url))
        daemon: subprocess.Popen[bytes] | None = None
        try:
            health = f"{{soak: 8s, interval: 1s, checks: [{ERRORS}]}}"
            fleet.push(
                {"rollouts/r.yaml": rollout_yaml("r", nodeIds=["gpu-a1"], live=True, health=health)}
            )
            daemon = daemon_process(fleet, tmp_path / "daemon.log")
            wait_statuses(fleet, lambda s: node(s).get("state") == "dispatched")
            fleet.agents["gpu-a1"].wait_idle()
            time.sleep(5)  # well into the soak, which the daemon keeps in memory only
            assert node(fleet.statuses())["state"] == "dispatched"
            daemon.send_signal(signal.SIGKILL)
            daemon.wait(10)
            restarted_at = time.time()
            daemon = daemon_process(fleet, tmp_path / "daemon.log")
            statuses = wait_statuses(fleet, lambda s: node(s).get("state") == "succeeded")
            passed_at = parse_time(node(statuses)["finishedAt"]).timestamp()
            # Whole seconds in status: the soak (8 s) counts again from the restart.
            assert passed_at + 1 - restarted_at >= 8, "the restart shortened the soak"
        finally:
            if daemon is not None and daemon.poll() is None:
                daemon.kill()
                daemon.wait(10)
            fleet.close()
