"""Model artifacts end to end with real parts only: three ``reconciler
agent`` processes on 127.0.0.1, each node a real llama-server (llama.cpp,
built by `make llama-server`) that the shipped after-apply script restarts,
Debian's nginx serving the new GGUF model at a rate that makes each download
take about 2 s, a bare repository pushed to with `git`, and the in-process
daemon.

Client load goes through a client-side balancer over the three servers that
each node's drain command takes it out of; the rollout reaches each node's
metrics and warm-up through one loopback port (``NodeRouter``, which only
forwards), as all three run on this machine.

A 3-batch live rollout with drain and warm-up under bounded client load:
each batch downloads while the one before it is applied, no request fails,
every answer names the file that served it, and none sent after a node's
``servingAt`` comes from the old model. The same switch without drain
cuts requests off.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli.llama_runtime import Answer
from reconciler.spec.times import parse_time
from tests.kit.fleets import AgentFleet
from tests.kit.llama import Models, complete, file_digest, which_model
from tests.kit.llama_fleet import NODES, World, live_rollout, llama_fleet
from tests.kit.waiting import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def world(tmp_path: Path, models: Models) -> Iterator[World]:
    with llama_fleet(tmp_path, {"A": models.model(1), "B": models.model(2)}, "B") as built:
        yield built


def _rollout(name: str, model: str, world: World, *, drain: bool) -> str:
    return live_rollout(name, model, world, drain=drain)


def _job(fleet: AgentFleet, node: str, kind: str, rollout: str) -> dict[str, Any]:
    (record,) = [
        r for r in fleet.agents[node].jobs_of_kind(kind) if r["payload"]["rollout"] == rollout
    ]
    return record


def _window(record: dict[str, Any]) -> tuple[datetime, datetime]:
    return parse_time(record["accepted_at"]), parse_time(record["finished_at"])


def _phase(name: str, *phases: str) -> Any:
    return lambda s: s.get(name, {}).get("phase") in phases


def _failures(answers: list[Answer]) -> list[Answer]:
    return [a for a in answers if a.status != 200]


def test_a_three_node_rollout_drains_and_warms_up_real_servers_without_a_failed_request(
    world: World,
) -> None:
    fleet = world.fleet
    world.balancer.start(4, max_requests=50_000, max_seconds=240)
    try:
        fleet.push({"rollouts/tiny.yaml": _rollout("tiny", "tiny-llama-2", world, drain=True)})
        done = fleet.run_until(fleet.daemon(), _phase("tiny", "completed", "paused"), timeout=240)
        assert done["tiny"]["phase"] == "completed", done["tiny"]
        serving_at = {
            n: parse_time(_job(fleet, n, "apply", "tiny")["timings"]["servingAt"]).timestamp()
            for n in NODES
        }
        wait_for(
            lambda: all(
                any(a.node == n and a.sent >= serving_at[n] for a in list(world.balancer.answers))
                for n in NODES
            ),
            timeout=60,
            what="answers from every node after it serves the new model",
        )
    finally:
        answers = world.balancer.stop()
    status = done["tiny"]
    nodes = {n["name"]: n for n in status["nodes"]}
    # Each batch downloads while the one before it is applied (the agents'
    # own clocks, to the microsecond: one machine).
    for before, after in itertools.pairwise(NODES):
        apply = _window(_job(fleet, before, "apply", "tiny"))
        stage = _window(_job(fleet, after, "stage", "tiny"))
        assert stage[0] < apply[1] and apply[0] < stage[1], (before, apply, after, stage)
    assert all(n["stage"]["state"] == "staged" for n in nodes.values())
    # No client request failed, and each names the file that served it.
    assert answers and not _failures(answers), _failures(answers)[:5]
    labels = {a.model: which_model(a.model, world.models) for a in answers}
    for name in NODES:
        mine = [a for a in answers if a.node == name]
        assert {labels[a.model] for a in mine if a.sent >= serving_at[name]} == {"B"}, name
        assert {labels[a.model] for a in mine} == {"A", "B"}, name  # it served before, too
        assert nodes[name]["outOfService"] > 0
    # Every node serves the staged copy of B, from the agent's own store.
    for name, server in world.servers.items():
        served = Path(complete(server.url)["model"])
        assert served.is_relative_to(fleet.agents[name].state)
        assert file_digest(served) == file_digest(world.models["B"])
    downloads = [line for line in world.nginx.requests(at_least=3) if line.startswith("GET ")]
    assert len(downloads) == 3
    assert sorted(world.balancer.events) == sorted(
        f"{verb} {n}" for n in NODES for verb in ("drain", "undrain")
    )

    # The same switch to another model name without drain: the restarts
    # refuse or cut off the requests that reach each node meanwhile.
    world.balancer.start(4, max_requests=50_000, max_seconds=240)
    try:
        fleet.push({"rollouts/again.yaml": _rollout("again", "tiny-llama-2b", world, drain=False)})
        done = fleet.run_until(fleet.daemon(), _phase("again", "completed", "paused"), timeout=240)
    finally:
        again = world.balancer.stop()[len(answers) :]
    assert done["again"]["phase"] == "completed", done["again"]
    assert _failures(again)
