"""The daemon's metrics and health answer (docs/operating.md): a real
``reconciler run`` process with ``--metrics``, read with httpx, and the
health answer's rules on a real server in this process."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

import reconciler
from reconciler.daemon.metrics import Health, Metrics
from reconciler.spec.rollout_status import HOLD_REASONS
from tests.kit.daemons import DaemonProcess
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.waiting import wait_for

pytestmark = pytest.mark.slow

FAIL_WEB_1 = 'default: succeed\nnodes:\n  web-1: {action: fail, error: "disk full"}\n'


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text, or None when absent."""
    shown = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = "^" + re.escape(name + (f"{{{shown}}}" if labels else "")) + r" (\S+)$"
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else None


def test_a_running_daemon_reports_its_build_its_last_pass_its_holds_and_its_health(
    tmp_path: Path,
) -> None:
    kit = FleetKit.create(tmp_path, {"web-1": {"role": "web"}}, behaviour=FAIL_WEB_1)
    try:
        kit.push({"rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"})})
        with DaemonProcess(
            kit.bare, kit.key_path, "--metrics", "127.0.0.1:0", "--interval", "0.2s"
        ) as daemon:
            base = f"http://{daemon.metrics_address()}"

            def held() -> str | None:
                text = httpx.get(f"{base}/metrics").text
                return text if sample(text, "reconciler_holds", reason="health_failed") else None

            text = wait_for(held, 60, "the health_failed hold in the gauges")
            health = httpx.get(f"{base}/healthz")
            others = [httpx.get(f"{base}{path}").status_code for path in ("/", "/metricsx", "/x")]
    finally:
        kit.close()

    (version,) = re.findall(r'^reconciler_build_info\{version="([^"]+)"\} 1\.0$', text, re.M)
    assert version == reconciler.__version__  # never "unknown"
    assert (sample(text, "reconciler_last_successful_pass_timestamp_seconds") or 0) > 1e9
    assert sample(text, "reconciler_holds", reason="health_failed") == 1.0
    for reason in HOLD_REASONS:
        if reason != "health_failed":
            assert sample(text, "reconciler_holds", reason=reason) == 0.0, reason
    # Counters start at 0 for every known label value, before any happened.
    assert sample(text, "reconciler_pass_errors_total", kind="store") == 0.0
    assert sample(text, "reconciler_jobs_sent_total", kind="restore") == 0.0
    assert sample(text, "reconciler_node_transitions_total", state="rolled_back") == 0.0
    assert sample(text, "reconciler_unverified_answers_total", kind="heartbeat") == 0.0
    assert health.status_code == 200
    assert health.json()["status"] == "ok"
    assert others == [404, 404, 404]


def test_health_is_503_before_the_first_pass_and_once_the_last_pass_is_stale() -> None:
    now = [1_000_000.0]
    metrics = Metrics()
    metrics.health = Health(stale_after=30.0, clock=lambda: now[0])
    server = metrics.serve("127.0.0.1:0", stale_after=30.0)
    base = "http://{}:{}".format(*server.server_address[:2])
    try:
        before = httpx.get(f"{base}/healthz")
        metrics.health.passed(now[0])
        fresh = httpx.get(f"{base}/healthz")
        now[0] += 31
        stale = httpx.get(f"{base}/healthz")
    finally:
        server.shutdown()
        server.server_close()

    assert (before.status_code, before.json()["status"]) == (503, "starting")
    assert (fresh.status_code, fresh.json()["status"]) == (200, "ok")
    assert (stale.status_code, stale.json()["status"]) == (503, "stale")
    assert "31s ago" in stale.json()["reason"]
