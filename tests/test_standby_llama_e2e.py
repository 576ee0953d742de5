"""Warm standby end to end, all real: the daemon and a real bare
repository; three ``reconciler agent`` processes, each with two
llama-server slots run by the shipped slot script and its own nginx as
the node-local router; the models staged from Debian's nginx; and client
load through each node's router for the whole rollout.

The nodes are shared by the module (a machine of 2 cores runs at most two
llama-servers per node): each test first brings the model it rolls from
up on every node, unless the nodes already serve it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from reconciler.cli.llama_runtime import NodeRouter, free_port
from reconciler.spec.times import parse_time
from tests.kit.llama import Models, complete
from tests.kit.standby import Load, target
from tests.kit.standby_fleet import NODES, StandbyWorld, standby_fleet
from tests.kit.waiting import wait_for

pytestmark = pytest.mark.slow

HEALTH_TIMEOUT = 120  # seconds


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, models: Models) -> Iterator[StandbyWorld]:
    with standby_fleet(tmp_path_factory.mktemp("standby-e2e"), models) as standby_world:
        yield standby_world


def nodes_of(statuses: dict[str, Any], rollout: str) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in statuses[rollout]["nodes"]}


def ended_and_released(rollout: str) -> Callable[[dict[str, Any]], bool]:
    """The rollout completed and every slot it kept warm had its release answered."""

    def done(statuses: dict[str, Any]) -> bool:
        status = statuses.get(rollout, {})
        if status.get("reason") == "invalid":
            raise AssertionError(status["message"])
        if status.get("phase") not in ("completed", "paused", "aborted"):
            return False
        kept = [n["standby"] for n in status["nodes"] if (n.get("standby") or {}).get("slot")]
        return all(k["releasedAt"] or k["releaseError"] for k in kept)

    return done


def serve_everywhere(world: StandbyWorld, label: str) -> None:
    """Every node serves model ``label`` through its router (a standby
    rollout to it, unless every heartbeat already reports it). Each such
    rollout has a name of its own: the module's tests share one world, in
    whatever order the workers take them, and A may be served again."""
    model = target(label).model
    beats = [agent.get("heartbeat")["runtimes"] for agent in world.fleet.agents.values()]
    if all(runtimes and runtimes[0]["model"] == model for runtimes in beats):
        return
    earlier = len(list((world.fleet.work / "rollouts").glob("serve-*.yaml")))
    name = f"serve-{label.lower()}-{earlier + 1}"
    world.fleet.push({f"rollouts/{name}.yaml": world.rollout(name, label, "untilCompleted")})
    done = world.fleet.run_until(world.fleet.daemon(), ended_and_released(name), timeout=300)
    assert done[name]["phase"] == "completed", done[name]
    assert set(world.serving().values()) == {label}


def roll_under_load(
    world: StandbyWorld,
    name: str,
    label: str,
    keep: str,
    files: dict[str, str] | None = None,
    **extra: Any,
) -> tuple[dict[str, Any], dict[str, Load], dict[str, float]]:
    """Roll ``label`` out (with ``files`` pushed beside it and ``extra``
    spec fields) with client load on every node from before the first pass
    until after the last release and an answer sent after each node's
    ``routedAt``: (the statuses, the loads, each routedAt)."""
    fleet = world.fleet
    rollout = world.rollout(name, label, keep, healthTimeout=f"{HEALTH_TIMEOUT}s", **extra)
    with world.load() as loads:
        wait_for(
            lambda: all(len(load.answers) >= 3 for load in loads.values()),
            60,
            what="client load through every router",
        )
        fleet.push({**(files or {}), f"rollouts/{name}.yaml": rollout})
        done = fleet.run_until(fleet.daemon(), ended_and_released(name), timeout=300)
        routed = {
            node: parse_time(record["timings"]["routedAt"]).timestamp()
            for node, record in nodes_of(done, name).items()
        }
        wait_for(
            lambda: all(load.answers[-1].sent > routed[n] for n, load in loads.items()),
            60,
            what="an answer sent after each node's routedAt",
        )
    for node, load in loads.items():
        print(
            f"{name} {node}: {len(load.answers)} client requests, {len(load.failed())} failed "
            f"({load.resent} resent after nginx closed the connection), "
            f"outOfService {nodes_of(done, name)[node]['outOfService']}"
        )
    return done, loads, routed


def assert_switched_without_a_failed_request(
    world: StandbyWorld, done: dict[str, Any], name: str, loads: dict[str, Load],
    routed: dict[str, float], old: str, new: str,
) -> None:  # fmt: skip
    """Each node switched from ``old`` to ``new`` with no request failed, out
    of service for 0 s, every answer after its routedAt from ``new``."""
    assert done[name]["phase"] == "completed", done[name]
    for node, record in nodes_of(done, name).items():
        assert record["verdict"] == "passed", record
        assert record["outOfService"] == 0, record
        assert record["timings"]["routedAt"] == record["timings"]["servingAt"], record
        assert record["timings"]["drainStartedAt"] is None, record
        assert record["standby"]["slot"] in ("a", "b"), record
        answers = loads[node].answers
        assert loads[node].failed() == [], node
        after = {a.model for a in answers if a.sent >= routed[node]}
        assert after == {new}, (node, after)
        assert {a.model for a in answers} == {old, new}, node
    assert world.serving() == dict.fromkeys(NODES, new)


def assert_released(
    world: StandbyWorld, done: dict[str, Any], name: str, nodes: tuple[str, ...] = NODES
) -> None:
    """Each of ``nodes``' kept slot was released by an executed release job,
    and its server is stopped; the other slot serves."""
    for node, record in nodes_of(done, name).items():
        if node not in nodes:
            continue
        standby = record["standby"]
        slot = standby["slot"]
        serving = "b" if slot == "a" else "a"
        assert standby["releasedAt"] and standby["releaseError"] == "", record
        assert standby["releaseJobId"].startswith("release-"), record
        releases = world.fleet.agents[node].jobs_of_kind("release")
        [release] = [r for r in releases if r["job_id"] == standby["releaseJobId"]]
        assert release["state"] == "succeeded", release
        assert release["released"] == {"slot": slot, "stopped": True}, release
        assert not world.nodes[node].slot_running(slot), node
        assert world.nodes[node].slot_running(serving), node


def test_a_to_b_until_completed_under_load_fails_no_request_and_stops_every_old_slot(
    world: StandbyWorld,
) -> None:
    serve_everywhere(world, "A")

    done, loads, routed = roll_under_load(world, "a-to-b", "B", "untilCompleted")

    assert_switched_without_a_failed_request(world, done, "a-to-b", loads, routed, "A", "B")
    assert_released(world, done, "a-to-b")
    finished = parse_time(done["a-to-b"]["finishedAt"])
    for node, record in nodes_of(done, "a-to-b").items():
        # kept warm until the rollout ended: sent at its end, not before
        sent = parse_time(record["standby"]["releaseDeadline"]) - timedelta(seconds=HEALTH_TIMEOUT)
        assert sent >= finished, (node, record["standby"])


EVAL_PROMPT = "The capital of France is"
# Passes on any answer: what it shows is whose answer the eval recorded.
SUITE = json.dumps(
    {
        "apiVersion": "reconciler/v1",
        "kind": "EvalSuite",
        "metadata": {"name": "says"},
        "spec": {
            "request": {"maxTokens": 64, "temperature": 0, "seed": 1},
            "cases": [{"name": "says", "prompt": EVAL_PROMPT, "expect": {"notContains": "~~~"}}],
        },
    }
)


def said(url: str) -> str:
    """What the model at ``url`` answers to the suite's case."""
    return str(complete(url, EVAL_PROMPT, 64, seed=1)["choices"][0]["text"]).strip()


def test_b_to_a_until_soaked_releases_each_node_as_it_passes(world: StandbyWorld) -> None:
    """The evals run on the slot being started (``{slotPort}``), while the
    router still sends every request to B: each records A's answer."""
    serve_everywhere(world, "B")
    b_says = said(world.nodes[NODES[0]].router.base_url)
    evals = "{evals: [{name: says, suite: says, url: 'http://127.0.0.1:{slotPort}'}]}"

    done, loads, routed = roll_under_load(
        world, "b-to-a", "A", "untilSoaked", files={"evals/says.yaml": SUITE}, health=evals
    )

    assert_switched_without_a_failed_request(world, done, "b-to-a", loads, routed, "B", "A")
    for node, record in nodes_of(done, "b-to-a").items():
        [result] = record["evals"]
        assert (result["passed"], result["total"]) == (1, 1), record
        answer = result["cases"][0]["answer"].strip()
        assert answer == said(world.nodes[node].router.base_url) != b_says, node
    assert_released(world, done, "b-to-a")
    nodes = nodes_of(done, "b-to-a")
    for node, record in nodes.items():
        # sent in the pass that saw the node pass
        sent = parse_time(record["standby"]["releaseDeadline"]) - timedelta(seconds=HEALTH_TIMEOUT)
        assert sent == parse_time(record["finishedAt"]), (node, record)
    # The first node's release reached its agent before the last node's apply reached its own.
    [first_release] = world.fleet.agents[NODES[0]].jobs_of_kind("release")[-1:]
    last_apply = world.fleet.agents[NODES[-1]].jobs_of_kind("apply")[-1]
    assert last_apply["payload"]["rollout"] == "b-to-a"
    assert parse_time(first_release["accepted_at"]) < parse_time(last_apply["accepted_at"])


def test_a_failed_health_check_rolls_the_last_node_back_to_its_warm_slot_under_load(
    world: StandbyWorld,
) -> None:
    """The check reaches each node's router through one loopback port
    (``/NODE/health``); the last node's path leads to a port nothing
    listens on, so its check fails once it serves B."""
    serve_everywhere(world, "A")
    # The slot A runs in depends on the tests this world ran before.
    [a_slot] = world.nodes[NODES[-1]].running_slots()
    routes = {n: node.router.base_url for n, node in world.nodes.items()}
    routes[NODES[-1]] = f"http://127.0.0.1:{free_port()}"
    router = NodeRouter(routes)
    fleet = world.fleet
    check = f"{{name: ready, http: {{url: '{router.url}/{{node}}/health', timeout: 2s}}}}"
    spec = {"onFailure": "rollback", "health": f"{{checks: [{check}], interval: 1s}}"}
    try:
        with world.load() as loads:
            wait_for(lambda: len(loads[NODES[-1]].answers) >= 3, 60, what="client load")
            fleet.push({"rollouts/back.yaml": world.rollout("back", "B", "untilCompleted", **spec)})
            daemon = fleet.daemon()
            fleet.run_until(
                daemon, lambda s: nodes_of(s, "back")[NODES[-1]]["state"] == "rolled_back", 300
            )
            restore = nodes_of(fleet.statuses(), "back")[NODES[-1]]["restore"]
            back_at = parse_time(restore["timings"]["routedAt"]).timestamp()
            wait_for(lambda: loads[NODES[-1]].answers[-1].sent > back_at, 60, what="answers")
        fleet.push(
            {"rollouts/back.yaml": world.rollout("back", "B", "untilCompleted", abort=True, **spec)}
        )
        done = fleet.run_until(daemon, ended_and_released("back"), timeout=120)
    finally:
        router.close()

    last = NODES[-1]
    records = nodes_of(done, "back")
    assert done["back"]["phase"] == "aborted", done["back"]
    assert records[last]["error"].startswith("health check ready failed"), records[last]
    assert restore["error"] == "", restore
    [restored] = fleet.agents[last].jobs_of_kind("restore")
    assert restored["job_id"] == restore["jobId"] and restored["state"] == "succeeded"
    assert restored["standby"] == {"slot": None, "serving": a_slot, "warm": True}, restored
    # routed back within the job: no download, no start
    routed = parse_time(restored["timings"]["routedAt"])
    assert parse_time(restored["accepted_at"]) <= routed <= parse_time(restored["finished_at"])
    answers = loads[last].answers
    for node, load in loads.items():
        print(f"back {node}: {len(load.answers)} client requests, {len(load.failed())} failed")
    assert loads[last].failed() == []
    assert {a.model for a in answers if a.sent >= back_at} == {"A"}
    assert "B" in {a.model for a in answers}  # it served B before the check failed
    assert world.nodes[last].serving() == "A"
    assert world.nodes[last].running_slots() == [a_slot]
    for node, record in records.items():
        assert record["outOfService"] == 0, record
        assert loads[node].failed() == [], node
    assert_released(world, done, "back", NODES[:-1])
    # The restore stopped the failed slot: the last node's release finds nothing kept.
    [released] = [
        r
        for r in fleet.agents[last].jobs_of_kind("release")
        if r["job_id"] == records[last]["standby"]["releaseJobId"]
    ]
    assert released["state"] == "succeeded", released
    assert released["released"] == {"slot": None, "stopped": False}, released
