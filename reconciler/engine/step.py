"""The rollout engine: a pure stepper (docs/rollouts.md).

Theory of operation. ``step_fleet`` takes every rollout's spec and recorded
status, the fleet, what the daemon observed, and one ``now``; it returns the
statuses that changed, the jobs to send once those are committed, and the
transitions for the commit message. Nothing else: the daemon commits the
statuses and only then sends the jobs (docs/architecture.md).

One rollout's step runs in a fixed order, and repeats its last part until
nothing more changes, so one pass takes a rollout as far as its inputs allow:

1. intents that end or freeze it: file removed, ``abort``; frozen fields
   edited (a condition), ``healthTimeout``, ``paused``;
2. evidence: verdicts of in-flight applies and restores (always, even when
   paused or aborted: jobs already recorded are still observed);
3. an explicit ``rollbackRequest``;
4. decisions, only when running and not operator-paused: ``skipNodes``, the
   failure policy on new verdicts (``reconciler.engine.policy``), ``resumeRequest``,
   then the next batch;
5. the hold and the phase.

Every phase and node-state change is checked against ``reconciler.engine.lifecycle``.
Status never goes backwards: terminal phases stay, attempts only grow, and a
verdict belongs to its attempt and is never rewritten.

Must not: read the clock, touch Git, HTTP, files or randomness, or log.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any

from reconciler.engine import evidence, intents, lifecycle, rollback
from reconciler.engine.calendar import batch_gate
from reconciler.engine.holds import (
    RESTORE_STATES,
    VERDICT_STATES,
    hold_message,
    name_list,
)
from reconciler.engine.memo import StepMemo, fleet_index
from reconciler.engine.policy import decide
from reconciler.engine.records import evolve
from reconciler.engine.rollback import restore_waiting
from reconciler.engine.selection import maintenance_node_ids, unknown_node_ids
from reconciler.engine.selection import resolve_nodes as _resolve
from reconciler.engine.shapes import after_wait, timed_pause_until
from reconciler.protocol.effects import SendJob
from reconciler.protocol.job_ids import job_id
from reconciler.protocol.observations import JobObservation, Observations
from reconciler.spec import agent_url
from reconciler.spec.agent_url import is_usable_agent_url
from reconciler.spec.batch_shapes import describe_sizes
from reconciler.spec.health import HealthCheck
from reconciler.spec.model import Fleet, Node, Problem, RolloutSpec, Settings
from reconciler.spec.rollout_status import (
    HOLD_NODES_SHOWN,
    NODE_STATES,
    TRANSITIONS_KEPT,
    ApprovalRecord,
    BatchRecord,
    CheckOutcome,
    Condition,
    FrozenSpec,
    Hold,
    NodeRecord,
    RestoreRecord,
    RolloutStatus,
    TransitionRecord,
    Waiting,
)
from reconciler.spec.times import format_time, parse_time

__all__ = [
    "FleetStep",
    "RolloutInput",
    "StepMemo",
    "Transition",
    "in_flight",
    "is_active",
    "next_wakeup",
    "resolve_nodes",
    "step_fleet",
    "waits_for_a_person",
    "wanted_backups",
    "wanted_heartbeats",
    "wanted_metric_checks",
]


@dataclass(frozen=True)
class RolloutInput:
    name: str
    spec: RolloutSpec | None  # None: file removed, or present but invalid
    file_present: bool
    problems: tuple[Problem, ...]  # why a present file is unusable (phase pending)
    status: RolloutStatus | None  # recorded status; None if it has no status file yet
    spec_commit: str  # newest commit that changed the file, its node files or reconciler.yaml
    first_seen_commit: str  # first-parent commit that added the file
    queue_key: int  # order of first_seen_commit in first-parent history, oldest smallest
    author: str = ""  # author of spec_commit ("Name <email>"), recorded with rollback requests
    refusal: str | None = None  # the newest spec change was not verified (docs/trust.md)
    # approvals of the verified commit acted on, under --require-approvals (docs/trust.md)
    approved_by: tuple[ApprovalRecord, ...] = ()


@dataclass(frozen=True)
class Transition:
    rollout: str
    node: str | None  # None: the rollout's phase
    from_state: str
    to_state: str
    reason: str


@dataclass(frozen=True)
class FleetStep:
    statuses: Mapping[str, RolloutStatus] = field(default_factory=dict)  # changed only
    effects: tuple[SendJob, ...] = ()  # jobs recorded in this step, to send after the commit
    transitions: tuple[Transition, ...] = ()  # for the commit message and logs


# The spec fields frozen at start, with their document names.
FROZEN_FIELDS = (
    ("target", "target"),
    ("selector", "selector"),
    ("node_ids", "nodeIds"),
    ("batch_size", "batchSize"),
    ("live", "live"),
    ("on_failure", "onFailure"),
    ("start_at", "startAt"),
    ("include_maintenance", "includeMaintenance"),
    ("allow_overlap", "allowOverlap"),
    ("health", "health"),
    ("batches", "batches"),
    ("ignore_windows", "ignoreWindows"),
)


def resolve_nodes(spec: RolloutSpec, fleet: Fleet) -> tuple[str, ...]:
    """The rollout's node selection, ordered (selector: by name; nodeIds: order kept).

    ``selection.resolve_nodes`` decides; it is handed only the nodes that can
    match (by a label index of the fleet, or the named nodes), because the
    daemon resolves every rollout not yet started on every pass, and a
    scan of 10,000 nodes each time made a pass starting 1,000 rollouts take
    tens of seconds."""
    index = fleet_index(fleet)
    if spec.node_ids is not None:
        named = (index.by_name.get(n) for n in dict.fromkeys(spec.node_ids))
        return _resolve(spec, Fleet(tuple(node for node in named if node is not None)))
    wanted = spec.selector or ()
    if not wanted or not all(isinstance(v, str) for _, v in wanted):
        return _resolve(spec, fleet)
    # Nodes carrying the rarest wanted label: the only ones that can match.
    candidates = min((index.by_label.get(pair, ()) for pair in wanted), key=len)
    return _resolve(spec, Fleet(tuple(candidates)))


# --- the pass ------------------------------------------------------------------


class _Pass:
    """What every rollout's step shares in one pass: the same ``now``, the
    fleet, the observations, and every rollout's status as it stands."""

    def __init__(
        self, fleet: Fleet, settings: Settings, observations: Observations, now: datetime
    ) -> None:
        self.fleet = fleet
        self.settings = settings
        self.obs = observations
        self.now = now
        self.offline_after = timedelta(seconds=settings.offline_after)
        self._current: dict[str, RolloutStatus] = {}  # written only through set_current
        self.version = 0  # counts changes to ``current``
        self.reads = 0  # counts reads of other rollouts' statuses (``current``, ``claims``)
        self._fleet_by_name: dict[str, Node] | None = None
        # Who claims which node, kept up to date once first asked for, so
        # that each of 1,000 starts in one pass does not walk every status.
        self._position: dict[str, int] = {}  # rollout -> order in ``current``
        self._next_position = 0  # after every position given
        self._holders: dict[str, set[str]] | None = None  # node -> rollouts claiming it
        self._claimed: dict[str, tuple[str, ...]] = {}  # rollout -> nodes it claims
        self.unreadable: dict[str, Sequence[str]] = {}  # rollout -> nodes it may hold
        # The rollouts that may claim nodes (None: every one in ``current``);
        # those at rest since an earlier pass claim none.
        self._claimants: Iterable[str] | None = None

    @property
    def current(self) -> dict[str, RolloutStatus]:
        """Every rollout's status as it stands. A step that reads it depends
        on the other rollouts (``step_fleet`` counts such reads)."""
        self.reads += 1
        return self._current

    def node(self, name: str) -> Node | None:
        if self._fleet_by_name is None:
            # Built once per fleet, not once per pass (memo.fleet_index).
            self._fleet_by_name = fleet_index(self.fleet).by_name
        return self._fleet_by_name.get(name)

    def seed(self, order: Sequence[RolloutInput], resting: set[str]) -> None:
        """Every recorded status, in ``order`` (which is the order ``claims``
        prefers holders in); ``resting`` rollouts claim no node."""
        self._current = {inp.name: inp.status for inp in order if inp.status is not None}
        self._position = {name: i for i, name in enumerate(self._current)}
        self._next_position = len(self._position)
        if resting:
            self._claimants = [name for name in self._current if name not in resting]

    def seed_kept(
        self,
        current: dict[str, RolloutStatus],
        position: dict[str, int],
        next_position: int,
        claimants: Iterable[str],
    ) -> None:
        """The seed kept by a ``StepMemo``: the same statuses in the same
        order as ``seed`` gives (positions may leave gaps: only their order
        counts); ``claimants``: the rollouts not at rest."""
        self._current = current
        self._position = position
        self._next_position = next_position
        self._claimants = claimants

    def set_current(self, name: str, status: RolloutStatus) -> None:
        old = self._current.get(name)
        if name not in self._position:
            self._position[name] = self._next_position
            self._next_position += 1
        self._current[name] = status
        if status is not old:
            self.version += 1
            if self._holders is not None:
                self._index_claims(name, status)

    def claims(self, names: Iterable[str], exclude: str) -> dict[str, str]:
        """node -> rollout, for each of ``names`` that a running or paused
        rollout holds, or any rollout is restoring (other than ``exclude``);
        of several, the first in ``current``. A rollout whose status cannot
        be read holds every node it may hold."""
        self.reads += 1
        if self._holders is None:
            self._holders = {}
            current = self._current
            for rollout in current if self._claimants is None else self._claimants:
                status = current.get(rollout)
                if status is not None:
                    self._index_claims(rollout, status)
            for rollout, nodes in self.unreadable.items():
                if rollout not in self._position:
                    self._position[rollout] = self._next_position
                    self._next_position += 1
                for node in nodes:
                    self._holders.setdefault(node, set()).add(rollout)
        claimed: dict[str, str] = {}
        for node in names:
            holders = self._holders.get(node)
            if holders:
                first = min(
                    (h for h in holders if h != exclude),
                    key=self._position.__getitem__,
                    default=None,
                )
                if first is not None:
                    claimed[node] = first
        return claimed

    def _index_claims(self, rollout: str, status: RolloutStatus) -> None:
        assert self._holders is not None
        if status.phase in ("running", "paused"):
            nodes = tuple(node.name for node in status.nodes)
        elif _restores_in_flight(status):
            nodes = tuple(node.name for node in status.nodes if node.state in RESTORE_STATES)
        else:
            nodes = ()
        old = self._claimed.get(rollout, ())
        if old == nodes:
            return
        for node in old:
            self._holders[node].discard(rollout)
        for node in nodes:
            self._holders.setdefault(node, set()).add(rollout)
        self._claimed[rollout] = nodes


_INDEPENDENT = -1  # settled whatever the other rollouts do (ctx.version is never negative)


_queue_order = attrgetter("queue_key", "name")


def _may_rest(inp: RolloutInput) -> bool:
    """A terminal rollout whose step reads nothing but its input and status,
    and which claims no node (so ``claims`` need not look at it)."""
    status = inp.status
    if status is None or not status.terminal or is_active(status):
        return False
    if _restores_in_flight(status):
        return False
    request = inp.spec.rollback_request if inp.spec is not None else None
    return request is None or any(
        r.id == request.id and r.state != "waiting" for r in status.rollbacks
    )


def step_fleet(
    rollouts: Collection[RolloutInput],
    fleet: Fleet,
    settings: Settings,
    observations: Observations,
    now: datetime,
    *,
    unreadable: Mapping[str, Sequence[str]] | None = None,
    memo: StepMemo | None = None,
    changed: Mapping[str, RolloutInput | None] | None = None,
) -> FleetStep:
    """Step every rollout to a fixed point with one ``now``.

    ``unreadable``: rollouts whose status cannot be read (not stepped), with
    the nodes each may hold; no other rollout starts on those nodes unless
    it allows overlap, since what they hold is unknown.

    ``changed`` (with ``memo``): the inputs that differ from those of the
    last call with this memo, by name (None: no longer there); every other
    input is the same object as then. The memo's seed is then brought up to
    date instead of built from every input (tests pin the result against
    the plain step).

    Started and terminal rollouts go first (intents and terminations), then
    the rest in queue order (``queue_key``, then name), so a rollout freed by
    an abort in this pass starts in this pass, and each start sees the nodes
    claimed by the ones before it. Rollouts see each other (overlaps, nodes
    changed since), so the round repeats until no status changes: stepping
    again with the same inputs then changes nothing.
    """
    ctx = _Pass(fleet, settings, observations, now)
    ctx.unreadable = dict(unreadable or {})
    seeded = (
        memo.seed_changed(changed, fleet, settings)
        if memo is not None and changed is not None
        else None
    )
    if seeded is not None:
        # Only these are stepped: most rollouts of a large repository are
        # finished and at rest, and a pass must not cost what exists.
        current, position, next_position, stepped = seeded
        ctx.seed_kept(current, position, next_position, [inp.name for inp in stepped])
    else:
        order = sorted(rollouts, key=_queue_order)
        # At rest since an earlier pass: not stepped, and claiming no node.
        resting = memo.resting(order, fleet, settings) if memo is not None else set()
        ctx.seed(order, resting)
        if memo is not None:
            memo.keep_seed(order, ctx._current, resting)
        stepped = [inp for inp in order if inp.name not in resting] if resting else order
    effects: list[SendJob] = []
    transitions: list[Transition] = []
    # Rollouts whose last step changed nothing and sent nothing. A step reads
    # only its own input and status, values fixed for the pass, and (counted
    # in ctx.reads) the other rollouts' statuses; stepping such a rollout
    # again gives the same result as long as it read no other rollout
    # (INDEPENDENT), or none has changed since (ctx.version then). So later
    # rounds pass over it: most rollouts of a large repository are finished.
    settled: dict[str, int] = {}

    def run(inp: RolloutInput) -> bool:
        mark = settled.get(inp.name)
        if mark is not None and (mark == _INDEPENDENT or mark == ctx.version):
            return False
        before = ctx._current.get(inp.name)
        reads = ctx.reads
        step = RolloutStep(inp, before, ctx)
        new = step.run()
        independent = ctx.reads == reads
        ctx.set_current(inp.name, new)
        effects.extend(step.effects)
        transitions.extend(step.transitions)
        if before is not None and new is before and not step.effects and not step.transitions:
            settled[inp.name] = _INDEPENDENT if independent else ctx.version
        else:
            settled.pop(inp.name, None)
        return before is None or new is not before

    # Each round can only move rollouts forward; a bound keeps a bug from looping.
    for _ in range(len(rollouts) + 2):
        progressed = False
        current = ctx._current
        ahead = {
            inp.name
            for inp in stepped
            if (s := current.get(inp.name)) is not None and (s.started or s.terminal)
        }
        for inp in stepped:
            if inp.name in ahead:
                progressed |= run(inp)
        for inp in stepped:
            if inp.name not in ahead:
                progressed |= run(inp)
        if not progressed:
            break
    # Rollouts at rest kept their status (the same object): none changed.
    new_statuses = {
        inp.name: ctx._current[inp.name]
        for inp in stepped
        if inp.status is None
        or (ctx._current[inp.name] is not inp.status and ctx._current[inp.name] != inp.status)
    }
    if memo is not None:
        memo.remember(
            fleet,
            settings,
            (
                inp
                for inp in stepped
                if settled.get(inp.name) == _INDEPENDENT
                and ctx._current[inp.name] is inp.status
                and _may_rest(inp)
            ),
        )
    return FleetStep(statuses=new_statuses, effects=tuple(effects), transitions=tuple(transitions))


# --- one rollout's step ------------------------------------------------------------


class RolloutStep:
    """Working copy of one rollout's status during one step. Node records are
    copied only when the first one changes, and only the batches a step
    touches are re-examined, so an idle step on a large rollout costs about
    the size of its running batch."""

    def __init__(self, inp: RolloutInput, status: RolloutStatus | None, ctx: _Pass) -> None:
        self.inp = inp
        self.ctx = ctx
        self.now = ctx.now
        self.old = status or RolloutStatus(
            name=inp.name, spec_commit=inp.spec_commit, first_seen_commit=inp.first_seen_commit
        )
        self.is_new = status is None
        s = self.old
        self.phase = s.phase
        self.reason = s.reason
        self.message = s.message
        self.hold = s.hold
        self.waiting = s.waiting
        self.operator_paused = s.operator_paused
        self.spec_commit = s.spec_commit
        self.approved_by = s.approved_by
        self.start_commit = s.start_commit
        self.first_seen_commit = s.first_seen_commit
        self.scheduled_for = s.scheduled_for
        self.health_timeout = s.health_timeout
        self.frozen = s.frozen
        self.started_at = s.started_at
        self.finished_at = s.finished_at
        self.last_handled_resume = s.last_handled_resume
        self.rollbacks = s.rollbacks
        self.conditions = s.conditions
        self.status_transitions = s.transitions
        self._nodes: list[NodeRecord] | None = None  # copy on first write
        self._batches: list[BatchRecord] | None = None
        self._progress: dict[str, int] | None = None
        self._index: dict[str, int] | None = None
        self.touched_batches: set[int] = set()
        self.effects: list[SendJob] = []
        self.transitions: list[Transition] = []

    # -- small accessors

    @property
    def nodes(self) -> Sequence[NodeRecord]:
        return self._nodes if self._nodes is not None else self.old.nodes

    @property
    def batches(self) -> Sequence[BatchRecord]:
        return self._batches if self._batches is not None else self.old.batches

    @property
    def spec(self) -> RolloutSpec | None:
        return self.inp.spec

    @property
    def policy(self) -> str:
        assert self.frozen is not None
        return self.frozen.on_failure

    def progress(self, state: str) -> int:
        if self._progress is not None:
            return self._progress.get(state, 0)
        return dict(self.old.progress).get(state, 0)

    def index(self, name: str) -> int | None:
        if self._index is None:
            self._index = {n.name: i for i, n in enumerate(self.nodes)}
        return self._index.get(name)

    def batch_range(self, batch: int) -> range:
        assert self.frozen is not None
        starts = self.frozen.batch_starts(len(self.nodes))
        return range(starts[batch - 1], starts[batch])

    def open_indexes(self) -> Iterable[int]:
        """Indexes of nodes that may have a job in flight or be held: those
        of batches not done, plus any node being restored."""
        for b in self.batches:
            if b.state == "running":
                yield from self.batch_range(b.index)
        if self.progress("rollback_pending") or self.progress("restoring"):
            for i, node in enumerate(self.nodes):
                if node.state in RESTORE_STATES and self.batches[node.batch - 1].state != "running":
                    yield i

    def set_node(self, i: int, new: NodeRecord, reason: str) -> None:
        old = self.nodes[i]
        if old.__dict__ == new.__dict__:
            return
        if self._nodes is None:
            self._nodes = list(self.old.nodes)
            self._progress = dict(self.old.progress)
        assert self._progress is not None
        lifecycle.check_node(self.inp.name, old.name, old.state, new.state)
        if new.attempt < old.attempt:
            raise lifecycle.IllegalTransition(f"{old.name}: attempt would go backwards")
        if old.state != new.state:
            self._progress[old.state] -= 1
            if not self._progress[old.state]:
                del self._progress[old.state]
            self._progress[new.state] = self._progress.get(new.state, 0) + 1
            self.transitions.append(
                Transition(self.inp.name, old.name, old.state, new.state, reason)
            )
        self._nodes[i] = new
        self.touched_batches.add(new.batch)

    def set_batch(self, index: int, state: str) -> None:
        if self._batches is None:
            self._batches = list(self.old.batches)
        if self._batches[index - 1].state != state:
            self._batches[index - 1] = BatchRecord(index, state)

    def set_phase(self, phase: str, reason: str) -> None:
        if phase == self.phase:
            return
        lifecycle.check_phase(self.inp.name, self.phase, phase)
        self.transitions.append(Transition(self.inp.name, None, self.phase, phase, reason))
        record = TransitionRecord(self.now, self.phase, phase, reason, self.inp.spec_commit)
        self.status_transitions = (*self.status_transitions, record)[-TRANSITIONS_KEPT:]
        self.phase = phase

    def set_condition(self, type_: str, message: str | None) -> None:
        """Add, change or (message None) remove the condition of this type."""
        current = next((c for c in self.conditions if c.type == type_), None)
        if message is None:
            if current is not None:
                self.conditions = tuple(c for c in self.conditions if c.type != type_)
            return
        if current is not None and current.message == message:
            return
        others = tuple(c for c in self.conditions if c.type != type_)
        self.conditions = (*others, Condition(type_, message, self.now))

    def deadline(self) -> datetime:
        assert self.health_timeout is not None
        return self.now + timedelta(seconds=self.health_timeout)

    def soak(self) -> int:
        """Seconds an apply's deadline gains for the soak (docs/health.md)."""
        f = self.frozen
        return f.health.soak if f is not None and f.live and f.health is not None else 0

    # -- the step

    def run(self) -> RolloutStatus:
        if self.old.terminal:
            self.terminal_step()
        elif not self.old.started:
            if self.pre_start():
                self.started_step()
            elif self.phase_terminal():
                self.terminal_step()  # aborted before start
        else:
            self.started_step()
        return self.build()

    def build(self) -> RolloutStatus:
        nodes = self.old.nodes if self._nodes is None else tuple(self._nodes)
        progress = self.old.progress
        if self._progress is not None:
            progress = tuple((s, self._progress[s]) for s in NODE_STATES if self._progress.get(s))
        batches = self.old.batches if self._batches is None else tuple(self._batches)
        values: dict[str, Any] = {
            "phase": self.phase,
            "reason": self.reason,
            "message": self.message,
            "hold": self.hold,
            "waiting": self.waiting,
            "operator_paused": self.operator_paused,
            "spec_commit": self.spec_commit,
            "approved_by": self.approved_by,
            "start_commit": self.start_commit,
            "first_seen_commit": self.first_seen_commit,
            "scheduled_for": self.scheduled_for,
            "health_timeout": self.health_timeout,
            "frozen": self.frozen,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "progress": progress,
            "batches": batches,
            "nodes": nodes,
            "last_handled_resume": self.last_handled_resume,
            "rollbacks": self.rollbacks,
            "conditions": self.conditions,
            "transitions": self.status_transitions,
        }
        if all(getattr(self.old, k) is v or getattr(self.old, k) == v for k, v in values.items()):
            return self.old
        return replace(self.old, **values)

    def note_approvals(self) -> None:
        """Record who approved the spec commit acted on: before start, as it
        is now; after start, only when the rollout's spec commit changes, so
        a newer approval of another change rewrites no running status
        (docs/trust.md)."""
        inp = self.inp
        if (
            inp.approved_by
            and inp.spec is not None
            and (not self.old.started or inp.spec_commit != self.old.spec_commit)
        ):
            self.approved_by = inp.approved_by

    # -- before start

    def pre_start(self) -> bool:
        """Pending or scheduled: say why, or start. True when started."""
        inp, spec = self.inp, self.inp.spec
        self.note_approvals()
        self.spec_commit = inp.spec_commit
        self.first_seen_commit = inp.first_seen_commit
        self.scheduled_for = None
        self.waiting = None
        self.set_condition("unverified", inp.refusal)
        if spec is None:
            if not inp.file_present:
                self.finish("aborted", "spec_removed", "the rollout file was removed before start")
                return False
            if inp.refusal is not None and not inp.problems:
                return self.wait("unverified", f"not verified: {inp.refusal}")
            problems = "; ".join(str(p) for p in inp.problems) or "the rollout file is invalid"
            return self.wait("invalid", f"invalid rollout file: {problems}")
        if spec.abort:
            self.finish("aborted", "aborted", "aborted by the operator before start")
            return False
        if spec.paused:
            return self.wait("paused", "paused by the operator (spec.paused is true) before start")
        if (
            spec.live
            and spec.health is not None
            and spec.health.prometheus_checks
            and self.ctx.settings.prometheus_url is None
        ):
            return self.wait(
                "prometheus_not_configured",
                "its prometheus checks need settings.spec.prometheus.url in reconciler.yaml; "
                "it starts once that is set",
            )
        if spec.after:
            waits = after_wait(spec.after, self.ctx.current)
            if waits is not None:
                return self.wait(*waits)
        missing = unknown_node_ids(spec, self.ctx.fleet)
        if missing:
            return self.wait(
                "unknown_nodes",
                f"nodeIds names nodes that do not exist: {name_list(missing)}; add their files "
                "under nodes/ or fix the list",
            )
        names = resolve_nodes(spec, self.ctx.fleet)
        if not names:
            return self.wait(
                "no_nodes",
                "the selection matches no node (maintenance nodes are left out unless "
                "includeMaintenance is true)" + self.left_out_words(spec),
            )
        if spec.start_at is not None:
            try:
                start_at = parse_time(spec.start_at)
            except ValueError:
                return self.wait("invalid", f"startAt is not an RFC 3339 time: {spec.start_at!r}")
            if self.now < start_at:
                self.scheduled_for = start_at
                self.reason = "start_at"
                self.message = f"waiting for startAt {spec.start_at}"
                self.set_phase("scheduled", "waiting for startAt")
                return False
        self.waiting = self.batch_gate(spec.ignore_windows)
        if self.waiting is not None:
            # The first batch could not start: wait as scheduled, claiming no node.
            self.reason = self.waiting.reason
            self.message = self.waiting_message(self.waiting)
            self.set_phase("scheduled", f"waiting: {self.waiting.reason}")
            return False
        if not spec.allow_overlap:
            claims = self.ctx.claims(names, exclude=inp.name)
            shared = [n for n in names if n in claims]
            if shared:
                holders = sorted({claims[n] for n in shared})
                return self.wait(
                    "overlap",
                    f"waits for rollout {', '.join(holders)}: shares nodes {name_list(shared)}; "
                    "it starts when that one ends (or set allowOverlap: true)",
                )
        self.start(spec, names)
        return True

    def batch_gate(self, ignore_windows: bool) -> Waiting | None:
        """Why no batch may start now (deploy windows, freezes), or None."""
        if ignore_windows:
            return None
        settings = self.ctx.settings
        if not settings.windows and not settings.freezes:
            return None
        waiting = batch_gate(settings.windows, settings.freezes, self.now)
        # An unchanged wait keeps its value, so an idle pass writes nothing.
        return self.waiting if waiting == self.waiting else waiting

    def waiting_message(self, waiting: Waiting) -> str:
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

    def wait(self, reason: str, message: str) -> bool:
        self.waiting = None
        self.reason = reason
        self.message = message
        self.set_phase("pending", reason)
        return False

    def start(self, spec: RolloutSpec, names: tuple[str, ...]) -> None:
        size = spec.batch_size
        self.frozen = FrozenSpec(
            target=spec.target,
            batch_size=size,
            batches=spec.batches,
            ignore_windows=spec.ignore_windows,
            live=spec.live,
            on_failure=spec.on_failure,
            selector=spec.selector,
            node_ids=spec.node_ids,
            start_at=spec.start_at,
            include_maintenance=spec.include_maintenance,
            allow_overlap=spec.allow_overlap,
            health=spec.health,
        )
        sizes = self.frozen.batch_sizes(len(names))
        numbers = [k for k, n in enumerate(sizes, start=1) for _ in range(n)]
        nodes = [NodeRecord(name=n, batch=numbers[i]) for i, n in enumerate(names)]
        count = len(sizes)
        self._nodes = nodes
        self._progress = {"pending": len(nodes)}
        self._batches = [BatchRecord(k, "pending") for k in range(1, count + 1)]
        self.start_commit = self.inp.spec_commit
        self.started_at = self.now
        self.health_timeout = spec.health_timeout
        # A resume token present at start answers no hold: only a new value does.
        self.last_handled_resume = spec.resume_request
        self.reason = ""
        shape = f"of {size}" if not spec.batches else f"of {describe_sizes(sizes)}"
        self.message = (
            f"{len(nodes)} node{'s' if len(nodes) != 1 else ''} in {count} "
            f"batch{'es' if count != 1 else ''} {shape}, "
            f"{'live' if spec.live else 'dry-run'}, onFailure {spec.on_failure}"
        ) + self.left_out_words(spec)
        self.set_phase("running", "started")

    def left_out_words(self, spec: RolloutSpec) -> str:
        """``; left out: gpu-b5 (in maintenance)...``: nodeIds the selection
        dropped, so nobody wonders where a named node went."""
        left_out = maintenance_node_ids(spec, self.ctx.fleet)
        if not left_out:
            return ""
        them = "it" if len(left_out) == 1 else "them"
        return (
            f"; left out of nodeIds: {name_list(left_out)} (in maintenance; set "
            f"includeMaintenance: true to include {them})"
        )

    # -- after start

    def started_step(self) -> None:
        inp, spec = self.inp, self.inp.spec
        self.note_approvals()
        self.spec_commit = inp.spec_commit
        self.waiting = None  # set again below while a due batch waits for a window
        self.set_condition("unverified", inp.refusal)
        if spec is None and not inp.file_present:
            self.abort("spec_removed", "the rollout file was removed")
        elif spec is not None and spec.abort:
            self.abort("aborted", "aborted by the operator")
        if spec is None:
            problems = "; ".join(str(p) for p in inp.problems) or "the rollout file is invalid"
            self.set_condition(
                "invalid_spec",
                None
                if not inp.file_present
                else f"{problems}; nothing new is decided until the file is valid again",
            )
        else:
            self.set_condition("invalid_spec", None)
            self.check_frozen(spec)
            self.health_timeout = spec.health_timeout
            if not self.phase_terminal():
                self.operator_paused = spec.paused
        self.observe()
        self.health_conditions()
        if self.phase_terminal():
            self.carry_out_decided_restores()
            rollback.handle_request(self)
            self.close_terminal()
            return
        rollback.handle_request(self)
        if spec is not None and not spec.paused:
            intents.skip_nodes(self, spec)
            for _ in range(len(self.batches) + 3):
                progressed = self.decide_verdicts()
                progressed |= intents.handle_resume(self, spec)
                progressed |= self.advance(spec)
                if not progressed:
                    break
        self.settle_hold()

    def terminal_step(self) -> None:
        """Terminal: only evidence for jobs still in flight, restores already
        decided, and explicit rollback requests."""
        self.observe()
        self.carry_out_decided_restores()
        if self.inp.spec is not None and self.old.started:
            rollback.handle_request(self)
        elif self.inp.spec is not None and self.inp.spec.rollback_request is not None:
            rollback.refuse_request(self, "the rollout never started: nothing to roll back")
        self.close_terminal()

    def phase_terminal(self) -> bool:
        return self.phase in ("completed", "failed", "aborted")

    def abort(self, reason: str, message: str) -> None:
        self.finish("aborted", reason, message)

    def finish(self, phase: str, reason: str, message: str) -> None:
        self.reason = reason
        self.message = message
        self.hold = None
        self.waiting = None
        self.operator_paused = False
        self.finished_at = self.now
        self.set_phase(phase, reason)

    def close_terminal(self) -> None:
        """A terminal rollout holds nothing: outcomes of restores and jobs
        that finish after the end are recorded without a hold."""
        for i in list(self.open_indexes()):
            node = self.nodes[i]
            if node.held is not None and not restore_waiting(node):
                self.set_node(i, evolve(node, held=None), "rollout ended")
        self.update_batches()

    def check_frozen(self, spec: RolloutSpec) -> None:
        assert self.frozen is not None
        f = self.frozen
        now_values = {
            "target": spec.target,
            "selector": spec.selector,
            "node_ids": spec.node_ids,
            "batch_size": spec.batch_size,
            "live": spec.live,
            "on_failure": spec.on_failure,
            "start_at": spec.start_at,
            "include_maintenance": spec.include_maintenance,
            "allow_overlap": spec.allow_overlap,
            "health": spec.health,
            "batches": spec.batches,
            "ignore_windows": spec.ignore_windows,
        }
        changed = [doc for attr, doc in FROZEN_FIELDS if getattr(f, attr) != now_values[attr]]
        self.set_condition(
            "frozen_fields_changed",
            None
            if not changed
            else (
                f"changed after start and not applied: {', '.join(changed)}; the rollout "
                "carries on with the values frozen at start (start a new rollout to use them)"
            ),
        )

    # -- evidence

    def observe(self) -> None:
        """Record verdicts for in-flight applies and outcomes of restores."""
        seen: evidence.Seen | None = None
        in_flight = list(self.open_indexes())
        for i in in_flight:
            node = self.nodes[i]
            if node.state == "dispatched":
                if seen is None:
                    seen = self.seen()
                judged = evidence.judge_apply(node, seen, self.ctx.node(node.name) is not None)
                if judged is not None:
                    self.record_verdict(i, *judged)
            elif node.state in RESTORE_STATES and node.restore is not None:
                self.record_restore(i, node, node.restore)
        if in_flight:
            self.report_unverified([self.nodes[i].name for i in in_flight])

    def report_unverified(self, asked: list[str]) -> None:
        """Name, in a condition, the nodes whose answers this pass did not
        believe (no or bad evidence for their agentKey), among ``asked``:
        the nodes in flight when the pass began. It stays while nothing is
        in flight (a hold), and goes once their answers are believed again."""
        unverified = self.ctx.obs.unverified
        named = [f"{name} ({unverified[name]})" for name in asked if name in unverified]
        self.set_condition(
            "unverified_evidence",
            None
            if not named
            else (
                "answers not signed by the node's agentKey are no evidence: "
                + "; ".join(named[:20])
                + (f"; and {len(named) - 20} more" if len(named) > 20 else "")
                + "; check the agent's --key against spec.agentKey in its node file"
            ),
        )

    def health_conditions(self) -> None:
        """Conditions for prometheus checks nothing can answer: no server in
        settings, or a query the server refuses (docs/health.md)."""
        f = self.frozen
        checks = f.health.prometheus_checks if f is not None and f.health is not None else ()
        if not checks or f is None or not f.live:
            return
        self.set_condition(
            "prometheus_not_configured",
            None
            if self.ctx.settings.prometheus_url is not None
            else (
                f"prometheus checks {', '.join(c.name for c in checks)} need "
                "settings.spec.prometheus.url in reconciler.yaml; until it is set they have no "
                "evidence and their nodes become unknown at their deadlines"
            ),
        )
        metrics = self.ctx.obs.metric_checks
        rejected = sorted(
            {
                (c.name, m.detail)
                for node in self.nodes
                if node.state == "dispatched"
                for c in checks
                if (m := metrics.get((node.name, c.name))) is not None and m.rejected
            }
        )
        self.set_condition(
            "prometheus_query_rejected",
            None
            if not rejected
            else "; ".join(
                f"Prometheus rejects the query of check {name}: {detail}"
                for name, detail in rejected
            )
            + "; fix the query in a new rollout (health is frozen at start)",
        )

    def seen(self) -> evidence.Seen:
        """This pass's observations and what the evidence rules judge by."""
        assert self.frozen is not None
        return evidence.Seen(
            self.ctx.obs,
            self.frozen.target,
            self.frozen.live,
            self.ctx.offline_after,
            self.ctx.settings.offline_after,
            self.now,
            self.frozen.health,
            self.ctx.settings.prometheus_url is not None,
        )

    def record_verdict(
        self, i: int, verdict: str, state: str, error: str, job: JobObservation | None
    ) -> None:
        node = self.nodes[i]
        first_backup_id, known = node.first_backup_id, node.first_backup_known
        first_attempt = node.first_apply_attempt
        # A first backup recorded before first_apply_attempt existed is final too.
        if known and first_attempt is None and first_backup_id is None:
            if job is None or job.state not in ("succeeded", "failed", "refused"):
                # The apply may have run without our seeing it: only the
                # agent's backup list can tell (docs/rollouts.md).
                known, first_attempt = False, node.attempt
            elif job.state == "succeeded" or job.backup_id is not None:
                # The first apply the agent ran: its backup, or none (no
                # config before, or already the target), is what a restore
                # puts back, never a later attempt's (docs/rollouts.md).
                first_backup_id, first_attempt = job.backup_id, node.attempt
            # Else the agent failed or refused it without a backup and left
            # the config as it was: the next apply counts as the first.
        new = evolve(
            node,
            state=state,
            verdict=verdict,
            error=error,
            finished_at=self.now,
            evidence=evidence.recorded(verdict, job, self.ctx.obs.heartbeats.get(node.name))
            if self.frozen is not None and self.frozen.live
            else evidence.recorded(verdict, job, None),
            backup_id=job.backup_id if job is not None else None,
            first_backup_id=first_backup_id,
            first_backup_known=known,
            first_apply_attempt=first_attempt,
            checks=self.check_outcomes(node, job),
        )
        self.set_node(i, new, error or verdict)

    def check_outcomes(
        self, node: NodeRecord, job: JobObservation | None
    ) -> tuple[CheckOutcome, ...]:
        """Each health check's last outcome, for a node whose apply succeeded
        in a live rollout with checks (docs/health.md)."""
        seen = self.seen()
        if not seen.checks_apply or job is None or job.state != "succeeded":
            return ()
        return evidence.judge_node_health(node, seen).outcomes

    def record_restore(self, i: int, node: NodeRecord, restore: RestoreRecord) -> None:
        job = self.ctx.obs.jobs.get(restore.job_id)
        judged = evidence.judge_restore(restore, job, self.now)
        if judged is None:
            return
        outcome, error = judged
        held = node.held
        if restore.request == "policy" or held is not None:
            held = None if self.phase_terminal() else outcome
        new = evolve(
            node,
            state=outcome,
            held=held,
            restore=replace(
                restore, finished_at=self.now, error=error, evidence=evidence.recorded_restore(job)
            ),
        )
        self.set_node(i, new, error or "restore succeeded")
        if restore.request != "policy":
            rollback.update_outcome(self, restore.request, node.name, outcome, error)

    # -- decisions

    def decide_verdicts(self) -> bool:
        """Apply the failure policy to verdicts not yet decided (recorded
        while paused, or just now). Observe decides nothing: failures are
        recorded and the batch goes on."""
        if self.policy == "observe":
            return False
        progressed = False
        for i in list(self.open_indexes()):
            node = self.nodes[i]
            if restore_waiting(node):
                progressed |= self.start_policy_restore(i)
                continue
            if node.state not in VERDICT_STATES or node.held is not None:
                continue
            if node.verdict is None:
                continue
            live = self.frozen is not None and self.frozen.live
            # A backup not yet known counts as available: the restore waits
            # for the agent's backup list and falls back to rollback_unavailable.
            backup = live and (node.first_backup_id is not None or not node.first_backup_known)
            decision = decide(
                self.policy, node.verdict, auto_retried=node.auto_retried, backup_available=backup
            )
            if decision.action == "retry":
                if self.restores_in_flight():
                    continue  # nothing else is dispatched while a restore runs
                self.dispatch(i, "automatic retry (retry_once)", auto_retry=True)
            elif decision.action == "stop":
                self.set_node(i, evolve(node, state="stopped", held="stopped"), "policy stop")
            elif decision.action == "rollback":
                self.set_node(i, evolve(node, held="rollback_pending"), "policy rollback")
                self.start_policy_restore(i)
            elif decision.action == "hold":
                self.set_node(i, evolve(node, held=decision.hold), decision.hold or "hold")
            progressed = True
        return progressed

    def resolve_first_backup(self, i: int) -> NodeRecord:
        """Search the agent's backup list for this rollout's apply job ids
        when the first backup is not known: from the attempt whose result
        was never seen on (earlier ones left the config as it was), the
        oldest match is the first. The list cannot tell an unseen apply that
        ran without a backup from one that never reached the agent; a later
        attempt's match is taken as the latter, since after the former a
        later apply finds its target in place and takes no backup either."""
        node = self.nodes[i]
        if node.first_backup_known:
            return node
        backups = self.ctx.obs.backups.get(node.name)
        if backups is None:
            return node
        assert self.start_commit is not None
        start = node.first_apply_attempt or 1
        ours = {
            job_id(self.inp.name, self.start_commit, node.name, a, "apply"): a
            for a in range(start, node.attempt + 1)
        }
        found = min(
            ((ours[b.job_id], b.backup_id) for b in backups if b.job_id in ours), default=None
        )
        attempt, backup = found if found is not None else (start, None)
        new = evolve(
            node, first_backup_id=backup, first_backup_known=True, first_apply_attempt=attempt
        )
        self.set_node(i, new, "backup list searched")
        return new

    def start_policy_restore(self, i: int) -> bool:
        node = self.resolve_first_backup(i)
        if not node.first_backup_known:
            return False  # wait for the backup list (wanted_backups asks for it)
        if node.first_backup_id is None:
            self.set_node(i, evolve(node, held="rollback_unavailable"), "no backup to restore")
            return True
        self.send_restore(i, "policy", "rollback_pending")
        return True

    def carry_out_decided_restores(self) -> None:
        """After an abort, restores the policy decided are still carried out."""
        for i in list(self.open_indexes()):
            node = self.nodes[i]
            if restore_waiting(node):
                node = self.resolve_first_backup(i)
                if node.first_backup_known and node.first_backup_id is not None:
                    self.send_restore(i, "policy", "rollback_pending")
                elif node.first_backup_known:
                    self.set_node(i, evolve(node, held=None), "no backup to restore")

    def send_restore(self, i: int, request: str, state: str) -> None:
        node = self.nodes[i]
        assert self.frozen is not None and self.start_commit is not None
        assert node.first_backup_id is not None
        jid = job_id(self.inp.name, self.start_commit, node.name, node.attempt, "restore", request)
        restore = RestoreRecord(
            request=request,
            job_id=jid,
            backup_id=node.first_backup_id,
            attempt=node.attempt,
            source_commit=self.inp.spec_commit,
            dispatched_at=self.now,
            deadline=self.deadline(),
        )
        self.set_node(i, evolve(node, state=state, restore=restore), f"restore ({request})")
        self.effects.append(_restore_job(self.inp.name, self.frozen, node.name, restore))

    def restores_in_flight(self) -> bool:
        """Restores sent, or an accepted rollback request waiting to send them:
        either way nothing else is dispatched (docs/rollouts.md)."""
        return bool(
            self.progress("rollback_pending")
            or self.progress("restoring")
            or any(r.state == "waiting" for r in self.rollbacks)
        )

    def dispatch(self, i: int, reason: str, auto_retry: bool = False) -> None:
        """Send the node's next attempt, or say why the daemon cannot."""
        node = self.nodes[i]
        assert self.frozen is not None and self.start_commit is not None
        fleet_node = self.ctx.node(node.name)
        if fleet_node is None:
            if node.state == "pending":
                new = evolve(
                    node,
                    state="unknown",
                    verdict="unknown",
                    error="node removed from nodes/",
                    finished_at=self.now,
                    held=None,
                )
                self.set_node(i, new, "node removed from nodes/")
            else:
                error = "node removed from nodes/"
                self.set_node(i, evolve(node, held="dispatch_refused", error=error), error)
            return
        refusal = ""
        if fleet_node.maintenance and not self.frozen.include_maintenance:
            refusal = "node is in maintenance"
        elif not is_usable_agent_url(fleet_node.agent):
            refusal = f"agent address {fleet_node.agent!r} is not {agent_url.SHAPE}"
        if refusal:
            # A resumed question node keeps its verdict and is held again.
            self.set_node(i, evolve(node, held="dispatch_refused", error=refusal), refusal)
            return
        attempt = node.attempt + 1
        jid = job_id(self.inp.name, self.start_commit, node.name, attempt, "apply")
        new = evolve(
            node,
            state="dispatched",
            attempt=attempt,
            job_id=jid,
            source_commit=self.inp.spec_commit,
            dispatched_at=self.now,
            deadline=self.deadline() + timedelta(seconds=self.soak()),
            finished_at=None,
            verdict=None,
            error="",
            backup_id=None,
            held=None,
            evidence=None,
            auto_retried=node.auto_retried or auto_retry,
        )
        self.set_node(i, new, reason)
        self.effects.append(_apply_job(self.inp.name, self.frozen, new))

    def pause_after_waiting(self, spec: RolloutSpec) -> int | None:
        """The batch after which pauseAfter holds now, if any."""
        done = self.last_started_batch()
        if done is None or done >= len(self.batches):
            return None
        if self.batches[done - 1].state != "done" or done not in spec.pause_after:
            return None
        return done

    def last_started_batch(self) -> int | None:
        last = None
        for b in self.batches:
            if b.state == "pending":
                break
            last = b.index
        return last

    def advance(self, spec: RolloutSpec) -> bool:
        """Settle batches; start the next one, or end the rollout."""
        self.update_batches()
        if self.restores_in_flight() or self.any_held():
            return False
        last = self.last_started_batch()
        if last is not None and self.batches[last - 1].state != "done":
            return False
        if last == len(self.batches):
            if all(n.state == "succeeded" for n in self.nodes):
                self.finish("completed", "", f"all {len(self.nodes)} nodes succeeded")
            else:
                ok = self.progress("succeeded")
                self.finish(
                    "failed",
                    "not_all_succeeded",
                    f"{ok} of {len(self.nodes)} nodes succeeded; "
                    + ", ".join(f"{c} {s}" for s, c in self.counts() if s != "succeeded"),
                )
            return False
        paused_after = self.pause_after_waiting(spec)
        if paused_after is not None:
            until = self.hold.until if self.hold is not None else None
            if self.hold is None or self.hold.reason != "pause_after_batch" or until is None:
                return False
            if self.now < until:
                return False
        if not self.gate_open():
            return False
        why = "timed pauseAfter lifted" if paused_after is not None else "started"
        self.dispatch_batch((last or 0) + 1, f"batch {(last or 0) + 1} {why}")
        return True

    def gate_open(self) -> bool:
        """Whether a batch may start now; records the wait when it may not."""
        assert self.frozen is not None
        self.waiting = self.batch_gate(self.frozen.ignore_windows)
        return self.waiting is None

    def counts(self) -> list[tuple[str, int]]:
        return [(s, self.progress(s)) for s in NODE_STATES if self.progress(s)]

    def dispatch_batch(self, batch: int, reason: str) -> None:
        self.waiting = None
        self.set_batch(batch, "running")
        for i in self.batch_range(batch):
            if self.nodes[i].state == "pending":
                self.dispatch(i, reason)
        self.touched_batches.add(batch)
        self.update_batches()

    def any_held(self) -> bool:
        return any(self.nodes[i].held is not None for i in self.open_indexes())

    def settled(self, node: NodeRecord) -> bool:
        if self.phase_terminal():
            # Ended: a node is done once nothing is in flight or decided for it.
            return (
                node.state != "dispatched"
                and node.state not in RESTORE_STATES
                and not (restore_waiting(node))
            )
        if node.held is not None:
            return False
        if node.state in ("succeeded", "skipped", "rolled_back", "rollback_failed"):
            return True
        if node.state in VERDICT_STATES:
            return self.policy == "observe"
        return False

    def update_batches(self) -> None:
        for b in sorted(self.touched_batches):
            if self.batches[b - 1].state == "running" and all(
                self.settled(self.nodes[i]) for i in self.batch_range(b)
            ):
                self.set_batch(b, "done")
        self.touched_batches.clear()

    # -- holds

    def settle_hold(self) -> None:
        """Phase and hold from the held nodes, pauseAfter and the operator pause."""
        if self.phase_terminal():
            return
        self.update_batches()
        held = [(i, self.nodes[i]) for i in self.open_indexes() if self.nodes[i].held is not None]
        hold: Hold | None = None
        spec = self.inp.spec
        if held:
            reasons = [n.held for _, n in held]
            reason = (
                self.hold.reason
                if self.hold is not None and self.hold.reason in reasons
                else reasons[0]
            )
            assert reason is not None
            names = [n.name for _, n in held]
            first = next(n for _, n in held if n.held == reason)
            message = hold_message(reason, nodes=names, error=first.error)
            hold = self.make_hold(reason, message, tuple(names))
        elif spec is not None and (batch := self.pause_after_waiting(spec)) is not None:
            old = self.hold
            since = old.since if old is not None and old.reason == "pause_after_batch" else self.now
            until = timed_pause_until(
                spec.pause_for, batch, since, (self.nodes[i] for i in self.batch_range(batch))
            )
            message = hold_message("pause_after_batch", batch=batch, until=until)
            hold = self.make_hold("pause_after_batch", message, (), until=until)
        elif self.operator_paused:
            hold = self.make_hold("operator_paused", hold_message("operator_paused"), ())
        self.hold = hold
        if hold is None:
            self.set_phase("running", "pause lifted" if self.phase == "paused" else "running")
        else:
            self.set_phase("paused", hold.reason)

    def make_hold(
        self, reason: str, message: str, names: tuple[str, ...], until: datetime | None = None
    ) -> Hold:
        old = self.hold
        since = old.since if old is not None and old.reason == reason else self.now
        new = Hold(
            reason=reason,
            message=message,
            since=since,
            nodes=names[:HOLD_NODES_SHOWN],
            node_count=len(names),
            until=until,
        )
        return old if old == new else new


# --- jobs rebuilt from status --------------------------------------------------


def _apply_job(rollout: str, frozen: FrozenSpec, node: NodeRecord) -> SendJob:
    assert node.job_id is not None and node.source_commit is not None
    health = frozen.health if frozen.live and frozen.health is not None else None
    return SendJob(
        job_id=node.job_id,
        kind="apply",
        node=node.name,
        rollout=rollout,
        attempt=node.attempt,
        mode=frozen.mode,
        target=frozen.target,
        source_commit=node.source_commit,
        health=health if health is not None and health.agent_checks else None,
    )


def _restore_job(rollout: str, frozen: FrozenSpec, node: str, restore: RestoreRecord) -> SendJob:
    return SendJob(
        job_id=restore.job_id,
        kind="restore",
        node=node,
        rollout=rollout,
        attempt=restore.attempt,
        mode=frozen.mode,
        target=frozen.target,
        source_commit=restore.source_commit,
        backup_id=restore.backup_id,
    )


def _open_nodes(status: RolloutStatus) -> Iterable[NodeRecord]:
    """Nodes that may have a job in flight: running batches, and restores."""
    if status.frozen is None:
        return
    starts = status.frozen.batch_starts(len(status.nodes))
    for b in status.batches:
        if b.state == "running":
            yield from status.nodes[starts[b.index - 1] : starts[b.index]]
    if _restores_in_flight(status):
        for node in status.nodes:
            if node.state in RESTORE_STATES and status.batches[node.batch - 1].state != "running":
                yield node


def _restores_in_flight(status: RolloutStatus) -> bool:
    return any(s in RESTORE_STATES for s, _ in status.progress)


def in_flight(statuses: Iterable[RolloutStatus]) -> tuple[SendJob, ...]:
    """Every recorded job not finished: the daemon reads each from its agent
    and resends (same id, same payload) any the agent does not know. The
    payload is rebuilt from status alone."""
    jobs: list[SendJob] = []
    for status in statuses:
        if status.frozen is None:
            continue
        for node in _open_nodes(status):
            if node.state == "dispatched":
                jobs.append(_apply_job(status.name, status.frozen, node))
            elif node.state in RESTORE_STATES and node.restore is not None:
                jobs.append(_restore_job(status.name, status.frozen, node.name, node.restore))
    return tuple(jobs)


def wanted_heartbeats(statuses: Iterable[RolloutStatus]) -> tuple[str, ...]:
    """Nodes whose heartbeat the next step needs: dispatched nodes of live rollouts."""
    names: dict[str, None] = {}
    for status in statuses:
        if status.frozen is None or not status.frozen.live:
            continue
        for node in _open_nodes(status):
            if node.state == "dispatched":
                names[node.name] = None
    return tuple(names)


def wanted_metric_checks(
    statuses: Iterable[RolloutStatus],
) -> tuple[tuple[str, str, HealthCheck], ...]:
    """(node, job id, check) of every prometheus check the next step judges:
    dispatched nodes of live rollouts with such checks. The daemon asks only
    for those whose job it has seen finished (docs/health.md)."""
    wanted: list[tuple[str, str, HealthCheck]] = []
    for status in statuses:
        f = status.frozen
        if f is None or not f.live or f.health is None or not f.health.prometheus_checks:
            continue
        for node in _open_nodes(status):
            if node.state == "dispatched" and node.job_id is not None:
                wanted.extend((node.name, node.job_id, c) for c in f.health.prometheus_checks)
    return tuple(wanted)


def wanted_backups(statuses: Iterable[RolloutStatus]) -> tuple[str, ...]:
    """Nodes whose backup list the next step needs: a restore is decided or
    requested, and the first apply's result was never seen (docs/rollouts.md)."""
    names: dict[str, None] = {}
    for status in statuses:
        if status.frozen is None or not status.frozen.live:
            continue
        for node in _open_nodes(status):
            if restore_waiting(node) and not node.first_backup_known:
                names[node.name] = None
        if any(r.state == "waiting" for r in status.rollbacks):
            for node in status.nodes:
                if not node.first_backup_known:
                    names[node.name] = None
    return tuple(names)


def next_wakeup(statuses: Iterable[RolloutStatus]) -> datetime | None:
    """The earliest deadline or ``startAt`` after which a step could change
    something without new observations. (``offlineAfter`` counts from the
    daemon's own memory of failed contacts, so the daemon adds it itself.
    The deadlines in status already carry the timeouts in force.)"""
    earliest: datetime | None = None

    def consider(moment: datetime | None) -> None:
        nonlocal earliest
        if moment is not None and (earliest is None or moment < earliest):
            earliest = moment

    for status in statuses:
        if status.phase == "scheduled":
            consider(status.scheduled_for)
        if status.waiting is not None and not status.terminal:
            consider(status.waiting.until)  # a window opens or a freeze ends
        elif status.hold is not None and status.phase == "paused":
            consider(status.hold.until)  # a timed pauseAfter lifts by itself
        for node in _open_nodes(status):
            if node.state == "dispatched":
                consider(node.deadline)
            elif node.state in RESTORE_STATES and node.restore is not None:
                consider(node.restore.deadline)
    return earliest


def is_active(status: RolloutStatus) -> bool:
    """Scheduled, running or paused; or terminal with jobs or restores still in flight."""
    if status.phase in ("scheduled", "running", "paused"):
        return True
    if status.phase == "pending":
        return False
    return (
        bool(in_flight([status]))
        or any(r.state == "waiting" for r in status.rollbacks)
        or any(restore_waiting(n) for n in _open_nodes(status))
    )


def waits_for_a_person(status: RolloutStatus) -> bool:
    """Paused with no job, restore or rollback in flight or waiting: only an
    edit of the rollout (resume, abort, a lifted pause) moves it on, and a
    change of the branch wakes the daemon for that. Passes in between would
    step the same inputs, so a hold like this needs no faster passes (or
    fetches) than an idle fleet; a deadline, if any, is in ``next_wakeup``."""
    return (
        status.phase == "paused"
        and not in_flight([status])
        and not any(r.state == "waiting" for r in status.rollbacks)
        and not any(restore_waiting(n) for n in _open_nodes(status))
    )
