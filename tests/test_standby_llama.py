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
from pathlib import Path

import pytest

from tests.kit.agents import AgentThread, start_agent
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.llama import Models
from tests.kit.standby import SlotNode, finished, post_and_wait, target
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


def test_a_switch_under_load_fails_no_request_and_a_release_stops_the_old_slot(
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
        status, beat = agent.get("heartbeat")
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
    finally:
        agent.close()
