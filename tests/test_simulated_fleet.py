"""The simulated fleet: the agent protocol with the real admission checks,
scripted behaviour per node and per attempt, reloads, in-memory apply,
counters for the chaos tests, and a journal that survives restarts."""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from reconciler.protocol.signing import SigningKey
from reconciler.simulation.fleet import ScriptError, load_script, node_names, parse_script
from reconciler.spec.model import Target
from tests.kit.agents import FleetThread, start_process
from tests.kit.http import request
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.waiting import wait_for


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return make_key(tmp_path / "keys" / "reconciler").signing


@pytest.fixture
def fleet(tmp_path: Path, key: SigningKey) -> Iterator[FleetThread]:
    served = FleetThread(tmp_path / "sim", [key])
    yield served
    served.close()


def post(fleet: FleetThread, env: Any, node: str = "node-a") -> tuple[int, Any]:
    return request(fleet.url, "POST", f"/v1/nodes/{node}/jobs", env)


def get(fleet: FleetThread, path: str) -> tuple[int, Any]:
    return request(fleet.url, "GET", path)


def finished(fleet: FleetThread, job_id: str, node: str = "node-a") -> Any:
    def check() -> Any:
        status, record = request(fleet.url, "GET", f"/v1/nodes/{node}/jobs/{job_id}")
        return record if status == 200 and record["state"] in ("succeeded", "failed") else None

    return wait_for(check, what=f"{job_id} to finish")


def test_a_live_apply_changes_the_heartbeat_and_leaves_a_backup(
    fleet: FleetThread, key: SigningKey
) -> None:
    status, accepted = post(fleet, envelope(job(), key))
    record = finished(fleet, "apply-0001")

    assert status == 202 and accepted["state"] == "accepted"
    assert record["state"] == "succeeded" and record["backupId"]
    beat = get(fleet, "/v1/nodes/node-a/heartbeat")[1]
    assert beat["node"] == "node-a"
    runtime = beat["runtimes"][0]
    assert (runtime["provider"], runtime["model"]) == ("vllm", "llama3.1-8b")
    backups = get(fleet, "/v1/nodes/node-a/backups")[1]
    assert backups == [
        {
            "backupId": record["backupId"],
            "runtime": "hermes",
            "createdAt": backups[0]["createdAt"],
            "jobId": "apply-0001",
            "rollout": "llama",
            "provider": "sim",
            "model": "base-model",
            "profile": "default",
        }
    ]
    other = get(fleet, "/v1/nodes/node-b/heartbeat")[1]
    assert other["runtimes"][0]["model"] == "base-model"


def test_a_restore_puts_a_backup_back(fleet: FleetThread, key: SigningKey) -> None:
    post(fleet, envelope(job(), key))
    backup_id = finished(fleet, "apply-0001")["backupId"]

    post(fleet, envelope(job("restore-0001", kind="restore", backup_id=backup_id), key))
    record = finished(fleet, "restore-0001")

    assert record["state"] == "succeeded"
    beat = get(fleet, "/v1/nodes/node-a/heartbeat")[1]
    assert beat["runtimes"][0]["model"] == "base-model"


def test_dry_run_changes_nothing(fleet: FleetThread, key: SigningKey) -> None:
    post(fleet, envelope(job(mode="dry_run"), key))
    record = finished(fleet, "apply-0001")

    assert record["detail"].startswith("would change provider sim -> vllm")
    assert get(fleet, "/v1/nodes/node-a/backups")[1] == []


def test_the_real_agents_checks_apply(tmp_path: Path, fleet: FleetThread, key: SigningKey) -> None:
    stranger = make_key(tmp_path / "stranger" / "reconciler").signing
    good = envelope(job(), key)
    tampered = {**good, "payload": {**good["payload"], "attempt": 2}}
    old = envelope(job(), key, datetime.now(UTC) - timedelta(minutes=16))

    assert post(fleet, {"payload": 1})[1]["error"] == "invalid_job"
    assert post(fleet, envelope(job(), stranger))[1]["error"] == "untrusted_key"
    assert post(fleet, tampered)[1]["error"] == "bad_signature"
    assert post(fleet, good, node="node-b")[1]["error"] == "wrong_node"
    assert post(fleet, old)[1]["error"] == "expired"
    odd = envelope(job(target=Target("other", "a", "b", "c")), key)
    assert post(fleet, odd)[1]["error"] == "unsupported_runtime"
    assert post(fleet, good, node="nobody")[0] == 404
    assert fleet.stats()["executed"] == {}


def test_stats_count_receipts_executions_and_payload_variants(
    fleet: FleetThread, key: SigningKey
) -> None:
    env = envelope(job(), key)
    assert post(fleet, env)[0] == 202
    assert post(fleet, env)[0] == 200
    assert post(fleet, envelope(job(), key))[0] == 200
    conflict = envelope(job(target=Target("hermes", "vllm", "other")), key)
    assert post(fleet, conflict)[1]["error"] == "job_conflict"

    stats = fleet.stats()

    assert stats["received"] == {"apply-0001": 4}
    assert stats["executed"] == {"apply-0001": 1}
    assert stats["payloadVariants"] == {"apply-0001": 2}
    assert stats["maxExecuted"] == 1 and stats["maxPayloadVariants"] == 2
    assert stats["refusals"] == {"job_conflict": 1}


# -- behaviour --------------------------------------------------------------------


SCRIPT = """
default: succeed
nodes:
  node-a: {action: fail, error: "model not found"}
  node-b: {action: succeed, attempts: {"1": {action: fail, error: first try}}}
  node-c: hang
"""


def test_behaviour_per_node_and_per_attempt(tmp_path: Path, key: SigningKey) -> None:
    fleet = FleetThread(tmp_path / "sim", [key], script=SCRIPT)
    try:
        post(fleet, envelope(job("apply-a"), key))
        post(fleet, envelope(job("apply-b1", node="node-b"), key), node="node-b")
        post(fleet, envelope(job("apply-b2", node="node-b", attempt=2), key), node="node-b")
        post(fleet, envelope(job("apply-c", node="node-c"), key), node="node-c")

        a = finished(fleet, "apply-a")
        b1 = finished(fleet, "apply-b1", "node-b")
        b2 = finished(fleet, "apply-b2", "node-b")
        c = get(fleet, "/v1/nodes/node-c/jobs/apply-c")[1]
    finally:
        fleet.close()

    assert (a["state"], a["error"]) == ("failed", "model not found")
    assert (b1["state"], b1["error"]) == ("failed", "first try")
    assert b2["state"] == "succeeded"
    assert c["state"] == "running"


def test_refuse_drift_and_delay(tmp_path: Path, key: SigningKey) -> None:
    script = """
nodes:
  node-a: {action: refuse, status: 409, code: busy, message: try later}
  node-b: drift
  node-c: {action: succeed, delay: 0.3}
"""
    fleet = FleetThread(tmp_path / "sim", [key], script=script)
    try:
        status, answer = post(fleet, envelope(job(), key))
        post(fleet, envelope(job("apply-b", node="node-b"), key), node="node-b")
        drifted = finished(fleet, "apply-b", "node-b")
        beat = get(fleet, "/v1/nodes/node-b/heartbeat")[1]
        post(fleet, envelope(job("apply-c", node="node-c"), key), node="node-c")
        early = get(fleet, "/v1/nodes/node-c/jobs/apply-c")[1]
        late = finished(fleet, "apply-c", "node-c")
    finally:
        fleet.close()

    # A refusal names the job and the node it refuses, as the agent's does.
    refusal = {"error": "busy", "message": "try later", "jobId": "apply-0001", "node": "node-a"}
    assert (status, answer) == (409, refusal)
    assert drifted["state"] == "succeeded"
    assert beat["runtimes"][0]["model"] == "base-model"
    assert early["state"] == "running"
    assert late["state"] == "succeeded"


def test_transport_failures(tmp_path: Path, key: SigningKey) -> None:
    script = """
nodes:
  n1: unreachable
  n2: error500
  n3: garbage
  n4: disconnect
  n5: {action: impostor, as: n1}
"""
    fleet = FleetThread(
        tmp_path / "sim", [key], names=["n1", "n2", "n3", "n4", "n5"], script=script
    )
    try:
        assert get(fleet, "/v1/nodes/n1/heartbeat")[0] == 503
        assert get(fleet, "/v1/nodes/n2/heartbeat")[0] == 500
        status, body = get(fleet, "/v1/nodes/n3/heartbeat")
        assert status == 200 and isinstance(body, bytes)
        with pytest.raises(ConnectionError):
            get(fleet, "/v1/nodes/n4/heartbeat")
        assert get(fleet, "/v1/nodes/n5/heartbeat")[1]["node"] == "n1"
        impostor_job = envelope(job(node="n5"), key)
        assert post(fleet, impostor_job, node="n5")[1]["error"] == "wrong_node"
    finally:
        fleet.close()


def test_clock_skew_moves_the_nodes_clock(tmp_path: Path, key: SigningKey) -> None:
    script = "nodes:\n  node-a: {action: succeed, clockSkew: -1200}\n"
    fleet = FleetThread(tmp_path / "sim", [key], script=script)
    try:
        beat = get(fleet, "/v1/nodes/node-a/heartbeat")[1]
        status, answer = post(fleet, envelope(job(), key))
    finally:
        fleet.close()

    behind = datetime.now(UTC) - timedelta(minutes=19)
    assert beat["time"] < behind.strftime("%Y-%m-%dT%H:%M:%S")
    assert (status, answer["error"]) == (422, "not_yet_valid")


def test_bad_scripts_are_explained(tmp_path: Path) -> None:
    with pytest.raises(ScriptError, match="not one of"):
        parse_script({"default": "explode"})
    with pytest.raises(ScriptError, match="a refusal is a 4xx"):
        parse_script({"nodes": {"a": {"action": "refuse", "status": 500}}})
    with pytest.raises(ScriptError, match="needs `as"):
        parse_script({"nodes": {"a": "impostor"}})
    bad = tmp_path / "b.yaml"
    bad.write_text("nodes: [\n")
    with pytest.raises(ScriptError, match=r"b\.yaml"):
        load_script(bad)


# -- the command --------------------------------------------------------------------


def test_the_command_serves_reloads_and_keeps_jobs_across_restarts(
    tmp_path: Path,
) -> None:
    made = make_key(tmp_path / "keys" / "reconciler")
    key, public = made.signing, made.public
    behaviour = tmp_path / "behaviour.yaml"
    behaviour.write_text("default: succeed\n")
    args = [
        "sim-fleet",
        "--nodes",
        "3",
        "--node-prefix",
        "gpu-",
        "--state-dir",
        str(tmp_path / "state"),
        "--trust-key",
        str(public),
        "--behaviour",
        str(behaviour),
    ]
    log = tmp_path / "sim.log"
    process, url = start_process(args, log)
    try:
        assert request(url, "GET", "/v1/nodes/gpu-0003/heartbeat")[0] == 200
        assert request(url, "GET", "/v1/nodes/gpu-0004/heartbeat")[0] == 404
        env = envelope(job(node="gpu-0001"), key)
        assert request(url, "POST", "/v1/nodes/gpu-0001/jobs", env)[0] == 202

        behaviour.write_text("default: unreachable\n")
        wait_for(lambda: "behaviour reloaded" in log.read_text(), what="reload")
        assert request(url, "GET", "/v1/nodes/gpu-0002/heartbeat")[0] == 503
        behaviour.write_text("default: [broken\n")
        wait_for(lambda: "not reloaded" in log.read_text(), what="refused reload")
        assert request(url, "GET", "/v1/nodes/gpu-0002/heartbeat")[0] == 503
        behaviour.write_text("default: succeed\n")
        wait_for(lambda: log.read_text().count("behaviour reloaded") == 2, what="reload")

        process.send_signal(signal.SIGKILL)
        process.wait()
        process, url = start_process(args, log)
        status, again = request(url, "POST", "/v1/nodes/gpu-0001/jobs", env)
        stats = request(url, "GET", "/v1/sim/stats")[1]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0

    assert status == 200 and again["state"] == "succeeded"
    assert stats["executed"] == {"apply-0001": 1}


def test_it_holds_ten_thousand_nodes_cheaply(tmp_path: Path, key: SigningKey) -> None:
    fleet = FleetThread(tmp_path / "sim", [key], names=node_names(10_000, "sim-"))
    try:
        assert get(fleet, "/v1/nodes/sim-10000/heartbeat")[0] == 200
        assert fleet.stats()["nodes"] == 10_000
    finally:
        fleet.close()


def test_connections_are_kept_alive(fleet: FleetThread) -> None:
    with socket.create_connection(("127.0.0.1", int(fleet.url.rsplit(":", 1)[1]))) as sock:
        for _ in range(3):
            sock.sendall(b"GET /v1/nodes/node-a/heartbeat HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while b"\r\n\r\n" not in data:
                data += sock.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += sock.recv(65536)
            assert head.startswith(b"HTTP/1.1 200")  # the same socket, answering again
