"""Why a rollout that has not started waits, and the words its start
records (docs/rollouts.md): pure functions from the spec, the settings,
the fleet and the other rollouts to a (reason, message) wait, or None
when nothing in them holds the start back. The step records what these
return; the order in which it asks them is the rule."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from reconciler.engine.calendar import batch_gate
from reconciler.engine.holds import name_list
from reconciler.engine.selection import maintenance_node_ids, select_nodes, unknown_node_ids
from reconciler.engine.shapes import after_wait
from reconciler.spec import batch_shapes as shapes
from reconciler.spec.batch_shapes import describe_sizes
from reconciler.spec.model import Fleet, Node, Problem, RolloutSpec, Settings
from reconciler.spec.rollout_status import FrozenSpec, RolloutStatus, Waiting
from reconciler.spec.times import format_time, parse_time

# (reason, message) of a rollout that stays pending
Wait = tuple[str, str]

NO_NODES = (
    "the selection matches no node (maintenance nodes are left out unless "
    "includeMaintenance is true)"
)


@dataclass(frozen=True)
class Scheduled:
    """Valid, and waiting for ``startAt`` or for the first batch's window."""

    reason: str
    message: str
    why: str  # the transition's reason
    start_at: datetime | None = None
    waiting: Waiting | None = None


@dataclass(frozen=True)
class Start:
    names: tuple[str, ...]  # the frozen node list


def decide_start(
    spec: RolloutSpec,
    settings: Settings,
    fleet: Fleet,
    now: datetime,
    current: Callable[[], Mapping[str, RolloutStatus]],
    claims: Callable[[tuple[str, ...]], Mapping[str, str]],
) -> Wait | Scheduled | Start:
    """Whether a valid, not aborted spec starts now, in the order the rules
    are asked: why it waits (``spec_wait``), no node selected, ``startAt``
    ahead, the first batch outside the deploy windows, and nodes claimed by
    another rollout (``claims``: node -> rollout, of the names given)."""
    waits = spec_wait(spec, settings, fleet, current)
    if waits is not None:
        return waits
    names = select_nodes_by_index(spec, fleet)
    if not names:
        return "no_nodes", NO_NODES + left_out_words(maintenance_node_ids(spec, fleet))
    if spec.start_at is not None:
        try:
            start_at = parse_time(spec.start_at)
        except ValueError:
            return "invalid", f"startAt is not an RFC 3339 time: {spec.start_at!r}"
        if now < start_at:
            message = f"waiting for startAt {spec.start_at}"
            return Scheduled("start_at", message, "waiting for startAt", start_at=start_at)
    if not spec.ignore_windows and (settings.windows or settings.freezes):
        waiting = batch_gate(settings.windows, settings.freezes, now)
        if waiting is not None:
            # The first batch could not start: wait as scheduled, claiming no node.
            message = waiting_message(waiting)
            return Scheduled(waiting.reason, message, f"waiting: {waiting.reason}", waiting=waiting)
    if not spec.allow_overlap:
        overlap = overlap_wait(names, claims(names))
        if overlap is not None:
            return "overlap", overlap
    return Start(names)


def batch_numbers(
    frozen: FrozenSpec, names: Sequence[str], node: Callable[[str], Node | None]
) -> tuple[int, ...]:
    """The batch of each of the frozen ``names``: consecutive chunks, or
    with ``spreadBy`` spread across the label's values as the nodes carry
    them at start (``node``: a node's file; a node without the label has
    the value "")."""
    if frozen.spread_by is None:
        return shapes.batch_numbers(frozen.batches, frozen.batch_size, len(names))
    label = frozen.spread_by.label
    values = [
        (found.label(label) if (found := node(name)) is not None else None) or "" for name in names
    ]
    return shapes.spread_numbers(
        values, frozen.batches, frozen.batch_size, frozen.spread_by.max_per_batch
    )


def select_nodes_by_index(spec: RolloutSpec, fleet: Fleet) -> tuple[str, ...]:
    """The rollout's node selection, ordered (selector: by name; nodeIds: order kept).

    ``selection.select_nodes`` decides; it is handed only the nodes that can
    match (by a label index of the fleet, or the named nodes), because the
    daemon resolves every rollout not yet started on every pass, and a
    scan of 10,000 nodes each time made a pass starting 1,000 rollouts take
    tens of seconds."""
    index = fleet.index
    if spec.node_ids is not None:
        named = (index.by_name.get(n) for n in dict.fromkeys(spec.node_ids))
        return select_nodes(spec, Fleet(tuple(node for node in named if node is not None)))
    wanted = spec.selector or ()
    if not wanted or not all(isinstance(v, str) for _, v in wanted):
        return select_nodes(spec, fleet)
    # Nodes carrying the rarest wanted label: the only ones that can match.
    candidates = min((index.by_label.get(pair, ()) for pair in wanted), key=len)
    return select_nodes(spec, Fleet(tuple(candidates)))


def unusable(problems: Sequence[Problem], refusal: str | None) -> Wait:
    """Why a present rollout file that gives no spec waits: not verified, or invalid."""
    if refusal is not None and not problems:
        return "unverified", f"not verified: {refusal}"
    words = "; ".join(str(p) for p in problems) or "the rollout file is invalid"
    return "invalid", f"invalid rollout file: {words}"


def spec_wait(
    spec: RolloutSpec,
    settings: Settings,
    fleet: Fleet,
    current: Callable[[], Mapping[str, RolloutStatus]],
) -> Wait | None:
    """Why a valid spec waits before its nodes are resolved: the operator
    pause, prometheus checks without a server, ``after`` rollouts not
    completed (``current``: every rollout's status, read only then), or
    nodeIds naming nodes that do not exist."""
    if spec.paused:
        return "paused", "paused by the operator (spec.paused is true) before start"
    if (
        spec.live
        and spec.health is not None
        and spec.health.prometheus_checks
        and settings.prometheus_url is None
    ):
        return (
            "prometheus_not_configured",
            "its prometheus checks need settings.spec.prometheus.url in reconciler.yaml; "
            "it starts once that is set",
        )
    if spec.after:
        waits = after_wait(spec.after, current())
        if waits is not None:
            return waits
    missing = unknown_node_ids(spec, fleet)
    if missing:
        return (
            "unknown_nodes",
            f"nodeIds names nodes that do not exist: {name_list(missing)}; add their files "
            "under nodes/ or fix the list",
        )
    return None


def overlap_wait(names: Sequence[str], claims: Mapping[str, str]) -> str | None:
    """The overlap message when some of ``names`` are claimed (node -> rollout), or None."""
    shared = [n for n in names if n in claims]
    if not shared:
        return None
    holders = sorted({claims[n] for n in shared})
    return (
        f"waits for rollout {', '.join(holders)}: shares nodes {name_list(shared)}; "
        "it starts when that one ends (or set allowOverlap: true)"
    )


def waiting_message(waiting: Waiting) -> str:
    what = (
        "a freeze in reconciler.yaml"
        if waiting.reason == "freeze"
        else "outside the deploy windows of reconciler.yaml"
    )
    when = (
        f"; the next batch may start at {format_time(waiting.until)}"
        if waiting.until is not None
        else "; no window opens within a week"
    )
    return f"waiting: {what}{when} (ignoreWindows: true exempts a rollout)"


def start_message(spec: RolloutSpec, count: int, sizes: Sequence[int]) -> str:
    """``5 nodes in 3 batches of 2, dry-run, onFailure pause``."""
    even = not spec.batches and spec.spread_by is None
    shape = f"of {spec.batch_size}" if even else f"of {describe_sizes(sizes)}"
    batches = len(sizes)
    return (
        f"{count} node{'s' if count != 1 else ''} in {batches} "
        f"batch{'es' if batches != 1 else ''} {shape}"
        + capacity_words(spec)
        + f", {'live' if spec.live else 'dry-run'}, onFailure {spec.on_failure}"
    )


def capacity_words(spec: RolloutSpec) -> str:
    """`` spread by zone (at most 1 per batch)`` and `` with failureBudget 1``."""
    words = ""
    if spec.spread_by is not None:
        words += (
            f" spread by {spec.spread_by.label} (at most {spec.spread_by.max_per_batch} "
            "per value in a batch)"
        )
    if spec.failure_budget is not None:
        words += f", failureBudget {spec.failure_budget}"
    return words


def left_out_words(left_out: Sequence[str]) -> str:
    """``; left out of nodeIds: gpu-b5 (in maintenance...)``: nodeIds the
    selection dropped, so nobody wonders where a named node went."""
    if not left_out:
        return ""
    them = "it" if len(left_out) == 1 else "them"
    return (
        f"; left out of nodeIds: {name_list(left_out)} (in maintenance; set "
        f"includeMaintenance: true to include {them})"
    )
