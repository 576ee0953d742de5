"""The fleet watch's rules (docs/operating.md): what state a node is in
after a sweep of heartbeats, and what each runtime should be running.

Theory of operation. A sweep sees, per node, a heartbeat or no answer (and
since when the node has given none). ``desired_state`` derives each
node's desired runtimes from the rollout statuses the daemon already holds:
the target of the newest live rollout that ended with the node
``succeeded``. ``RULES`` then decides the node's state from four facts;
exactly one row applies to every case (a test enumerates them). ``KEEP``
means the sweep proves nothing new: the recorded state stays (a node that
has just become unreachable is not offline yet). ``next_fleet`` applies the
rules to a whole sweep and returns the new ``FleetStatus``, equal to the
old one when nothing changed, so an idle fleet commits nothing.

Pure: no clock (``now`` is passed in), no I/O. A drift is reported, never
corrected: correcting is a new rollout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from reconciler.protocol.observations import Heartbeat
from reconciler.spec.fleet_status import (
    DesiredRuntime,
    FleetNode,
    FleetRuntime,
    FleetStatus,
)
from reconciler.spec.rollout_status import RolloutStatus

KEEP = "keep"  # not a state: the recorded state stays
REPORTED_LIMIT = 256  # characters kept of what an agent reports


@dataclass(frozen=True)
class NodeFacts:
    """What one sweep established about one node."""

    answered: bool  # a usable heartbeat came back
    unreachable_long: bool  # no answer, for offlineAfter or longer
    verified: bool | None  # the agentKey check (docs/trust.md); None: not checked
    drifted: bool  # some runtime differs from its desired state


@dataclass(frozen=True)
class FleetRule:
    when: str
    applies: Callable[[NodeFacts], bool]
    state: str  # one of FLEET_STATES, or KEEP


# The state table of docs/operating.md. Rows are disjoint: exactly one
# applies to every combination of facts (tests/test_fleet_rules.py).
RULES: tuple[FleetRule, ...] = (
    FleetRule(
        "no answer for offlineAfter or longer",
        lambda f: not f.answered and f.unreachable_long,
        "offline",
    ),
    FleetRule(
        "no answer, for less than offlineAfter: nothing proven yet",
        lambda f: not f.answered and not f.unreachable_long,
        KEEP,
    ),
    FleetRule(
        "an answer that fails the node's agentKey check",
        lambda f: f.answered and f.verified is False,
        "unverified",
    ),
    FleetRule(
        "a believed answer in which a runtime differs from its desired state",
        lambda f: f.answered and f.verified is not False and f.drifted,
        "drift",
    ),
    FleetRule(
        "a believed answer, every runtime as desired or with no desired state",
        lambda f: f.answered and f.verified is not False and not f.drifted,
        "ok",
    ),
)

# Events for notifications (docs/operating.md), by the state that raises them.
FLEET_EVENTS: Mapping[str, str] = {"offline": "node_offline", "drift": "node_drift"}


def decide(facts: NodeFacts) -> str:
    """The state (or ``KEEP``) of the one rule that applies."""
    matching = [rule.state for rule in RULES if rule.applies(facts)]
    if len(matching) != 1:
        raise AssertionError(f"fleet rules: {len(matching)} rules apply to {facts}")
    return matching[0]


# --- desired state ---------------------------------------------------------------


@dataclass(frozen=True)
class DesiredState:
    """Per (node, runtime): the desired target, and the runtimes a live
    rollout that has not ended is changing now (not judged for drift until
    it ends: its job may be on its way)."""

    desired: Mapping[tuple[str, str], DesiredRuntime] = field(default_factory=dict)
    changing: frozenset[tuple[str, str]] = frozenset()


_NOT_STARTED = frozenset({"pending", "skipped"})


def desired_state(statuses: Iterable[RolloutStatus]) -> DesiredState:
    """From the rollout statuses: for each (node, runtime), the target of
    the newest live rollout that ended with that node ``succeeded`` (newest
    by when the node's verdict was recorded, then by the rollout's end,
    then by name). Dry runs change nothing and set nothing."""
    best: dict[tuple[str, str], tuple[tuple[datetime, datetime, str], DesiredRuntime]] = {}
    changing: set[tuple[str, str]] = set()
    floor = datetime.min
    for status in statuses:
        frozen = status.frozen
        if frozen is None or not frozen.live:
            continue
        runtime = frozen.target.runtime
        if not status.terminal:
            changing.update((n.name, runtime) for n in status.nodes if n.state not in _NOT_STARTED)
            continue
        target = frozen.target
        desired = DesiredRuntime(target.provider, target.model, target.profile, status.name)
        ended = _naive(status.finished_at) or floor
        for node in status.nodes:
            if node.state != "succeeded":
                continue
            key = (node.name, runtime)
            rank = (_naive(node.finished_at) or ended, ended, status.name)
            current = best.get(key)
            if current is None or rank > current[0]:
                best[key] = (rank, desired)
    return DesiredState({k: v for k, (_, v) in best.items()}, frozenset(changing))


def _naive(moment: datetime | None) -> datetime | None:
    """Comparable with ``datetime.min``: UTC without the zone."""
    return moment.replace(tzinfo=None) if moment is not None else None


# --- one sweep -------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSighting:
    """What one sweep saw of one node."""

    name: str
    heartbeat: Heartbeat | None  # None: no usable answer
    unreachable_since: datetime | None = None  # first failed contact, while unanswered
    verified: bool | None = None  # the agentKey check of the answer; None: not checked


def _clip(text: str) -> str:
    return text[:REPORTED_LIMIT]


def node_runtimes(
    name: str,
    heartbeat: Heartbeat | None,
    previous: FleetNode | None,
    desired: DesiredState,
) -> tuple[FleetRuntime, ...]:
    """The node's runtimes as reported (or as last recorded, without an
    answer), each with its desired state; a runtime with a desired state
    that the agent does not report is listed as not reported."""
    reported: dict[str, tuple[str | None, str | None, str | None]] = {}
    if heartbeat is not None:
        for r in heartbeat.runtimes:
            reported[_clip(r.type)] = (_clip(r.provider), _clip(r.model), _clip(r.profile))
    elif previous is not None:
        for old in previous.runtimes:
            reported[old.type] = (old.provider, old.model, old.profile)
    for node, runtime in desired.desired:
        if node == name:
            reported.setdefault(runtime, (None, None, None))
    return tuple(
        FleetRuntime(t, *reported[t], desired=desired.desired.get((name, t)))
        for t in sorted(reported)
    )


def next_fleet(
    previous: FleetStatus | None,
    sightings: Iterable[NodeSighting],
    desired: DesiredState,
    offline_after: int,
    now: datetime,
) -> FleetStatus:
    """The fleet status after one sweep. Nodes not swept (gone from
    ``nodes/``) leave it; a node keeps its ``since`` while its state stays.
    When nothing changed, ``previous`` itself is returned, so a caller can
    tell by identity, without comparing every node."""
    old = previous.by_name() if previous is not None else {}
    nodes = decide_nodes(old, sorted(sightings, key=lambda s: s.name), desired, offline_after, now)
    return fleet_of(previous, nodes)


def fleet_of(previous: FleetStatus | None, nodes: Sequence[FleetNode]) -> FleetStatus:
    """``previous`` when ``nodes`` are its very nodes (as ``decide_nodes``
    reuses them), else a new fleet status of ``nodes``."""
    if (
        previous is not None
        and len(nodes) == len(previous.nodes)
        and all(a is b for a, b in zip(nodes, previous.nodes, strict=True))
    ):
        return previous
    return FleetStatus(tuple(nodes))


def decide_nodes(
    old: Mapping[str, FleetNode],
    sightings: Iterable[NodeSighting],
    desired: DesiredState,
    offline_after: int,
    now: datetime,
) -> list[FleetNode]:
    """``RULES`` applied to each sighting, in the order given (by name, for
    a whole fleet status), against the recorded nodes ``old``; a node that
    did not change is the very record of ``old``."""
    nodes: list[FleetNode] = []
    for seen in sightings:
        before = old.get(seen.name)
        runtimes = node_runtimes(seen.name, seen.heartbeat, before, desired)
        since_failed = seen.unreachable_since
        facts = NodeFacts(
            answered=seen.heartbeat is not None,
            unreachable_long=since_failed is not None
            and (now - since_failed).total_seconds() >= offline_after,
            verified=seen.verified,
            drifted=any(
                r.differs and (seen.name, r.type) not in desired.changing for r in runtimes
            ),
        )
        state = decide(facts)
        if state == KEEP:
            if before is None:
                continue  # nothing proven yet about a node never recorded
            state = before.state
        if before is not None and before.state == state:
            if before.runtimes == runtimes:
                nodes.append(before)
                continue
            since = before.since
        else:
            since = since_failed if state == "offline" and since_failed is not None else now
        nodes.append(FleetNode(seen.name, state, since, runtimes))
    return nodes


# --- what changed, for logs, commit messages and notifications ------------------


@dataclass(frozen=True)
class FleetChange:
    node: str
    from_state: str | None  # None: newly listed
    to_state: str | None  # None: left the list
    detail: str = ""  # the runtimes that differ, for a drift


def fleet_changes(previous: FleetStatus | None, current: FleetStatus) -> tuple[FleetChange, ...]:
    """State changes per node, by name (runtime-only changes are not listed)."""
    old = previous.by_name() if previous is not None else {}
    new = current.by_name()
    changes: list[FleetChange] = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a is not None and b is not None and a.state == b.state:
            continue
        changes.append(
            FleetChange(
                name,
                a.state if a else None,
                b.state if b else None,
                drift_text(b) if b is not None and b.state == "drift" else "",
            )
        )
    return tuple(changes)


def drift_text(node: FleetNode) -> str:
    """``hermes runs ollama/x/default, desired vllm/y/serving (rollout r)``."""
    return "; ".join(
        f"{r.type} runs {r.text}, desired {r.desired.text} (rollout {r.desired.rollout})"
        for r in node.runtimes
        if r.differs and r.desired is not None
    )


@dataclass(frozen=True)
class FleetEvent:
    """A fleet event that is true now (docs/operating.md), keyed by (node, state,
    since): the same key on every read of the same status."""

    event: str  # node_offline | node_drift
    node: str
    state: str
    since: datetime
    message: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.node, self.state, self.since.isoformat())


def fleet_events(fleet: FleetStatus | None) -> tuple[FleetEvent, ...]:
    """The events a notifier delivers for this fleet status: one per node
    whose state raises one, in node order. From status alone, so a restarted
    daemon finds the same events with the same keys."""
    if fleet is None:
        return ()
    events: list[FleetEvent] = []
    for node in fleet.nodes:
        event = FLEET_EVENTS.get(node.state)
        if event is None:
            continue
        message = (
            f"{node.name} drifted: {drift_text(node)}"
            if node.state == "drift"
            else f"{node.name} has been unreachable since {node.since.isoformat()}"
        )
        events.append(FleetEvent(event, node.name, node.state, node.since, message))
    return tuple(events)


__all__ = [
    "FLEET_EVENTS",
    "KEEP",
    "RULES",
    "DesiredState",
    "FleetChange",
    "FleetEvent",
    "NodeFacts",
    "NodeSighting",
    "decide",
    "decide_nodes",
    "desired_state",
    "fleet_changes",
    "fleet_events",
    "fleet_of",
    "next_fleet",
]
