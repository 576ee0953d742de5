"""Eval baselines end to end on real llama-server nodes: the daemon, a real
bare repository, three ``reconciler agent`` processes whose after-apply
script restarts each node's llama-server (tests/kit/llama_fleet.py).

The suite holds only ``matchesBaseline`` cases: nobody writes the expected
answers down. Before the first batch the last node, still serving model A,
answers an ``eval`` job; its answers are recorded and every apply carries
them. Model A2 (A's weights in another file) answers the same and the
rollout completes; model B (another seed) answers otherwise and fails
``eval_failed`` on its first node, which goes back to A.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit.llama import Models, complete, which_model
from tests.kit.llama_fleet import NODES, World, live_rollout, llama_fleet

pytestmark = pytest.mark.slow

PROMPTS = ("The capital of France is", "Once upon a time")
SUITE = json.dumps(
    {
        "apiVersion": "reconciler/v1",
        "kind": "EvalSuite",
        "metadata": {"name": "golden"},
        "spec": {
            "request": {"maxTokens": 32, "temperature": 0, "seed": 1},
            "cases": [
                {"name": "same", "prompt": PROMPTS[0], "expect": {"matchesBaseline": True}},
                {
                    "name": "close",
                    "prompt": PROMPTS[1],
                    "expect": {"matchesBaseline": {"minSimilarity": 0.9}},
                },
            ],
        },
    }
)


def _run(world: World, model: str) -> dict[str, Any]:
    evals = (
        f"{{evals: [{{name: golden, suite: golden, url: '{world.router.url}/{{node}}', "
        "minPassRate: 100%}]}"
    )
    rollout = live_rollout("tiny", model, world, drain=True, onFailure="pause", health=evals)
    world.fleet.push({"evals/golden.yaml": SUITE, "rollouts/tiny.yaml": rollout})
    done = world.fleet.run_until(
        world.fleet.daemon(),
        lambda s: s.get("tiny", {}).get("phase") in ("completed", "paused"),
        timeout=300,
    )
    status: dict[str, Any] = done["tiny"]
    return status


def _a_says(world: World) -> dict[str, str]:
    url = world.servers[NODES[-1]].url
    return {
        name: complete(url, prompt, 32, seed=1)["choices"][0]["text"]
        for name, prompt in zip(("same", "close"), PROMPTS, strict=True)
    }


@pytest.fixture
def a_to_a2(tmp_path: Path, models: Models) -> Iterator[World]:
    with llama_fleet(tmp_path, {"A": models.model(1), "A2": models.model(1, "a2")}, "A2") as world:
        yield world


@pytest.fixture
def a_to_b(tmp_path: Path, models: Models) -> Iterator[World]:
    with llama_fleet(tmp_path, {"A": models.model(1), "B": models.model(2)}, "B") as world:
        yield world


def test_a2_matches_the_baseline_recorded_from_a_and_completes(a_to_a2: World) -> None:
    world = a_to_a2
    said = _a_says(world)
    status = _run(world, "a2")

    assert status["phase"] == "completed", status
    [job] = status["evalBaselineJobs"]
    assert (job["node"], job["state"]) == (NODES[-1], "recorded")
    assert status["evalBaseline"]["golden"]["answers"] == said
    [eval_job] = world.fleet.agents[NODES[-1]].jobs_of_kind("eval")
    assert eval_job["state"] == "succeeded"
    for node in status["nodes"]:
        [result] = node["evals"]
        assert (result["passed"], result["total"]) == (2, 2), node
    [apply] = world.fleet.agents[NODES[0]].jobs_of_kind("apply")
    cases = apply["payload"]["evals"][0]["cases"]
    assert {c["name"]: c["baselineAnswer"] for c in cases} == said
    for name, server in world.servers.items():
        assert which_model(complete(server.url)["model"], world.models) == "A2", name


def test_b_fails_its_matches_baseline_case_and_its_node_goes_back_to_a(a_to_b: World) -> None:
    world = a_to_b
    said = _a_says(world)
    status = _run(world, "b")

    assert status["phase"] == "paused" and status["hold"]["reason"] == "health_failed", status
    assert status["evalBaseline"]["golden"]["answers"] == said
    first = next(n for n in status["nodes"] if n["name"] == NODES[0])
    assert first["error"].startswith("job failed: eval_failed: golden: "), first["error"]
    [result] = first["evals"]
    assert not result["cases"][0]["ok"]
    assert result["cases"][0]["answer"].strip() != said["same"].strip()
    for name, server in world.servers.items():
        assert which_model(complete(server.url)["model"], world.models) == "A", name
