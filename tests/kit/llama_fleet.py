"""Three real llama-server nodes behind ``reconciler agent`` processes, for
end-to-end rollouts: each node's server is restarted by the shipped
after-apply script, Debian's nginx serves the model to roll out at a rate
that makes each download take about 2 s, and a client-side balancer sends
client load to the nodes in service (each node's drain command takes it
out). A ``NodeRouter`` gives the rollout one loopback port in front of the
three servers, as all of them run on this machine.

    with llama_fleet(tmp_path, {"A": model_a, "B": model_b}, rolled="B") as world:
        world.fleet.push({"rollouts/tiny.yaml": live_rollout("tiny", "tiny-llama-2", world)})
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.cli.llama_runtime import IDLE_METRICS, Balancer, LlamaNode, NodeRouter, free_port
from reconciler.spec.artifacts import Artifact
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import AgentFleet
from tests.kit.llama import llama_server_binary, model_artifact, node_config
from tests.kit.nginx import NginxServer

NODES = ["gpu-1", "gpu-2", "gpu-3"]
WARMUP_BODY = '{\\"prompt\\": \\"Hello\\", \\"max_tokens\\": 1, \\"temperature\\": 0}'


@dataclass
class World:
    fleet: AgentFleet
    servers: dict[str, LlamaNode]
    balancer: Balancer
    router: NodeRouter
    nginx: NginxServer
    models: dict[str, Path]  # "A": served before; the others by label
    rolled: str  # the label of the model nginx serves


@contextmanager
def llama_fleet(tmp_path: Path, models: dict[str, Path], rolled: str) -> Iterator[World]:
    """Every node serving ``models["A"]`` (seed 1); nginx serves ``models[rolled]``."""
    binary = llama_server_binary()
    model_a, model_new = models["A"], models[rolled]
    servers = {n: LlamaNode(binary, free_port(), tmp_path / "run" / n) for n in NODES}
    config = tmp_path / "initial.yaml"
    config.write_bytes(node_config(model_a, 1))
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "model.gguf").write_bytes(model_new.read_bytes())
    balancer = Balancer({n: s.url for n, s in servers.items()})
    router = NodeRouter({n: s.url for n, s in servers.items()})
    try:
        for server in servers.values():
            started = server.start(config)
            assert started.returncode == 0, started.stderr
        nodes: dict[str, dict[str, Any]] = {}
        for name, server in servers.items():
            commands = balancer.commands(name)
            nodes[name] = {
                "config": config.read_bytes(),
                "after_apply": server.after_apply(),
                "labels": {"role": "gpu"},
                "extra": (
                    "--drain-command",
                    commands["drain"],
                    "--undrain-command",
                    commands["undrain"],
                    "--after-apply-timeout",
                    "90s",
                ),
            }
        size = model_new.stat().st_size
        with NginxServer(tmp_path / "nginx", mirror, rate=size // 2) as nginx:
            fleet = AgentFleet.create(tmp_path, nodes)
            try:
                yield World(fleet, servers, balancer, router, nginx, dict(models), rolled)
            finally:
                fleet.close()
    finally:
        balancer.close()
        router.close()
        for server in servers.values():
            server.stop()


def live_rollout(name: str, model: str, world: World, *, drain: bool, **extra: Any) -> str:
    """A batch-of-one live rollout of the model nginx serves, staged one
    download at a time, warmed up twice, drained when ``drain``; ``extra``
    are more spec fields as ``rollout_yaml`` takes them."""
    artifact = model_artifact(world.nginx.url("model.gguf"), world.models[world.rolled])
    spec: dict[str, Any] = {
        "selector": {"role": "gpu"},
        "batchSize": 1,
        "live": True,
        "stage": "{ahead: 1, maxConcurrent: 1, timeout: 5m}",  # one download at a time
        "warmup": (
            f'[{{http: {{url: "{world.router.url}/{{node}}/v1/completions", method: POST, '
            f'body: "{WARMUP_BODY}", expectStatus: 200, timeout: 30s}}, times: 2}}]'
        ),
    }
    if drain:
        # The preset form (idle: {runtime: llama.cpp, port: P}) sums
        # requests_processing and requests_deferred; this is the first.
        spec["drain"] = (
            f'{{timeout: 1m, idle: {{url: "{world.router.url}/{{node}}/metrics", '
            f'metric: "{IDLE_METRICS[0]}", max: 0}}}}'
        )
    spec.update(extra)
    return rollout_yaml(name, target=target_flow(model, artifact), **spec)


def target_flow(model: str, artifact: Artifact) -> str:
    """A rollout's ``target`` (runtime hermes, llama.cpp) of ``model`` with
    its one artifact, as YAML flow text."""
    path = ", path: model.gguf" if "path" in type(artifact).__dataclass_fields__ else ""
    entry = (
        f"{{name: weights, url: '{artifact.url}', sha256: {artifact.sha256}, "
        f"size: {artifact.size}{path}}}"
    )
    return (
        f"{{runtime: hermes, provider: llama.cpp, model: {model}, profile: default, "
        f"artifacts: [{entry}]}}"
    )
