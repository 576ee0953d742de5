"""A plain live rollout (no artifacts, drain or warm-up) records each
node's time out of service, end to end: a real ``reconciler agent`` whose
after-apply takes a while, a bare repository and the in-process daemon.
The node is out of service from the config written (before after-apply
restarts the runtime) to serving again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.spec.times import parse_time
from tests.kit.documents import node_map, rollout_yaml
from tests.kit.fleets import AgentFleet

OLD_CONFIG = b"provider: ollama\nmodel: llama3-8b\nprofile: default\n"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[AgentFleet]:
    made = AgentFleet.create(
        tmp_path, {"gpu-1": {"config": OLD_CONFIG, "after_apply": "sleep 0.3"}}
    )
    try:
        yield made
    finally:
        made.close()


def completed(statuses: dict[str, Any]) -> bool:
    return statuses.get("web", {}).get("phase") == "completed"


def test_a_plain_live_apply_records_its_time_out_of_service(fleet: AgentFleet) -> None:
    fleet.push({"rollouts/web.yaml": rollout_yaml("web", nodeIds=["gpu-1"], live=True)})
    statuses = fleet.run_until(fleet.daemon(), completed)

    node = node_map(statuses["web"])["gpu-1"]
    timings = node["timings"]
    assert timings["drainStartedAt"] is None and timings["drainedAt"] is None
    took = parse_time(timings["servingAt"]) - parse_time(timings["activatedAt"])
    assert node["outOfService"] == round(took.total_seconds(), 3)
    assert node["outOfService"] >= 0.3  # the after-apply's restart of the runtime
