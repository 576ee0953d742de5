"""Model artifacts end to end with real parts only: three ``reconciler
agent`` processes on 127.0.0.1, Debian's nginx serving a 64 MiB artifact at
a rate that makes each download take about 3 s, one stand-in inference
runtime per node under client load (tests/kit/runtime.py), a bare
repository pushed to with `git`, and the in-process daemon.

A 3-batch live rollout with drain and warm-up: each batch downloads while
the one before it is applied, no node is out of service for a second, and
the client load sees no failed request. The same switch without drain cuts
requests off.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from reconciler.spec.times import parse_time
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import AgentFleet
from tests.kit.nginx import NginxServer
from tests.kit.runtime import METRIC, ClientLoad, RuntimeFleet

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
SIZE = 64 * MiB
NODES = ["gpu-1", "gpu-2", "gpu-3"]
OLD = b"provider: vllm\nmodel: old\nprofile: default\n"


def _blob(size: int) -> bytes:
    block = hashlib.sha256(b"e2e weights").digest() * 4096
    return (block * (size // len(block) + 1))[:size]


@pytest.fixture
def artifact(tmp_path: Path) -> Iterator[tuple[NginxServer, str]]:
    files = tmp_path / "mirror"
    files.mkdir()
    data = _blob(SIZE)
    (files / "model.gguf").write_bytes(data)
    with NginxServer(tmp_path / "nginx", files, rate=SIZE // 3) as nginx:
        yield nginx, hashlib.sha256(data).hexdigest()


@pytest.fixture
def runtimes() -> Iterator[RuntimeFleet]:
    with RuntimeFleet(NODES, "old", load_seconds=0.2) as fleet:
        yield fleet


@pytest.fixture
def fleet(tmp_path: Path, runtimes: RuntimeFleet) -> Iterator[AgentFleet]:
    nodes: dict[str, dict[str, Any]] = {}
    for name in NODES:
        commands = runtimes.runtimes[name].commands(tmp_path / "scripts" / name)
        nodes[name] = {
            "config": OLD,
            "after_apply": commands["after_apply"],
            "labels": {"role": "gpu"},
            "extra": (
                "--drain-command",
                commands["drain"],
                "--undrain-command",
                commands["undrain"],
            ),
        }
    kit = AgentFleet.create(tmp_path, nodes)
    try:
        yield kit
    finally:
        kit.close()


def _rollout(
    name: str, model: str, nginx: NginxServer, digest: str, runtimes: RuntimeFleet, *, drain: bool
) -> str:
    artifact = (
        f"{{name: weights, url: '{nginx.url('model.gguf')}', sha256: {digest}, size: {SIZE}}}"
    )
    target = f"{{runtime: hermes, provider: vllm, model: {model}, profile: default, artifacts: [{artifact}]}}"
    spec: dict[str, Any] = {
        "selector": {"role": "gpu"},
        "batchSize": 1,
        "live": True,
        "stage": "{ahead: 1, maxConcurrent: 1, timeout: 5m}",  # one download at a time
        "warmup": f'[{{http: {{url: "{runtimes.url}/{{node}}/v1/completions", method: POST, body: "{{}}", expectStatus: 200, timeout: 30s}}, times: 2}}]',
    }
    if drain:
        spec["drain"] = (
            f'{{timeout: 1m, idle: {{url: "{runtimes.url}/{{node}}/metrics", metric: "{METRIC}", max: 0}}}}'
        )
    return rollout_yaml(name, target=target, **spec)


def _job(fleet: AgentFleet, node: str, kind: str) -> tuple[datetime, datetime]:
    """When ``node``'s only job of ``kind`` was accepted and finished."""
    (record,) = fleet.agents[node].jobs_of_kind(kind)
    return parse_time(record["accepted_at"]), parse_time(record["finished_at"])


def _nodes(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in status["nodes"]}


def _phase(name: str, *phases: str) -> Any:
    return lambda s: s.get(name, {}).get("phase") in phases


def test_a_three_batch_rollout_stages_ahead_drains_and_warms_up_without_a_failed_request(
    fleet: AgentFleet, runtimes: RuntimeFleet, artifact: tuple[NginxServer, str]
) -> None:
    nginx, digest = artifact
    loads = {name: ClientLoad(runtime, 2, 0.05) for name, runtime in runtimes.runtimes.items()}
    try:
        fleet.push(
            {
                "rollouts/llama.yaml": _rollout(
                    "llama", "llama3.1-8b", nginx, digest, runtimes, drain=True
                )
            }
        )
        done = fleet.run_until(fleet.daemon(), _phase("llama", "completed", "paused"), timeout=300)
    finally:
        answered = {name: load.stop() for name, load in loads.items()}
    status = done["llama"]
    assert status["phase"] == "completed", status
    nodes = _nodes(status)
    # Each batch downloads while the one before it is applied (the agents'
    # own clocks, to the microsecond: one machine).
    for before, after in itertools.pairwise(NODES):
        apply = _job(fleet, before, "apply")
        stage = _job(fleet, after, "stage")
        assert stage[0] < apply[1] and apply[0] < stage[1], (before, apply, after, stage)
    assert all(
        n["stage"]["state"] == "staged" and n["stage"]["attempt"] == 1 for n in nodes.values()
    )
    # Out of service, drain to serving: well under a second on every node.
    assert all(0 < n["outOfService"] < 1 for n in nodes.values()), {
        k: n["outOfService"] for k, n in nodes.items()
    }
    # No client request failed: running generations finished, new ones went elsewhere.
    assert {name: r.failed for name, r in runtimes.runtimes.items()} == dict.fromkeys(NODES, 0)
    assert all(a.get(200, 0) > 0 for a in answered.values())
    assert all(r.model == "llama3.1-8b" and not r.drained for r in runtimes.runtimes.values())
    # One download per node, each the whole file once.
    downloads = [line for line in nginx.requests(at_least=3) if line.startswith("GET ")]
    assert len(downloads) == 3 and all(line.split()[3] == str(SIZE) for line in downloads)
    for agent in fleet.agents.values():
        assert sorted(r["payload"]["kind"] for r in agent.journal()) == ["apply", "stage"]

    # The same switch to another model without drain: the restart cuts requests off.
    for runtime in runtimes.runtimes.values():
        runtime.load_seconds = 0.5
    loads = {name: ClientLoad(runtime, 2, 0.05) for name, runtime in runtimes.runtimes.items()}
    try:
        fleet.push(
            {
                "rollouts/qwen.yaml": _rollout(
                    "qwen", "qwen2.5-7b", nginx, digest, runtimes, drain=False
                )
            }
        )
        done = fleet.run_until(fleet.daemon(), _phase("qwen", "completed", "paused"), timeout=300)
    finally:
        for load in loads.values():
            load.stop()
    assert done["qwen"]["phase"] == "completed", done["qwen"]
    assert sum(r.failed for r in runtimes.runtimes.values()) > 0
    assert (
        len([line for line in nginx.requests() if line.startswith("GET ")]) == 3
    )  # held: not fetched again
