"""The simulated fleet's scripted health checks (docs/health.md): per node and
per attempt, ok, failing, ok for a while, failing for a while; reported in
the heartbeat as the real agent reports them, from a clock the test moves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from reconciler.simulation.fleet import ScriptError, parse_script
from reconciler.spec.health import Health, HealthCheck, HttpProbe, TcpProbe
from tests.kit.agents import FleetThread
from tests.kit.http import request
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.waiting import wait_for

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HEALTH = Health(
    interval=10,
    checks=(
        HealthCheck("ready", http=HttpProbe("http://127.0.0.1:8000/ready")),
        HealthCheck("port", tcp=TcpProbe("127.0.0.1", 8000)),
    ),
)
SCRIPT = """
nodes:
  node-a: {checks: {ready: {okFor: 25}}}
  node-b: {checks: {ready: failing, port: {failFor: 15}}}
  node-c: {checks: {ready: failing}, attempts: {"2": {checks: {ready: ok}}}}
"""


class MovableClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def checks(fleet: FleetThread, node: str) -> dict[str, dict[str, Any]]:
    status, beat = request(fleet.url, "GET", f"/v1/nodes/{node}/heartbeat")
    assert status == 200
    return {c["name"]: c for c in beat.get("checks", [])}


def apply(fleet: FleetThread, key: Any, node: str, job_id: str, attempt: int = 1) -> None:
    sent = job(job_id, node=node, attempt=attempt, health=HEALTH)
    status, _ = request(fleet.url, "POST", f"/v1/nodes/{node}/jobs", envelope(sent, key, T0))
    assert status == 202

    def done() -> bool:
        _, record = request(fleet.url, "GET", f"/v1/nodes/{node}/jobs/{job_id}")
        return bool(record["state"] == "succeeded")

    wait_for(done, what=f"{job_id} to finish")


def test_scripted_outcomes_follow_the_clock(tmp_path: Path) -> None:
    key = make_key(tmp_path / "keys" / "reconciler").signing
    clock = MovableClock()
    fleet = FleetThread(tmp_path / "sim", [key], script=SCRIPT, clock=clock)
    try:
        for node in ("node-a", "node-b", "node-c"):
            apply(fleet, key, node, f"apply-{node}")
        clock.now = T0 + timedelta(seconds=21)
        a = checks(fleet, "node-a")
        assert (a["ready"]["ok"], a["ready"]["okSince"], a["ready"]["failures"]) == (
            True,
            "2026-12-01T12:00:00Z",
            0,
        )
        assert a["port"]["ok"] and a["ready"]["jobId"] == "apply-node-a"
        b = checks(fleet, "node-b")
        assert (b["ready"]["ok"], b["ready"]["failures"]) == (False, 3)
        assert b["ready"]["lastError"] == "simulated failure of check ready"
        assert (b["port"]["ok"], b["port"]["okSince"]) == (True, "2026-12-01T12:00:20Z")
        clock.now = T0 + timedelta(seconds=41)
        a = checks(fleet, "node-a")
        assert (a["ready"]["ok"], a["ready"]["okSince"], a["ready"]["failures"]) == (False, None, 2)
        # node-c's second attempt holds; its first attempt's checks are gone.
        assert not checks(fleet, "node-c")["ready"]["ok"]
        apply(fleet, key, "node-c", "apply-node-c-2", attempt=2)
        c = checks(fleet, "node-c")
        assert (c["ready"]["ok"], c["ready"]["jobId"]) == (True, "apply-node-c-2")
    finally:
        fleet.close()


def test_a_dry_run_or_a_job_without_checks_reports_none(tmp_path: Path) -> None:
    key = make_key(tmp_path / "keys" / "reconciler").signing
    fleet = FleetThread(tmp_path / "sim", [key], script=SCRIPT)
    try:
        status, _ = request(fleet.url, "POST", "/v1/nodes/node-a/jobs", envelope(job("plain"), key))
        assert status == 202
        wait_for(
            lambda: (
                request(fleet.url, "GET", "/v1/nodes/node-a/jobs/plain")[1]["state"] == "succeeded"
            )
        )
        assert checks(fleet, "node-a") == {}
    finally:
        fleet.close()


@pytest.mark.parametrize(
    "text", ["default: {checks: {ready: sometimes}}", "default: {checks: {ready: {okFor: -1}}}"]
)
def test_bad_check_scripts_are_explained(text: str) -> None:
    from reconciler.spec.safe_yaml import load_yaml

    with pytest.raises(ScriptError, match=r"default\.checks\.ready: must be ok, failing"):
        parse_script(load_yaml("behaviour.yaml", text.encode()))
