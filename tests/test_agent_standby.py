"""The agent's side of a warm standby that needs no runtime: the slot
options come as four or not at all, an apply with a standby is refused by
an agent without slots before anything changes, a release on a node with
nothing kept succeeds with nothing done, and a job kind the agent does not
run fails saying so, changing nothing.

The slot switches themselves, with real llama-server slots and nginx, are
in test_standby_llama.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reconciler.node.agent_config import SlotCommands
from reconciler.node.state_dir import StateDir
from reconciler.protocol.signing import SigningKey
from reconciler.spec.evals import Eval, EvalCase, EvalSuite
from reconciler.spec.model import Target
from tests.kit.agents import AgentThread, start_agent
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.waiting import wait_for

CONFIG = b"provider: vllm\nmodel: llama3.1-8b-old\nprofile: default\n"
NEWER = Target("hermes", "vllm", "llama3.1-8b-newer", "default")


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return make_key(tmp_path / "keys" / "reconciler").signing


@pytest.fixture
def agent(tmp_path: Path, key: SigningKey) -> Iterator[AgentThread]:
    """An agent without slots, on a node whose runtime has a config."""
    (tmp_path / "state" / "runtimes").mkdir(parents=True)
    (tmp_path / "state" / "runtimes" / "hermes.yaml").write_bytes(CONFIG)
    served = AgentThread(tmp_path / "state", [key])
    try:
        yield served
    finally:
        served.close()


def _agent_command(tmp_path: Path, *given: str) -> subprocess.CompletedProcess[str]:
    """``reconciler agent`` with ``given`` options, run to its exit."""
    args = [
        sys.executable, "-m", "reconciler", "agent", "--node", "n1",
        "--state-dir", str(tmp_path / "state"), "--runtime", "hermes",
        "--trust-key", str(tmp_path / "keys" / "reconciler.pub"), *given,
    ]  # fmt: skip
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("given", "missing"),
    [
        (["--slot-ports", "8081,8082"], "--slot-start-command, --slot-route-command"),
        (["--slot-stop-command", "true"], "without --slot-ports, --slot-start-command"),
    ],
)
def test_slot_options_come_all_four_or_none(
    tmp_path: Path, key: SigningKey, given: list[str], missing: str
) -> None:
    done = _agent_command(tmp_path, *given)
    assert done.returncode == 2, done.stderr
    assert missing in done.stderr
    assert "all four --slot-* options" in done.stderr


def test_slot_ports_must_be_two_different_ports(tmp_path: Path, key: SigningKey) -> None:
    done = _agent_command(
        tmp_path,
        *("--slot-ports", "8081,8081", "--slot-start-command", "true"),
        *("--slot-route-command", "true", "--slot-stop-command", "true"),
    )
    assert done.returncode == 2
    assert "--slot-ports '8081,8081': give two different ports" in done.stderr


def test_an_apply_with_standby_to_an_agent_without_slots_is_refused_before_anything_changes(
    tmp_path: Path, agent: AgentThread, key: SigningKey
) -> None:
    status, answer = agent.post(envelope(job("apply-0001", standby="untilCompleted"), key))

    assert status == 422
    assert answer["error"] == "standby_not_supported"
    assert "--slot-ports" in answer["message"]
    assert (tmp_path / "state" / "runtimes" / "hermes.yaml").read_bytes() == CONFIG
    assert list((tmp_path / "state" / "jobs").glob("*.json")) == []
    assert agent.get("jobs/apply-0001")[0] == 404


def test_a_release_on_a_node_without_slots_succeeds_with_nothing_to_stop(
    tmp_path: Path, agent: AgentThread, key: SigningKey
) -> None:
    status, _ = agent.post(envelope(job("release-0001", kind="release"), key))
    record = agent.wait_finished("release-0001")

    assert status == 202
    assert record["state"] == "succeeded"
    assert record["released"] == {"slot": None, "stopped": False}
    assert (tmp_path / "state" / "runtimes" / "hermes.yaml").read_bytes() == CONFIG


def test_an_eval_job_is_not_an_apply_and_changes_nothing_even_when_it_fails(
    tmp_path: Path, agent: AgentThread, key: SigningKey
) -> None:
    """Before eval jobs had a handler, the agent ran one as an apply and
    wrote its target as the runtime's config."""
    case = EvalCase("greeting", "matchesBaseline", "true", prompt="Say hello")
    suite = EvalSuite("golden", "ab" * 32, (case,), seed=1)
    golden = Eval("golden", "golden", "http://127.0.0.1:9/", 100.0, 60, suite=suite)
    status, _ = agent.post(envelope(job("eval-0001", kind="eval", evals=(golden,)), key))
    record = agent.wait_finished("eval-0001")

    assert status == 202
    assert record["state"] == "failed"
    assert "golden" in record["error"] and "unsupported_kind" not in record["error"]
    assert (tmp_path / "state" / "runtimes" / "hermes.yaml").read_bytes() == CONFIG
    assert agent.get("backups")[1] == []


def test_slot_configs_are_not_runtimes_of_their_own(tmp_path: Path) -> None:
    state = StateDir.open(tmp_path / "state")
    try:
        for name in ("hermes.yaml", "hermes.a.yaml", "hermes.b.yaml"):
            (state.runtimes / name).write_bytes(CONFIG)
        assert state.runtime_names(slotted=True) == ["hermes"]
        assert state.runtime_names() == ["hermes", "hermes.a", "hermes.b"]  # as before
    finally:
        state.close()


def test_an_agent_with_slots_applies_without_standby_as_before(
    tmp_path: Path, key: SigningKey
) -> None:
    """Slots change nothing for an apply that does not ask for a standby:
    after-apply runs, no slot command does."""
    log = tmp_path / "commands.log"
    (tmp_path / "state" / "runtimes").mkdir(parents=True)
    (tmp_path / "state" / "runtimes" / "hermes.yaml").write_bytes(CONFIG)
    slots = SlotCommands((1, 2), *(f"echo {step} >> {log}" for step in ("start", "route", "stop")))
    agent = AgentThread(
        tmp_path / "state", [key], slots=slots, after_apply=f"echo after-apply >> {log}"
    )
    try:
        agent.post(envelope(job("apply-0001"), key))
        record = agent.wait_finished("apply-0001")
    finally:
        agent.close()
    assert record["state"] == "succeeded", record
    assert "standby" not in record
    assert log.read_text() == "after-apply\n"
    assert not (tmp_path / "state" / "slots").exists()


def test_an_agent_killed_in_the_route_command_routes_back_and_stops_the_new_slot(
    tmp_path: Path, key: SigningKey
) -> None:
    """The slot commands only note what they were asked (the switch with
    real servers and nginx is in test_standby_llama.py): killed while the
    route to slot b runs, the agent cannot know whether traffic moved, so
    on restart it routes to the recorded slot a again and stops b."""
    log, marker = tmp_path / "commands.log", tmp_path / "routing-b"
    note = f'echo "$0 $RECONCILER_SLOT $RECONCILER_SLOT_PORT" >> {log}'
    hang = f'[ "$RECONCILER_SLOT" = a ] || {{ touch {marker}; sleep 20; }}'
    slots = [
        "--slot-ports", "18081,18082",
        "--slot-start-command", f"sh -c '{note}' start",
        "--slot-route-command", f"sh -c '{note}' route; {hang}",
        "--slot-stop-command", f"sh -c '{note}' stop",
    ]  # fmt: skip
    agent = start_agent(tmp_path / "node", "node-a", tmp_path / "keys" / "reconciler.pub",
                        config=CONFIG, keep_port=True, extra=slots)  # fmt: skip
    try:
        first = job("apply-0001", standby="untilCompleted")
        assert httpx.post(f"{agent.url}/v1/nodes/node-a/jobs", json=envelope(first, key)).is_success
        wait_for(lambda: agent.get("jobs/apply-0001")["state"] == "succeeded", what="slot a")
        second = job("apply-0002", standby="untilCompleted", target=NEWER)
        assert httpx.post(
            f"{agent.url}/v1/nodes/node-a/jobs", json=envelope(second, key)
        ).is_success
        wait_for(marker.exists, what="the route to slot b")

        agent.process.kill()  # SIGKILL
        agent.process.wait()
        agent.restart()

        assert log.read_text().splitlines() == [
            "start a 18081",
            "route a 18081",
            "start b 18082",
            "route b 18082",
            "route a 18081",
            "stop b 18082",
        ]
        record = agent.get("jobs/apply-0002")
        assert record["state"] == "failed"
        assert record["error"].endswith(
            "; slot b it was switching to was stopped, slot a still serves"
        )
        assert agent.get("heartbeat")["runtimes"][0]["model"] == "llama3.1-8b"
        slots_record = json.loads((agent.state / "slots" / "hermes.json").read_text())
        assert slots_record == {"serving": "a", "warm": None, "pending": None}
    finally:
        agent.close()
