"""Evals end to end on real llama-server nodes: the daemon, a real bare
repository, three ``reconciler agent`` processes whose after-apply script
restarts each node's llama-server, and bounded client load through a
balancer that each node's drain command takes the node out of.

The golden suite is model A's own answers (the tiny generated models
answer deterministic gibberish at temperature 0), asked before the
rollout: model B (another seed) answers otherwise and fails it; model A2
(A's weights in another file, so another digest) answers the same and
passes it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.spec.times import parse_time
from tests.kit.llama import Models, complete, which_model
from tests.kit.llama_fleet import NODES, World, live_rollout, llama_fleet
from tests.kit.waiting import wait_for

pytestmark = pytest.mark.slow

PROMPTS = ("The capital of France is", "Once upon a time")


def _suite(world: World) -> tuple[str, list[str]]:
    """The suite's YAML, and model A's answers it expects (asked of a node
    that serves A)."""
    url = world.servers[NODES[0]].url
    said = [complete(url, p, 64, seed=1)["choices"][0]["text"].strip() for p in PROMPTS]
    assert said[0] and said[1], said
    document = {
        "apiVersion": "reconciler/v1",
        "kind": "EvalSuite",
        "metadata": {"name": "golden"},
        "spec": {
            "request": {"maxTokens": 64, "temperature": 0, "seed": 1},
            "cases": [
                {"name": "capital", "prompt": PROMPTS[0], "expect": {"equals": said[0]}},
                {"name": "story", "prompt": PROMPTS[1], "expect": {"contains": said[1][:6]}},
            ],
        },
    }
    return json.dumps(document), said  # JSON is YAML; its escapes keep the gibberish exact


def _rollout(name: str, model: str, world: World) -> str:
    evals = (
        f"{{evals: [{{name: golden, suite: golden, url: '{world.router.url}/{{node}}', "
        "minPassRate: 100%}]}"
    )
    return live_rollout(name, model, world, drain=True, onFailure="pause", health=evals)


def _apply(world: World, node: str, rollout: str) -> dict[str, Any]:
    (record,) = [
        r
        for r in world.fleet.agents[node].jobs_of_kind("apply")
        if r["payload"]["rollout"] == rollout
    ]
    return record


@pytest.fixture
def a_to_b(tmp_path: Path, models: Models) -> Iterator[World]:
    with llama_fleet(tmp_path, {"A": models.model(1), "B": models.model(2)}, "B") as world:
        yield world


@pytest.fixture
def a_to_a2(tmp_path: Path, models: Models) -> Iterator[World]:
    with llama_fleet(tmp_path, {"A": models.model(1), "A2": models.model(1, "a2")}, "A2") as world:
        yield world


def test_model_b_fails_its_evals_on_the_first_node_which_goes_back_to_a_under_load(
    a_to_b: World,
) -> None:
    world, fleet = a_to_b, a_to_b.fleet
    suite, said = _suite(world)
    world.balancer.start(4, max_requests=50_000, max_seconds=240)
    try:
        fleet.push({"evals/golden.yaml": suite, "rollouts/tiny.yaml": _rollout("tiny", "b", world)})
        held = fleet.run_until(
            fleet.daemon(),
            lambda s: (
                (s.get("tiny", {}).get("hold") or {}).get("reason") is not None
                or s.get("tiny", {}).get("phase") == "completed"
            ),
            timeout=240,
        )
        back_at = parse_time(_apply(world, NODES[0], "tiny")["finished_at"]).timestamp()
        wait_for(
            lambda: any(
                a.node == NODES[0] and a.sent > back_at for a in list(world.balancer.answers)
            ),
            timeout=60,
            what="client answers from the first node once it serves again",
        )
    finally:
        answers = world.balancer.stop()

    status = held["tiny"]
    assert status["phase"] != "completed", status
    nodes = {n["name"]: n for n in status["nodes"]}
    first = nodes[NODES[0]]
    assert first["state"] == "failed", first
    assert first["error"].startswith("job failed: eval_failed: golden: "), first["error"]
    # The others were at most staged (a download ahead): none was applied.
    assert {nodes[n]["state"] for n in NODES[1:]} <= {"pending", "staged"}
    assert [world.fleet.agents[n].jobs_of_kind("apply") for n in NODES[1:]] == [[], []]
    assert status["hold"]["reason"] == "health_failed"
    # B answered the suite, and not as A does.
    [result] = first["evals"]
    assert not result["cases"][0]["ok"]
    assert result["cases"][0]["answer"].strip() != said[0]
    [check] = first["checks"]
    assert (check["name"], check["ok"]) == ("golden", False)
    assert check["detail"].endswith("cases held (0%; minimum 100%)"), check
    # Every answer the clients received came from A; the first node serves A again.
    assert answers and all(a.status == 200 for a in answers), [
        a for a in answers if a.status != 200
    ][:5]
    assert {which_model(a.model, world.models) for a in answers} == {"A"}
    for name, server in world.servers.items():
        assert which_model(complete(server.url)["model"], world.models) == "A", name
    assert world.balancer.events == [f"drain {NODES[0]}", f"undrain {NODES[0]}"]


def test_model_a2_passes_the_evals_on_every_node_and_the_rollout_completes(
    a_to_a2: World,
) -> None:
    world, fleet = a_to_a2, a_to_a2.fleet
    suite, said = _suite(world)
    fleet.push({"evals/golden.yaml": suite, "rollouts/tiny.yaml": _rollout("tiny", "a2", world)})
    done = fleet.run_until(
        fleet.daemon(),
        lambda s: s.get("tiny", {}).get("phase") in ("completed", "paused"),
        timeout=240,
    )

    status = done["tiny"]
    assert status["phase"] == "completed", status
    for node in status["nodes"]:
        [result] = node["evals"]
        assert (result["name"], result["passed"], result["total"]) == ("golden", 2, 2), node
        assert result["cases"][0]["answer"].strip() == said[0]
        assert node["checks"] == [
            {"name": "golden", "ok": True, "detail": "2 of 2 cases held (100%; minimum 100%)"}
        ], node
        assert _apply(world, node["name"], "tiny")["evals"] == node["evals"]
    for name, server in world.servers.items():
        assert which_model(complete(server.url)["model"], world.models) == "A2", name
