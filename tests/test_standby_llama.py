"""A warm standby on one node, all real: two llama-server slots run by the
shipped slot script, a node-local nginx as the router (its upstream
include rewritten, then ``nginx -s reload``), models staged from Debian's
nginx, and client load through the router during the switches.

Each test first brings model A up in slot ``a`` (the first standby apply
on a node with no slot recorded), then rolls B out with a standby.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from reconciler.node.agent_config import SlotCommands
from tests.kit.agents import AgentThread, RealAgent, start_agent
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.llama import Models
from tests.kit.standby import WARMUP, SlotNode, post_and_wait
from tests.kit.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def node(tmp_path: Path, models: Models) -> Iterator[SlotNode]:
    key = make_key(tmp_path / "keys" / "reconciler").signing
    slot_node = SlotNode.create(tmp_path / "node", models, key)
    try:
        yield slot_node
    finally:
        slot_node.close()


def _a_then_b(node: SlotNode, agent: AgentThread) -> dict[str, object]:
    """A in slot a, then B in slot b with a, warm, kept: B's apply record."""
    node.stage(agent, "A")
    node.stage(agent, "B")
    first = post_and_wait(agent, node.apply("A", "apply-0001"))
    assert first["state"] == "succeeded", first
    assert first["standby"] == {"slot": None, "serving": "a"}
    second = post_and_wait(agent, node.apply("B", "apply-0002"))
    assert second["state"] == "succeeded", second
    return second


def test_a_switch_under_load_fails_no_request_and_a_release_stops_the_old_slot_once(
    node: SlotNode,
) -> None:
    agent = node.agent()
    try:
        node.stage(agent, "A")
        node.stage(agent, "B")
        assert post_and_wait(agent, node.apply("A", "apply-0001"))["state"] == "succeeded"
        with node.load() as load:
            wait_for(lambda: len(load.answers) >= 5, 60, what="client load to flow")
            record = post_and_wait(agent, node.apply("B", "apply-0002"))
            wait_for(lambda: load.answers[-1].model == "B", 60, what="answers from B")
        assert record["state"] == "succeeded", record
        assert record["standby"] == {"slot": "a", "serving": "b"}
        timings = record["timings"]
        assert timings["drainStartedAt"] is None and timings["drainedAt"] is None
        assert timings["routedAt"] == timings["servingAt"] is not None
        assert load.failed() == []
        assert {a.model for a in load.answers} == {"A", "B"}
        beat = agent.get("heartbeat")[1]
        assert beat["runtimes"][0]["model"] == "tiny-llama-2"
        assert node.slot_running("a")  # kept warm

        released = post_and_wait(agent, node.release())
        assert released["state"] == "succeeded", released
        assert released["released"] == {"slot": "a", "stopped": True}
        assert not node.slot_running("a")
        assert node.serving() == "B"

        again = post_and_wait(agent, node.release("release-0002"))
        assert again["state"] == "succeeded", again
        assert again["released"] == {"slot": None, "stopped": False}
        assert "nothing to stop" in again["detail"]

        # A in slot a again, B kept warm in b; b's server dies before the release.
        assert post_and_wait(agent, node.apply("A", "apply-0003"))["state"] == "succeeded"
        node.kill_slot("b")
        dead = post_and_wait(agent, node.release("release-0003"))
        assert dead["state"] == "succeeded", dead
        assert dead["released"] == {"slot": "b", "stopped": False}
        assert dead["detail"] == "slot b was not running: nothing to stop"
        assert node.serving() == "A"
    finally:
        agent.close()


def test_a_rollback_routes_back_to_the_warm_slot_and_stops_the_failed_one(
    node: SlotNode,
) -> None:
    agent = node.agent()
    try:
        applied = _a_then_b(node, agent)
        with node.load() as load:
            wait_for(lambda: len(load.answers) >= 5, 60, what="client load to flow")
            posted = time.time()
            record = post_and_wait(agent, node.restore(str(applied["backupId"])))
            wait_for(lambda: load.answers[-1].model == "A", 60, what="answers from A")
        assert record["state"] == "succeeded", record
        assert record["standby"] == {"slot": None, "serving": "a", "warm": True}
        assert record["timings"]["routedAt"] is not None
        assert "routed back to slot a" in record["detail"]
        assert "slot b stopped" in record["detail"]
        assert load.failed() == []
        assert load.first_from("A", posted) is not None
        assert not node.slot_running("b")
        assert node.serving() == "A"
        assert agent.get("heartbeat")[1]["runtimes"][0]["model"] == "tiny-llama-1"
    finally:
        agent.close()


def test_a_rollback_with_the_old_slot_dead_is_a_cold_start_and_says_so(node: SlotNode) -> None:
    agent = node.agent()
    try:
        applied = _a_then_b(node, agent)
        node.kill_slot("a")  # died while held as the standby

        record = post_and_wait(agent, node.restore(str(applied["backupId"])))

        assert record["state"] == "succeeded", record
        assert record["standby"] == {"slot": None, "serving": "a", "warm": False}
        assert "cold start: the previous slot was not running" in record["detail"]
        assert node.serving() == "A"
        assert node.slot_running("a")
        assert not node.slot_running("b")
    finally:
        agent.close()


def test_a_new_slot_that_never_becomes_ready_is_stopped_and_the_old_one_serves(
    node: SlotNode,
) -> None:
    commands = node.slot_commands()
    lazy = SlotCommands(  # readiness left to the warm-up
        commands.ports, "LLAMA_SERVER_WAIT=0 " + commands.start, commands.route, commands.stop
    )
    agent = node.agent(lazy)
    try:
        node.stage(agent, "A")
        node.stage(agent, "broken")
        assert post_and_wait(agent, node.apply("A", "apply-0001"))["state"] == "succeeded"

        quick = replace(WARMUP, timeout_seconds=5)  # the server exits: no need to wait longer
        record = post_and_wait(agent, node.apply("broken", "apply-0002", warmup=(quick,)))

        assert record["state"] == "failed"
        assert record["error"].startswith("warmup_failed: POST http://127.0.0.1:")
        assert "slot b was stopped, slot a still serves" in record["error"]
        assert not node.slot_running("b")
        assert node.serving() == "A"
        assert agent.get("heartbeat")[1]["runtimes"][0]["model"] == "tiny-llama-1"
    finally:
        agent.close()


def test_a_route_command_that_fails_leaves_the_old_slot_serving_and_stops_the_new(
    node: SlotNode,
) -> None:
    """The reload reaches no nginx (its pid file is elsewhere): a real
    failure of the real command."""
    agent = node.agent()
    try:
        node.stage(agent, "A")
        node.stage(agent, "B")
        assert post_and_wait(agent, node.apply("A", "apply-0001"))["state"] == "succeeded"
    finally:
        agent.close()
    upstream = node.router.upstream.read_text()
    nowhere = node.tmp / "nowhere"
    nowhere.mkdir()
    broken = node.slot_commands(
        reload=node.router.reload_command().replace(f"-p {node.router.root}/", f"-p {nowhere}/")
    )
    agent = node.agent(broken)
    try:
        with node.load() as load:
            wait_for(lambda: len(load.answers) >= 3, 60, what="client load to flow")
            record = post_and_wait(agent, node.apply("B", "apply-0002"))
        assert record["state"] == "failed"
        assert record["error"].startswith("route_failed: slot route command (slot b) failed")
        assert "slot b was stopped, slot a still serves" in record["error"]
        assert not node.slot_running("b")
        assert node.router.upstream.read_text() == upstream  # put back by the script
        assert node.serving() == "A"
        assert load.failed() == []
        assert {a.model for a in load.answers} == {"A"}
        assert agent.get("heartbeat")[1]["runtimes"][0]["model"] == "tiny-llama-1"
    finally:
        agent.close()


def test_an_agent_killed_between_start_and_route_stops_the_stray_slot_on_restart(
    node: SlotNode,
) -> None:
    marker = node.tmp / "started-b"
    # Slot b's start returns only long after its server is up: the agent is
    # killed while it waits, before any route command.
    hang = f' && {{ [ "$RECONCILER_SLOT" = a ] || {{ touch {marker}; sleep 30; }}; }}'
    key_dir = node.tmp.parent / "keys"
    real = start_agent(
        node.tmp / "agent", "node-a", key_dir / "reconciler.pub",
        keep_port=True, extra=node.cli_flags(start_suffix=hang),
    )  # fmt: skip
    try:
        for label in ("A", "B"):
            stage = job(f"stage-{label}", kind="stage", artifacts=(node.artifacts[label],))
            _post(real.url, envelope(stage, node.key))
            _wait_succeeded(real, f"stage-{label}")
        _post(real.url, node.apply("A", "apply-0001"))
        _wait_succeeded(real, "apply-0001")
        _post(real.url, node.apply("B", "apply-0002"))
        wait_for(marker.exists, 120, what="slot b to start")
        assert node.slot_running("b")

        real.process.kill()  # SIGKILL
        real.process.wait()
        real.restart()

        assert not node.slot_running("b")
        assert node.slot_running("a")
        assert node.serving() == "A"
        record = real.get("jobs/apply-0002")
        assert record["state"] == "failed"
        assert "slot b it was switching to was stopped, slot a still serves" in record["error"]
        slots = json.loads((real.state / "slots" / "hermes.json").read_text())
        assert slots == {"serving": "a", "warm": None, "pending": None}
        assert real.get("heartbeat")["runtimes"][0]["model"] == "tiny-llama-1"
    finally:
        real.close()


def _post(url: str, body: dict[str, object]) -> None:
    answer = httpx.post(f"{url}/v1/nodes/node-a/jobs", json=body, timeout=30)
    assert answer.status_code in (200, 202), answer.text


def _wait_succeeded(agent: RealAgent, job_id: str) -> None:
    finished = ("succeeded", "failed")
    wait_for(lambda: agent.get(f"jobs/{job_id}")["state"] in finished, 120, what=job_id)
    assert agent.get(f"jobs/{job_id}")["state"] == "succeeded", agent.get(f"jobs/{job_id}")
