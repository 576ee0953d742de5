"""The agent's probes (``node.probes``) against real loopback endpoints,
and the agent around them: a signed live apply with checks starts probing,
the heartbeat reports them, and the next job for the runtime stops them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reconciler.node.probes import CheckState, probe
from reconciler.protocol.job_payload import build_payload, payload_problems
from reconciler.spec.health import Health, HealthCheck, HttpProbe, TcpProbe
from reconciler.spec.times import parse_time
from tests.kit.agents import AgentThread
from tests.kit.endpoint import ServiceEndpoint
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.ports import HeldPort
from tests.kit.waiting import wait_for


@pytest.fixture
def endpoint() -> Iterator[ServiceEndpoint]:
    served = ServiceEndpoint()
    yield served
    served.close()


def http_check(url: str, status: int = 200, body: str = "") -> dict[str, object]:
    return {
        "name": "ready",
        "intervalSeconds": 1,
        "http": {"url": url, "expectStatus": status, "bodyContains": body, "timeoutSeconds": 2},
    }


def test_an_http_probe_holds_on_the_expected_status_and_body(endpoint: ServiceEndpoint) -> None:
    endpoint.set(200, b"model ok")
    assert probe(http_check(endpoint.url + "/ready", 200, "ok")) == ""
    endpoint.set(503, b"loading")
    assert probe(http_check(endpoint.url + "/ready")) == (
        f"GET {endpoint.url}/ready: status 503 (expected 200)"
    )
    endpoint.set(200, b"loading")
    assert "does not contain 'ok'" in probe(http_check(endpoint.url + "/ready", 200, "ok"))


def test_a_tcp_probe_holds_while_something_listens(held_port: HeldPort) -> None:
    port = held_port.port
    check = {
        "name": "port",
        "intervalSeconds": 1,
        "tcp": {"host": "127.0.0.1", "port": port, "timeoutSeconds": 1},
    }
    held_port.listen()
    assert probe(check) == ""
    held_port.refuse()
    assert probe(check).startswith(f"tcp 127.0.0.1:{port}: ")


def test_a_host_that_is_not_this_node_is_not_probed() -> None:
    check = {
        "name": "far",
        "intervalSeconds": 1,
        "tcp": {"host": "192.0.2.1", "port": 80, "timeoutSeconds": 1},
    }
    assert probe(check) == (
        "192.0.2.1 resolves to 192.0.2.1, not this node: an agent probes only its own node"
    )


def test_a_check_state_counts_failures_and_keeps_the_start_of_a_run_of_successes() -> None:
    state = CheckState("ready", "j1").after("", "t1").after("", "t2")
    assert (state.ok, state.ok_since, state.failures) == (True, "t1", 0)
    state = state.after("down", "t3").after("down", "t4")
    assert (state.ok, state.ok_since, state.failures, state.last_error) == (False, None, 2, "down")
    assert state.after("", "t5").ok_since == "t5"


HEALTH = Health(
    interval=1,
    checks=(
        HealthCheck("ready", http=HttpProbe("http://127.0.0.1:1/ready", timeout=2)),
        HealthCheck("port", tcp=TcpProbe("{node}", 1)),
    ),
)


def test_live_apply_payloads_carry_the_agent_checks_with_the_node_name_in_place() -> None:
    payload = build_payload(job(health=HEALTH), datetime.now(UTC))
    assert payload["checks"] == [
        {
            "name": "ready",
            "intervalSeconds": 1,
            "http": {
                "url": "http://127.0.0.1:1/ready",
                "expectStatus": 200,
                "bodyContains": "",
                "timeoutSeconds": 2,
            },
        },
        {
            "name": "port",
            "intervalSeconds": 1,
            "tcp": {"host": "node-a", "port": 1, "timeoutSeconds": 2},
        },
    ]
    assert payload_problems(payload) == []
    payload["mode"] = "dry_run"
    assert payload_problems(payload) != []


def test_the_agent_probes_after_a_live_apply_and_stops_at_the_next_job(
    tmp_path: Path, endpoint: ServiceEndpoint
) -> None:
    key = make_key(tmp_path / "keys" / "reconciler").signing
    state = tmp_path / "state"
    (state / "runtimes").mkdir(parents=True)
    agent = AgentThread(state, [key])
    try:
        health = Health(
            interval=1,
            checks=(HealthCheck("ready", http=HttpProbe(endpoint.url + "/ready", timeout=2)),),
        )
        status, _ = agent.post(envelope(job("apply-1", health=health), key))
        assert status == 202
        agent.wait_finished("apply-1")

        def checks() -> list[dict[str, object]]:
            return list(agent.get("heartbeat")[1].get("checks", []))

        first = wait_for(checks, what="a probe in the heartbeat")[0]
        assert (first["name"], first["jobId"], first["ok"], first["failures"]) == (
            "ready",
            "apply-1",
            True,
            0,
        )
        assert first["okSince"] is not None
        endpoint.set(500, b"oom")
        failing = wait_for(
            lambda: [c for c in checks() if c["failures"] == 2], what="two failures"
        )[0]
        assert (failing["ok"], failing["okSince"]) == (False, None)
        assert failing["lastError"] == f"GET {endpoint.url}/ready: status 500 (expected 200)"
        # The next job for the runtime: the old job's checks are no longer reported.
        status, _ = agent.post(envelope(job("apply-2", attempt=2), key))
        assert status == 202
        agent.wait_finished("apply-2")
        assert checks() == []
    finally:
        agent.close()


def test_a_restarted_agent_probes_its_last_live_apply_again_from_scratch(
    tmp_path: Path, endpoint: ServiceEndpoint
) -> None:
    key = make_key(tmp_path / "keys" / "reconciler").signing
    state = tmp_path / "state"
    (state / "runtimes").mkdir(parents=True)
    health = Health(
        interval=1,
        checks=(HealthCheck("ready", http=HttpProbe(endpoint.url + "/ready", timeout=2)),),
    )
    agent = AgentThread(state, [key])
    try:
        assert agent.post(envelope(job("apply-1", health=health), key))[0] == 202
        agent.wait_finished("apply-1")
        before = wait_for(lambda: agent.get("heartbeat")[1].get("checks"), what="a probe")[0]
    finally:
        agent.close()
    time.sleep(1.1)
    again = AgentThread(state, [key])
    try:
        after = wait_for(lambda: again.get("heartbeat")[1].get("checks"), what="a probe")[0]
        assert after["jobId"] == "apply-1" and after["ok"]
        # A restart never lengthens a run of successes.
        assert parse_time(after["okSince"]) > parse_time(before["okSince"])
    finally:
        again.close()
