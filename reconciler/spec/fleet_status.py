"""``status/fleet.yaml`` (kind ``FleetStatus``, DESIGN.md section 14): what
the fleet watch last decided about every node, as values, and their plain
data (``views.fleet_reader`` is the one reader of the file).

Pure: plain data in, values out. Deciding a node's state is the engine's
(``engine.fleet``); reading the file from Git is the caller's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reconciler.spec.model import API_VERSION
from reconciler.spec.paths import FLEET_STATUS_NAME
from reconciler.spec.times import format_time, parse_time

FLEET_KIND = "FleetStatus"
# Node states, in the order views show them (DESIGN.md section 14).
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
    return {
        "apiVersion": API_VERSION,
        "kind": FLEET_KIND,
        "metadata": {"name": FLEET_STATUS_NAME},
        "nodes": [
            {
                "name": n.name,
                "state": n.state,
                "since": format_time(n.since),
                "runtimes": [_runtime_record(r) for r in n.runtimes],
            }
            for n in fleet.nodes
        ],
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


def fleet_from_record(record: Mapping[str, Any]) -> FleetStatus:
    """The value of a record that passed the schema check."""
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
            for n in record.get("nodes", ())
        )
    )


__all__ = [
    "FLEET_STATES",
    "DesiredRuntime",
    "FleetNode",
    "FleetRuntime",
    "FleetStatus",
    "fleet_from_record",
    "fleet_to_record",
]
