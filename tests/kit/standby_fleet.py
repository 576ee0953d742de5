"""Three nodes with a warm standby behind real ``reconciler agent``
processes, for rollouts by the daemon: each node a ``SlotNode`` (two
llama-server slots run by the shipped slot script, its own nginx router),
one Debian nginx serving the models to stage for all of them, and an
``AgentFleet`` whose node files point at the agents.

    with standby_fleet(tmp_path, models) as world:
        world.fleet.push({"rollouts/to-b.yaml": world.rollout("to-b", "B", "untilCompleted")})
        with world.load() as loads:  # client load through each node's router
            world.fleet.run_until(world.fleet.daemon(), done, timeout=300)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.kit.documents import rollout_yaml
from tests.kit.fleets import AgentFleet
from tests.kit.keys import make_key
from tests.kit.llama import Models
from tests.kit.llama_fleet import WARMUP_BODY, target_flow
from tests.kit.nginx import NginxServer
from tests.kit.standby import Load, SlotNode, labelled_models, mirror, target

NODES = ("gpu-1", "gpu-2", "gpu-3")
# On the slot being started, before traffic moves to it.
WARMUP = (
    '[{http: {url: "http://127.0.0.1:{slotPort}/v1/completions", method: POST, '
    f'body: "{WARMUP_BODY}", expectStatus: 200, timeout: 60s}}, times: 1}}]'
)


@dataclass
class StandbyWorld:
    fleet: AgentFleet
    nodes: dict[str, SlotNode]

    def rollout(self, name: str, label: str, keep: str, **extra: Any) -> str:
        """A batch-of-one live rollout of model ``label`` with ``standby:
        {keepPrevious: keep}``, staged one download at a time and warmed up
        on the new slot; ``extra`` are more spec fields as ``rollout_yaml``
        takes them."""
        artifact = self.nodes[NODES[0]].artifacts[label]  # the same file server for all
        spec: dict[str, Any] = {
            "selector": {"role": "gpu"},
            "batchSize": 1,
            "live": True,
            "standby": {"keepPrevious": keep},
            "stage": "{ahead: 1, maxConcurrent: 1, timeout: 5m}",
            "warmup": WARMUP,
            **extra,
        }
        return rollout_yaml(name, target=target_flow(target(label).model, artifact), **spec)

    @contextmanager
    def load(self) -> Iterator[dict[str, Load]]:
        """Client load through every node's router until the block ends."""
        with ExitStack() as stack:
            yield {name: stack.enter_context(node.load()) for name, node in self.nodes.items()}

    def serving(self) -> dict[str, str]:
        """The label of the model each node's router answers with."""
        return {name: node.serving() for name, node in self.nodes.items()}


@contextmanager
def standby_fleet(tmp: Path, models: Models) -> Iterator[StandbyWorld]:
    """The three nodes, no slot running yet: the first standby rollout
    brings its model up in slot ``a`` of each."""
    labelled = labelled_models(models)
    key = make_key(tmp / "keys" / "kit").signing  # for jobs the kit itself signs
    nodes: dict[str, SlotNode] = {}
    with NginxServer(tmp / "files", mirror(tmp / "mirror", labelled)) as files:
        try:
            for name in NODES:
                nodes[name] = SlotNode.create(tmp / "nodes" / name, models, key, files)
            agents = {
                name: {"labels": {"role": "gpu"}, "extra": tuple(node.cli_flags())}
                for name, node in nodes.items()
            }
            fleet = AgentFleet.create(tmp, agents)
            try:
                yield StandbyWorld(fleet, nodes)
            finally:
                fleet.close()
        finally:
            for node in nodes.values():
                node.close()
