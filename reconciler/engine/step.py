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

The rules live in modules that take values and return values, which the
step records in its working copy (``draft``): why a start waits
(``starts``), what evidence writes (``verdicts``), the failure budget
(``budget``), the operator's intents (``intents``, ``rollback``), what a
send records (``attempts``), batch progress (``batches``), holds
(``holds``) and condition words (``conditions``). Restores, stage jobs and
baseline eval jobs are sent and recorded by ``restores``, ``staged_draft``
and ``baseline_draft``, whose functions take the draft and, as arguments,
what else they read. None of them imports this module.

Every phase and node-state change is checked against ``reconciler.engine.lifecycle``.
Status never goes backwards: terminal phases stay, attempts only grow, and a
verdict belongs to its attempt and is never rewritten.

Must not: read the clock, touch Git, HTTP, files or randomness, or log.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from operator import attrgetter

from reconciler.engine import (
    attempts,
    baseline_draft,
    batches,
    budget,
    comparisons,
    conditions,
    evidence,
    intents,
    releases,
    restores,
    rollback,
    staged_draft,
    starts,
    verdicts,
)
from reconciler.engine.calendar import batch_gate
from reconciler.engine.draft import StatusDraft
from reconciler.engine.holds import (
    ASK_AGAIN,
    CARRY_ON,
    RESTORE_STATES,
    SKIP,
    hold_over,
    hold_since,
    restore_waiting,
)
from reconciler.engine.inputs import FleetStep, NodeChange, RolloutInput, Transition
from reconciler.engine.memo import StepMemo
from reconciler.engine.queries import (
    apply_job,
    in_flight,
    is_active,
    next_wakeup,
    restores_in_flight,
    waits_for_a_person,
    wanted_backups,
    wanted_heartbeats,
    wanted_metric_checks,
)
from reconciler.engine.records import evolve
from reconciler.engine.selection import maintenance_node_ids
from reconciler.engine.shapes import timed_pause_until
from reconciler.engine.starts import select_nodes_by_index
from reconciler.protocol.effects import SendJob
from reconciler.protocol.observations import Observations
from reconciler.spec.model import Fleet, Node, RolloutSpec, Settings
from reconciler.spec.rollout_status import (
    NodeRecord,
    OperatorAct,
    RolloutStatus,
    freeze,
    frozen_changes,
    recorded_sizes,
)

__all__ = [
    "FleetStep",
    "RolloutInput",
    "StepMemo",
    "Transition",
    "in_flight",
    "is_active",
    "next_wakeup",
    "select_nodes_by_index",
    "step_fleet",
    "waits_for_a_person",
    "wanted_backups",
    "wanted_heartbeats",
    "wanted_metric_checks",
]


# --- the pass ------------------------------------------------------------------


class PassScope:
    """What every rollout's step shares within one pass of the engine: the
    same ``now``, the fleet, the observations, and every rollout's status
    as it stands so far. Made by ``step_fleet``, gone when it returns."""

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

    def current_unread(self) -> dict[str, RolloutStatus]:
        """``current`` for the pass's own bookkeeping: not counted as a read
        by a step."""
        return self._current

    def node(self, name: str) -> Node | None:
        if self._fleet_by_name is None:
            # Built once per fleet value, not once per pass (Fleet.index).
            self._fleet_by_name = self.fleet.index.by_name
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
        elif restores_in_flight(status):
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
    if restores_in_flight(status):
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
    ctx = PassScope(fleet, settings, observations, now)
    ctx.unreadable = dict(unreadable or {})
    stepped = _seed(ctx, rollouts, memo, changed)
    rounds = _Rounds(ctx)
    # Each round can only move rollouts forward; a bound keeps a bug from looping.
    for _ in range(len(rollouts) + 2):
        if not rounds.round(stepped):
            break
    current = ctx.current_unread()
    # Rollouts at rest kept their status (the same object): none changed.
    new_statuses = {
        inp.name: current[inp.name]
        for inp in stepped
        if inp.status is None
        or (current[inp.name] is not inp.status and current[inp.name] != inp.status)
    }
    if memo is not None:
        memo.remember(
            fleet,
            settings,
            (
                inp
                for inp in stepped
                if rounds.settled.get(inp.name) == _INDEPENDENT
                and current[inp.name] is inp.status
                and _may_rest(inp)
            ),
        )
    return FleetStep(
        statuses=new_statuses, effects=tuple(rounds.effects), transitions=tuple(rounds.transitions)
    )


def _seed(
    ctx: PassScope,
    rollouts: Collection[RolloutInput],
    memo: StepMemo | None,
    changed: Mapping[str, RolloutInput | None] | None,
) -> list[RolloutInput]:
    """Seed the pass with every recorded status; the inputs to step, in queue order."""
    fleet, settings = ctx.fleet, ctx.settings
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
        return stepped
    order = sorted(rollouts, key=_queue_order)
    # At rest since an earlier pass: not stepped, and claiming no node.
    resting = memo.resting(order, fleet, settings) if memo is not None else set()
    ctx.seed(order, resting)
    if memo is not None:
        memo.keep_seed(order, ctx.current_unread(), resting)
    return [inp for inp in order if inp.name not in resting] if resting else order


class _Rounds:
    """Rounds of one pass over the rollouts to step, and what they gave."""

    def __init__(self, ctx: PassScope) -> None:
        self.ctx = ctx
        self.effects: list[SendJob] = []
        self.transitions: list[Transition] = []
        # Rollouts whose last step changed nothing and sent nothing. A step
        # reads only its own input and status, values fixed for the pass, and
        # (counted in ctx.reads) the other rollouts' statuses; stepping such
        # a rollout again gives the same result as long as it read no other
        # rollout (INDEPENDENT), or none has changed since (ctx.version then).
        # So later rounds pass over it: most rollouts of a large repository
        # are finished.
        self.settled: dict[str, int] = {}

    def round(self, stepped: Sequence[RolloutInput]) -> bool:
        """Started and terminal rollouts first, then the rest in queue order.
        True when some status changed."""
        current = self.ctx.current_unread()
        ahead = {
            inp.name
            for inp in stepped
            if (s := current.get(inp.name)) is not None and (s.started or s.terminal)
        }
        progressed = False
        for inp in stepped:
            if inp.name in ahead:
                progressed |= self.run(inp)
        for inp in stepped:
            if inp.name not in ahead:
                progressed |= self.run(inp)
        return progressed

    def run(self, inp: RolloutInput) -> bool:
        ctx = self.ctx
        mark = self.settled.get(inp.name)
        if mark is not None and (mark == _INDEPENDENT or mark == ctx.version):
            return False
        before = ctx.current_unread().get(inp.name)
        reads = ctx.reads
        step = RolloutStep(inp, before, ctx)
        new = step.run()
        independent = ctx.reads == reads
        ctx.set_current(inp.name, new)
        self.effects.extend(step.effects)
        self.transitions.extend(step.transitions)
        if before is not None and new is before and not step.effects and not step.transitions:
            self.settled[inp.name] = _INDEPENDENT if independent else ctx.version
        else:
            self.settled.pop(inp.name, None)
        return before is None or new is not before


# --- one rollout's step ------------------------------------------------------------


def naming_who_paused(wait: tuple[str, str], by: OperatorAct | None) -> tuple[str, str]:
    """A pending rollout's (reason, message), the message naming who paused
    it when that is the reason. Who paused is recorded before start too,
    while ``operatorPaused`` stays false until start (the reason says it)."""
    reason, message = wait
    if reason == "paused" and by is not None:
        message += f" (by {by.describe()})"
    return reason, message


class RolloutStep(StatusDraft):
    """One rollout's step: the rules, applied to its status draft."""

    def __init__(self, inp: RolloutInput, status: RolloutStatus | None, ctx: PassScope) -> None:
        old = status or RolloutStatus(
            name=inp.name, spec_commit=inp.spec_commit, first_seen_commit=inp.first_seen_commit
        )
        super().__init__(inp.name, old, ctx.now, inp.spec_commit)
        self.inp = inp
        self.ctx = ctx

    @property
    def policy(self) -> str:
        assert self.frozen is not None
        return self.frozen.on_failure

    def deadline(self) -> datetime:
        assert self.health_timeout is not None
        return attempts.answer_by(self.now, self.health_timeout)

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
        self.tend_releases()
        return self.build()

    def note_approvals(self) -> None:
        """Record who approved the spec commit acted on: before start, as it
        is now; after start, only when the rollout's spec commit changes, so
        a newer approval of another change rewrites no running status
        (docs/trust.md)."""
        inp, old = self.inp, self.old
        acted_on = not old.started or inp.spec_commit != old.spec_commit
        if inp.approved_by and inp.spec is not None and acted_on:
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
            return self.wait(*starts.unusable(inp.problems, inp.refusal))
        if spec.abort:
            self.abort(inp.aborted_by, " before start")
            return False
        self.paused_by = inp.paused_by if spec.paused else None  # see naming_who_paused
        ctx = self.ctx
        decision = starts.decide_start(
            spec,
            ctx.settings,
            ctx.fleet,
            self.now,
            current=lambda: ctx.current,
            claims=lambda names: ctx.claims(names, exclude=inp.name),
        )
        if isinstance(decision, starts.Start):
            self.start(spec, decision.names)
            return True
        if isinstance(decision, starts.Scheduled):
            self.scheduled_for = decision.start_at
            self.waiting = decision.waiting
            self.reason, self.message = decision.reason, decision.message
            self.set_phase("scheduled", decision.why)
            return False
        return self.wait(*naming_who_paused(decision, self.paused_by))

    def wait(self, reason: str, message: str) -> bool:
        self.waiting = None
        self.reason = reason
        self.message = message
        self.set_phase("pending", reason)
        return False

    def start(self, spec: RolloutSpec, names: tuple[str, ...]) -> None:
        self.frozen = freeze(spec)
        numbers = starts.batch_numbers(self.frozen, names, self.ctx.node)
        nodes = [NodeRecord(name=n, batch=numbers[i]) for i, n in enumerate(names)]
        self.set_nodes(nodes, max(numbers))
        sizes = recorded_sizes(self.frozen, nodes)
        self.start_commit = self.inp.spec_commit
        self.started_at = self.now
        self.health_timeout = spec.health_timeout
        # A resume token present at start answers no hold: only a new value does.
        self.last_handled_resume = spec.resume_request
        self.reason = ""
        left_out = starts.left_out_words(maintenance_node_ids(spec, self.ctx.fleet))
        self.message = starts.start_message(spec, len(names), sizes) + left_out
        self.set_phase("running", "started")

    # -- after start

    def started_step(self) -> None:
        inp, spec = self.inp, self.inp.spec
        self.note_approvals()
        self.spec_commit = inp.spec_commit
        self.waiting = None  # set again below while a due batch waits for a window
        self.set_condition("unverified", inp.refusal)
        if spec is None and not inp.file_present:
            self.finish("aborted", "spec_removed", "the rollout file was removed")
        elif spec is not None and spec.abort:
            self.abort(inp.aborted_by)
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
                self.pause_by_operator(spec.paused, inp.paused_by)
        self.observe()
        if not self.phase_terminal():
            baseline_draft.observe_baseline(self, self.ctx.obs, self.ctx.node)
        self.health_conditions()
        if self.phase_terminal():
            self.carry_out_decided_restores()
            self.handle_rollback_request()
            self.close_terminal()
            return
        self.handle_rollback_request()
        if spec is not None and not spec.paused:
            self.apply(intents.skips(spec, self.nodes, self.index))
            alert_wait = comparisons.batch_wait(self.frozen, self.ctx.obs.alerts.get(self.name))
            for _ in range(len(self.batches) + 3):
                progressed = self.decide_verdicts() | staged_draft.decide_stages(
                    self, self.policy, self.ctx.node
                )
                progressed |= self.handle_resume(spec)
                progressed |= baseline_draft.send_baseline(self, self.ctx.node)
                progressed |= staged_draft.stage_ahead(self, spec, self.ctx.node, alert_wait)
                progressed |= self.advance(spec)
                progressed |= staged_draft.dispatch_staged(self, self.dispatch)
                if not progressed:
                    break
        self.settle_hold()

    def terminal_step(self) -> None:
        """Terminal: only evidence for jobs still in flight, restores already
        decided, and explicit rollback requests."""
        self.observe()
        self.carry_out_decided_restores()
        spec = self.inp.spec
        if spec is not None and self.old.started:
            self.handle_rollback_request()
        elif spec is not None and spec.rollback_request is not None:
            refused = rollback.refusal(
                spec.rollback_request,
                self.inp.author,
                self.now,
                self.rollbacks,
                "the rollout never started: nothing to roll back",
            )
            restores.record_rollback(self, refused, spec_commit=self.inp.spec_commit)
        self.close_terminal()

    def close_terminal(self) -> None:
        """A terminal rollout holds nothing: outcomes of restores and jobs
        that finish after the end are recorded without a hold."""
        for i in list(self.open_indexes()):
            node = self.nodes[i]
            if node.held is not None and not restore_waiting(node):
                self.set_node(i, evolve(node, held=None), "rollout ended")
        self.update_batches()

    def tend_releases(self) -> None:
        """Record the answers to releases in flight, then send the releases
        due (``reconciler.engine.releases``): never a hold, never a phase.
        While its operator pauses a running rollout none is sent: the
        operator may be about to roll back to a kept slot."""
        f, start_commit = self.frozen, self.start_commit
        if f is None or f.standby is None or start_commit is None:
            return
        ended = self.phase_terminal()
        jobs = self.ctx.obs.jobs
        for i, node in enumerate(self.nodes):
            standby = node.standby
            if standby is None:
                continue
            if standby.release_open:
                assert standby.release_job_id is not None
                found = releases.observed(standby, jobs.get(standby.release_job_id), self.now)
                if found is not None:
                    self.set_node(i, evolve(node, standby=found[0]), found[1])
            elif (ended or not self.operator_paused) and releases.due(f, node, ended):
                kept = releases.sent(
                    node, rollout=self.name, start_commit=start_commit, deadline=self.deadline()
                )
                new = evolve(node, standby=kept)
                self.set_node(i, new, f"release slot {standby.slot}")
                self.effects.append(releases.release_job(self.name, f, new))

    def check_frozen(self, spec: RolloutSpec) -> None:
        assert self.frozen is not None
        changed = frozen_changes(self.frozen, spec)
        self.set_condition("frozen_fields_changed", conditions.frozen_words(changed))

    # -- evidence

    def observe(self) -> None:
        """Record verdicts for in-flight applies and outcomes of restores."""
        in_flight = [(i, self.nodes[i]) for i in self.open_indexes()]
        if not in_flight:
            return
        ctx = self.ctx
        observed = verdicts.observe(
            in_flight,
            lambda: _seen(self),
            ctx.obs.jobs,
            lambda name: ctx.node(name) is not None,
            self.now,
            self.phase_terminal(),
        )
        self.apply(observed.changes)
        assert self.frozen is not None
        self.apply(budget.past_budget(self.frozen, self.nodes, observed.changes))
        staged_draft.observe_stages(self, lambda: _seen(self), ctx.node)
        for ended in observed.outcomes:
            self.rollbacks = rollback.with_outcome(
                self.rollbacks, ended.request, ended.node, ended.outcome, ended.error
            )
        asked = [node.name for _, node in in_flight]
        self.set_condition("unverified_evidence", conditions.unverified_words(asked, ctx.obs))

    def health_conditions(self) -> None:
        """Conditions of checks, comparisons and alerts nothing can answer (docs/health.md)."""
        f, obs = self.frozen, self.ctx.obs
        found = comparisons.condition_words(f, self.nodes, self.ctx.node, obs.alerts.get(self.name))
        checks = f.health.prometheus_checks if f is not None and f.health is not None else ()
        if checks and f is not None and f.live:
            configured = self.ctx.settings.prometheus_url is not None
            found += conditions.prometheus_words(checks, configured, self.nodes, obs)
        for type_, words in found:
            self.set_condition(type_, words)

    # -- rollback requests and restores

    def handle_rollback_request(self) -> None:
        spec = self.inp.spec
        if spec is None:
            return
        restores.answer_request(
            self,
            spec.rollback_request,
            author=self.inp.author,
            others=lambda: self.ctx.current,
            backups=self.ctx.obs.backups,
            spec_commit=self.inp.spec_commit,
        )

    def start_policy_restore(self, i: int) -> bool:
        return restores.start_policy_restore(
            self, i, backups=self.ctx.obs.backups, source_commit=self.inp.spec_commit
        )

    def carry_out_decided_restores(self) -> None:
        restores.carry_out_decided(
            self, backups=self.ctx.obs.backups, source_commit=self.inp.spec_commit
        )

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
            assert self.frozen is not None
            decision = verdicts.decision_for(node, self.policy, self.frozen.live)
            if decision is None:
                continue
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

    def handle_resume(self, spec: RolloutSpec) -> bool:
        """A new ``resumeRequest`` answers the current hold once
        (``intents.answer_resume``). True when it was handled."""
        token = spec.resume_request
        if not token or token == self.last_handled_resume:
            return False
        paused_after = self.pause_after_waiting(spec)
        if paused_after is not None and not self.any_held() and not self.gate_open():
            return False  # it would start a batch: it waits, unhandled, for the window
        self.last_handled_resume = token
        baseline_draft.resume_baseline(self, self.ctx.node)
        answer = intents.answer_resume(
            token,
            [(i, self.nodes[i]) for i in self.open_indexes()],
            [r.id for r in self.rollbacks if r.state == "waiting"],
            self.gone,
            paused_after,
        )
        self.set_condition("resume_refused", answer.refusal)
        for held in answer.held:
            node = self.nodes[held.index]
            if held.action == SKIP:
                self.set_node(held.index, evolve(node, state="skipped", held=None), held.reason)
            elif held.action == ASK_AGAIN:
                staged_draft.ask_again(self, held.index, held.reason, self.dispatch, self.ctx.node)
            elif held.action == CARRY_ON:
                self.set_node(held.index, evolve(node, held=None), held.reason)
        if answer.next_batch is not None:
            self.dispatch_batch(answer.next_batch, answer.reason)
        return True

    def gone(self, name: str) -> bool:
        assert self.frozen is not None
        return attempts.gone(self.ctx.node(name), self.frozen.include_maintenance)

    def dispatch(self, i: int, reason: str, auto_retry: bool = False) -> None:
        """Send the node's next attempt, or say why the daemon cannot."""
        node = self.nodes[i]
        assert self.frozen is not None and self.start_commit is not None
        new, send = attempts.next_apply(
            node,
            self.ctx.node(node.name),
            include_maintenance=self.frozen.include_maintenance,
            rollout=self.name,
            start_commit=self.start_commit,
            source_commit=self.inp.spec_commit,
            now=self.now,
            deadline=self.deadline() + timedelta(seconds=self.soak()),
            auto_retry=auto_retry,
        )
        self.set_node(i, new, reason if send else new.error)
        if send:
            self.effects.append(
                apply_job(self.name, self.frozen, new, baseline_draft.baseline_answers(self))
            )
        else:  # a node removed before it was sent ends unknown: the budget counts it
            ended = (NodeChange(i, new, new.error),)
            self.apply(budget.past_budget(self.frozen, self.nodes, ended))

    # -- batches

    def pause_after_waiting(self, spec: RolloutSpec) -> int | None:
        """The batch after which pauseAfter holds now, if any."""
        return batches.paused_after(self.batches, spec.pause_after)

    def advance(self, spec: RolloutSpec) -> bool:
        """Settle batches; start the next one, or end the rollout."""
        self.update_batches()
        if self.restores_in_flight() or self.any_held():
            return False
        last = batches.last_started(self.batches)
        if last is not None and self.batches[last - 1].state != "done":
            return False
        if last == len(self.batches):
            self.finish(
                *conditions.end_words(self.nodes, self.progress("succeeded"), self.counts())
            )
            return False
        paused_after = self.pause_after_waiting(spec)
        if paused_after is not None:
            until = self.hold.until if self.hold is not None else None
            if self.hold is None or self.hold.reason != "pause_after_batch" or until is None:
                return False
            if self.now < until:
                return False
        if not baseline_draft.baseline_ready(self) or not self.gate_open():
            return False
        if not staged_draft.batch_ready(self, (last or 0) + 1, self.policy):
            return False
        why = "timed pauseAfter lifted" if paused_after is not None else "started"
        self.dispatch_batch((last or 0) + 1, f"batch {(last or 0) + 1} {why}")
        return True

    def gate_open(self) -> bool:
        """Whether a batch may start now (deploy windows, freezes); records the wait if not."""
        assert self.frozen is not None
        settings = self.ctx.settings
        gated = not self.frozen.ignore_windows and (settings.windows or settings.freezes)
        waiting = batch_gate(settings.windows, settings.freezes, self.now) if gated else None
        waiting = waiting or comparisons.batch_wait(self.frozen, self.ctx.obs.alerts.get(self.name))
        # An unchanged wait keeps its value, so an idle pass writes nothing.
        self.waiting = self.waiting if waiting == self.waiting else waiting
        return self.waiting is None

    def dispatch_batch(self, batch: int, reason: str) -> None:
        self.waiting = None
        self.set_batch(batch, "running")
        for i in self.batch_range(batch):
            if self.nodes[i].state == "pending" and not staged_draft.staged_rollout(self):
                self.dispatch(i, reason)
        staged_draft.dispatch_staged(self, self.dispatch, reason)
        self.touched_batches.add(batch)
        self.update_batches()

    def update_batches(self) -> None:
        ended = self.phase_terminal()
        for b in sorted(self.touched_batches):
            if self.batches[b - 1].state == "running" and all(
                batches.node_settled(self.nodes[i], ended=ended, policy=self.policy)
                for i in self.batch_range(b)
            ):
                self.set_batch(b, "done")
        self.touched_batches.clear()

    # -- holds

    def settle_hold(self) -> None:
        """Phase and hold from the held nodes, pauseAfter and the operator pause."""
        if self.phase_terminal():
            return
        self.update_batches()
        held = [self.nodes[i] for i in self.open_indexes() if self.nodes[i].held is not None]
        held += baseline_draft.baseline_held(self)
        spec = self.inp.spec
        batch = self.pause_after_waiting(spec) if spec is not None and not held else None
        until = None
        if spec is not None and batch is not None:
            since = hold_since(self.hold, "pause_after_batch", self.now)
            batch_nodes = (self.nodes[i] for i in self.batch_range(batch))
            until = timed_pause_until(spec.pause_for, batch, since, batch_nodes)
        failed = budget.counted(self.nodes) if any(n.held == budget.REASON for n in held) else []
        live = self.frozen is not None and self.frozen.live
        found = (held, self.hold, batch, until, self.operator_paused, self.now, failed)
        self.hold = hold = hold_over(*found, self.paused_by, rollout=self.name, live=live)
        if hold is None:
            self.set_phase("running", "pause lifted" if self.phase == "paused" else "running")
        else:
            self.set_phase("paused", hold.reason)


def _seen(step: RolloutStep) -> evidence.Seen:
    """This pass's observations and what the evidence rules judge by."""
    frozen, ctx = step.frozen, step.ctx
    assert frozen is not None
    return evidence.Seen(
        ctx.obs,
        frozen.target,
        frozen.live,
        ctx.offline_after,
        ctx.settings.offline_after,
        step.now,
        frozen.health,
        ctx.settings.prometheus_url is not None,
        ctx.obs.alerts.get(step.name),
        frozen.evals,
        frozen.live and frozen.standby is not None,
    )
