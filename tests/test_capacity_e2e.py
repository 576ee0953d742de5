"""Capacity end to end (docs/capacity.md): batches spread across zones, and
a failure budget under observe, through the daemon with real agents.

Real parts only: one ``reconciler agent`` process per node on 127.0.0.1,
live apply allowed, a bare repository pushed to with the `git` binary, and
the in-process ``Daemon`` running real reconcile passes. A node fails
because its after-apply command fails, as a runtime that does not come
back would."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.kit.documents import node_map, rollout_yaml
from tests.kit.fleets import AgentFleet

PASSES = 120.0  # seconds a test waits for passes to get somewhere; generous on a loaded machine
FAILS = "echo the runtime did not come back; exit 1"


def phase(name: str, *phases: str) -> Any:
    return lambda statuses: statuses.get(name, {}).get("phase") in phases


def applied(fleet: AgentFleet) -> set[str]:
    """Nodes whose agent has received an apply job."""
    return {name for name, agent in fleet.agents.items() if agent.jobs_of_kind("apply")}


@pytest.fixture
def fleets() -> Iterator[list[AgentFleet]]:
    made: list[AgentFleet] = []
    yield made
    for fleet in made:
        fleet.close()  # stops its agents too


ZONES = {
    "gpu-1": "a",
    "gpu-2": "a",
    "gpu-3": "b",
    "gpu-4": "b",
    "gpu-5": "c",
    "gpu-6": "c",
}


def test_six_nodes_in_three_zones_go_one_per_zone_in_each_batch_and_the_unlabelled_too(
    tmp_path: Path, fleets: list[AgentFleet]
) -> None:
    nodes: dict[str, Mapping[str, Any]] = {
        name: {"labels": {"role": "gpu", "zone": zone}} for name, zone in ZONES.items()
    }
    nodes["gpu-7"] = {"labels": {"role": "gpu"}}  # no zone label: the value ""
    fleet = AgentFleet.create(tmp_path, nodes)
    fleets.append(fleet)
    text = rollout_yaml(
        "spread",
        selector={"role": "gpu"},
        batchSize=3,
        spreadBy={"label": "zone", "maxPerBatch": 1},
        live=True,
    )
    fleet.push({"rollouts/spread.yaml": text}, "Roll out across zones")
    daemon = fleet.daemon()

    daemon.run_pass()
    for agent in fleet.agents.values():
        agent.wait_idle()
    assert applied(fleet) == {"gpu-1", "gpu-3", "gpu-5"}  # the first batch only

    statuses = fleet.run_until(daemon, phase("spread", "completed"), timeout=PASSES)

    records = node_map(statuses["spread"])
    batches: dict[int, list[str]] = {}
    for name, record in records.items():
        batches.setdefault(record["batch"], []).append(name)
    assert batches == {1: ["gpu-1", "gpu-3", "gpu-5"], 2: ["gpu-2", "gpu-4", "gpu-6"], 3: ["gpu-7"]}
    for members in batches.values():
        per_zone = Counter(ZONES.get(name, "") for name in members)
        assert max(per_zone.values()) == 1
    assert applied(fleet) == set(nodes)
    assert all(r["state"] == "succeeded" for r in records.values())
    assert statuses["spread"]["frozen"]["spreadBy"] == {"label": "zone", "maxPerBatch": 1}


def test_a_budget_of_one_carries_on_past_the_first_failure_and_holds_at_the_second(
    tmp_path: Path, fleets: list[AgentFleet]
) -> None:
    fleet = AgentFleet.create(
        tmp_path,
        {
            "gpu-1": {"after_apply": FAILS},
            "gpu-2": {},
            "gpu-3": {"after_apply": FAILS},
            "gpu-4": {},
        },
    )
    fleets.append(fleet)
    text = rollout_yaml(
        "budget",
        nodeIds=["gpu-1", "gpu-2", "gpu-3", "gpu-4"],
        live=True,
        onFailure="observe",
        failureBudget=1,
    )
    fleet.push({"rollouts/budget.yaml": text}, "Roll out with a failure budget")
    daemon = fleet.daemon()

    statuses = fleet.run_until(daemon, phase("budget", "paused"), timeout=PASSES)

    status = statuses["budget"]
    assert status["hold"]["reason"] == "failure_budget_exceeded"
    assert status["hold"]["nodes"] == ["gpu-1", "gpu-3"]
    assert "gpu-1, gpu-3 ended failed" in status["hold"]["message"]
    states = {name: r["state"] for name, r in node_map(status).items()}
    assert states == {
        "gpu-1": "failed",
        "gpu-2": "succeeded",
        "gpu-3": "failed",
        "gpu-4": "pending",
    }
    assert applied(fleet) == {"gpu-1", "gpu-2", "gpu-3"}  # carried on past gpu-1, not past gpu-3

    fleet.pull()
    fleet.push({"rollouts/budget.yaml": text + "  resumeRequest: go-on\n"}, "Carry on")
    statuses = fleet.run_until(daemon, phase("budget", "failed"), timeout=PASSES)

    states = {name: r["state"] for name, r in node_map(statuses["budget"]).items()}
    assert states == {
        "gpu-1": "failed",
        "gpu-2": "succeeded",
        "gpu-3": "failed",
        "gpu-4": "succeeded",
    }
    # observe recorded the failures: the resume sent neither failed node again
    assert [len(fleet.agents[n].jobs_of_kind("apply")) for n in sorted(fleet.agents)] == [1] * 4
