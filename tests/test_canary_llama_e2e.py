"""A canary judged against its own fleet on real llama-server nodes: three
real agents, each node's llama-server (llama.cpp, built by `make
llama-server`) restarted by the shipped after-apply script, Debian's
``prometheus`` scraping the servers' own ``/metrics``, client load on all
three, and the daemon comparing the seconds per generated token of the
canary with the other two (``llamacpp:tokens_predicted_seconds_total`` over
``llamacpp:tokens_predicted_total``).

The rollout gives the canary a model many times slower per token: the
comparison fails it and holds the rollout, the other nodes untouched.
Exact latency factors and error shares are tested against synthetic
exporters (tests/test_canary_e2e.py): a real server cannot be set to them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reconciler.cli.llama_runtime import Balancer, LlamaNode, free_port
from tests.kit.documents import node_map, rollout_yaml
from tests.kit.fleets import AgentFleet
from tests.kit.llama import (
    Models,
    complete,
    llama_server_binary,
    model_artifact,
    node_config,
    which_model,
)
from tests.kit.nginx import NginxServer
from tests.kit.prometheus import PrometheusServer
from tests.kit.waiting import wait_for

pytestmark = pytest.mark.slow

NODES = ("gpu-a1", "gpu-a2", "gpu-a3")
PER_TOKEN = (
    "{name: seconds-per-token, query: '"
    'rate(llamacpp:tokens_predicted_seconds_total{node="{node}"}[4s]) / '
    'rate(llamacpp:tokens_predicted_total{node="{node}"}[4s])\', tolerance: 50%}'
)


@dataclass(frozen=True)
class Target:
    """What Prometheus scrapes for one node: its server, labelled with it."""

    node: str
    address: str


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[dict[str, LlamaNode]]:
    binary = llama_server_binary()
    made = {n: LlamaNode(binary, free_port(), tmp_path / "run" / n) for n in NODES}
    try:
        yield made
    finally:
        for server in made.values():
            server.stop()


def test_a_canary_on_a_much_slower_model_fails_its_comparison_and_holds(
    tmp_path: Path, models: Models, servers: dict[str, LlamaNode]
) -> None:
    fast, slow = models.model(1), models.slow(3)
    config = node_config(fast, 1)
    (tmp_path / "initial.yaml").write_bytes(config)
    for server in servers.values():
        started = server.start(tmp_path / "initial.yaml")
        assert started.returncode == 0, started.stderr
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "model.gguf").symlink_to(slow)  # nginx follows it
    load = Balancer({n: s.url for n, s in servers.items()})
    targets = [Target(n, s.url.removeprefix("http://")) for n, s in servers.items()]
    with (
        NginxServer(tmp_path / "nginx", mirror) as nginx,
        PrometheusServer(tmp_path, targets=targets) as prometheus,
    ):
        settings = (
            "apiVersion: reconciler/v1\nkind: Settings\nspec:\n"
            f"  prometheus: {{url: '{prometheus.url}'}}\n"
        )
        nodes = {n: {"config": config, "after_apply": s.after_apply()} for n, s in servers.items()}
        fleet = AgentFleet.create(tmp_path, nodes, files={"reconciler.yaml": settings})
        try:
            load.start(4, max_requests=100_000, max_seconds=240)
            wait_for(
                lambda: {a.node for a in load.answers} >= set(NODES), what="every node to answer"
            )
            artifact = model_artifact(nginx.url("model.gguf"), slow)
            path = ", path: model.gguf" if "path" in type(artifact).__dataclass_fields__ else ""
            target = (
                "{runtime: hermes, provider: llama.cpp, model: tiny-llama-slow, "
                f"profile: default, artifacts: [{{name: weights, url: '{artifact.url}', "
                f"sha256: {artifact.sha256}, size: {artifact.size}{path}}}]}}"
            )
            fleet.push(
                {
                    "rollouts/r.yaml": rollout_yaml(
                        "r",
                        target=target,
                        nodeIds=list(NODES),
                        live=True,
                        batchSize=1,
                        health=f"{{soak: 20s, interval: 1s, compare: [{PER_TOKEN}]}}",
                    )
                }
            )
            statuses = fleet.run_until(
                fleet.daemon(),
                lambda s: _state(s, "gpu-a1") in ("failed", "succeeded", "unknown"),
                timeout=180,
                pause=0.25,
            )
        finally:
            load.stop()
            load.close()
            fleet.close()
    record = node_map(statuses["r"])["gpu-a1"]
    assert record["state"] == "failed", record.get("checks")
    assert record["error"].startswith("health check seconds-per-token failed: median ")
    judged = next(c for c in record["checks"] if c["name"] == "seconds-per-token")
    assert judged["baseline"]["nodes"] == ["gpu-a2", "gpu-a3"], judged
    assert judged["canary"]["median"] > 2 * judged["baseline"]["median"]
    assert statuses["r"]["hold"]["reason"] == "health_failed"
    # Staged ahead, never switched: part of the baseline.
    assert (_state(statuses, "gpu-a2"), _state(statuses, "gpu-a3")) == ("staged", "pending")
    labels = {"fast": fast, "slow": slow}
    assert which_model(complete(servers["gpu-a1"].url)["model"], labels) == "slow"
    assert which_model(complete(servers["gpu-a2"].url)["model"], labels) == "fast"


def _state(statuses: dict[str, object], node: str) -> str:
    rollout = statuses.get("r")
    found = node_map(rollout).get(node, {}) if isinstance(rollout, dict) else {}
    return str(found.get("state", ""))
