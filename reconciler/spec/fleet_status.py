"""``status/fleet.yaml`` (kind ``FleetStatus``, docs/operating.md): what
the fleet watch last decided about every node, as values, and their plain
data (``readers.fleet_reader`` is the one reader of the file).

Pure: plain data in, values out. Deciding a node's state is the engine's
(``engine.fleet``); reading the file from Git is the caller's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reconciler.spec.model import API_VERSION
from reconciler.spec.paths import FLEET_STATUS_NAME, FLEET_STATUS_PATH, fleet_page_path
from reconciler.spec.times import format_time, parse_time

FLEET_KIND = "FleetStatus"
FLEET_PAGE_KIND = "FleetStatusNodes"
# Over this many nodes, the node records move to pages of this size
# (status/fleet/nodes-NNNN.yaml), as a large rollout's do: every file stays
# far under the 1 MiB a YAML file may have, and a change rewrites one page.
FLEET_PAGE_SIZE = 500
# Node states, in the order views show them (docs/operating.md).
FLEET_STATES = ("ok", "offline", "drift", "unverified")


@dataclass(frozen=True)
class DesiredRuntime:
    """What a runtime should run: the target of the newest live rollout that
    ended with the node ``succeeded`` for that runtime."""

    provider: str
    model: str
    profile: str
    rollout: str

    @property
    def text(self) -> str:
        return f"{self.provider}/{self.model}/{self.profile}"


@dataclass(frozen=True)
class FleetRuntime:
    """One runtime of a node as its agent last reported it (``provider`` and
    the rest None: the agent no longer reports a runtime that has a desired
    state), next to its desired state (None: no rollout has set it)."""

    type: str
    provider: str | None
    model: str | None
    profile: str | None
    desired: DesiredRuntime | None = None

    @property
    def text(self) -> str:
        if self.provider is None:
            return "(not reported)"
        return f"{self.provider}/{self.model}/{self.profile}"

    @property
    def differs(self) -> bool:
        """Runs something other than its desired state."""
        d = self.desired
        return d is not None and (self.provider, self.model, self.profile) != (
            d.provider,
            d.model,
            d.profile,
        )


@dataclass(frozen=True)
class FleetNode:
    name: str
    state: str  # one of FLEET_STATES
    since: datetime  # daemon clock: when the node entered ``state``
    runtimes: tuple[FleetRuntime, ...] = ()


@dataclass(frozen=True)
class FleetStatus:
    """Every node the watch has decided, by name order. Equal values mean
    nothing to commit."""

    nodes: tuple[FleetNode, ...] = ()

    def by_name(self) -> dict[str, FleetNode]:
        return {n.name: n for n in self.nodes}

    def counts(self) -> dict[str, int]:
        """Nodes per state, every state present, in ``FLEET_STATES`` order."""
        counts = dict.fromkeys(FLEET_STATES, 0)
        for node in self.nodes:
            counts[node.state] = counts.get(node.state, 0) + 1
        return counts


# --- plain data ---------------------------------------------------------------


def fleet_to_record(fleet: FleetStatus) -> dict[str, Any]:
    """The whole fleet status as one record (``reconciler fleet --format json``)."""
    return {
        "apiVersion": API_VERSION,
        "kind": FLEET_KIND,
        "metadata": {"name": FLEET_STATUS_NAME},
        "nodes": [_node_record(n) for n in fleet.nodes],
    }


def fleet_to_files(fleet: FleetStatus) -> dict[str, dict[str, Any]]:
    """The files of a fleet status, path -> record: ``status/fleet.yaml``
    alone up to ``FLEET_PAGE_SIZE`` nodes; over that, it holds the counts
    and ``nodePages``, and the nodes are in pages of that size."""
    if len(fleet.nodes) <= FLEET_PAGE_SIZE:
        return {FLEET_STATUS_PATH: fleet_to_record(fleet)}
    pages = [
        fleet.nodes[i : i + FLEET_PAGE_SIZE] for i in range(0, len(fleet.nodes), FLEET_PAGE_SIZE)
    ]
    files: dict[str, dict[str, Any]] = {
        FLEET_STATUS_PATH: {
            "apiVersion": API_VERSION,
            "kind": FLEET_KIND,
            "metadata": {"name": FLEET_STATUS_NAME},
            "counts": fleet.counts(),
            "nodePages": len(pages),
            "nodes": [],
        }
    }
    for number, nodes in enumerate(pages, start=1):
        files[fleet_page_path(number)] = {
            "apiVersion": API_VERSION,
            "kind": FLEET_PAGE_KIND,
            "metadata": {"name": FLEET_STATUS_NAME, "page": number},
            "nodes": [_node_record(n) for n in nodes],
        }
    return files


def _node_record(n: FleetNode) -> dict[str, Any]:
    return {
        "name": n.name,
        "state": n.state,
        "since": format_time(n.since),
        "runtimes": [_runtime_record(r) for r in n.runtimes],
    }


def _runtime_record(r: FleetRuntime) -> dict[str, Any]:
    d = r.desired
    return {
        "type": r.type,
        "provider": r.provider,
        "model": r.model,
        "profile": r.profile,
        "desired": None
        if d is None
        else {"provider": d.provider, "model": d.model, "profile": d.profile, "rollout": d.rollout},
    }


def fleet_from_record(
    record: Mapping[str, Any], pages: Sequence[Mapping[str, Any]] = ()
) -> FleetStatus:
    """The value of a record (and its node pages, in order) that passed
    the schema check."""
    return FleetStatus(
        tuple(
            FleetNode(
                name=n["name"],
                state=n["state"],
                since=parse_time(n["since"]),
                runtimes=tuple(
                    FleetRuntime(
                        type=r["type"],
                        provider=r.get("provider"),
                        model=r.get("model"),
                        profile=r.get("profile"),
                        desired=None
                        if r.get("desired") is None
                        else DesiredRuntime(
                            provider=r["desired"]["provider"],
                            model=r["desired"]["model"],
                            profile=r["desired"]["profile"],
                            rollout=r["desired"]["rollout"],
                        ),
                    )
                    for r in n.get("runtimes", ())
                ),
            )
            for part in (record, *pages)
            for n in part.get("nodes", ())
        )
    )


__all__ = [
    "FLEET_STATES",
    "DesiredRuntime",
    "FleetNode",
    "FleetRuntime",
    "FleetStatus",
    "fleet_from_record",
    "fleet_to_files",
    "fleet_to_record",
]
