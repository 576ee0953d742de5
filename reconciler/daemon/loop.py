"""The reconcile pass and the loop around it (docs/architecture.md).

One pass is the fixed list ``PASS_STEPS``, run in order by
``Daemon._attempt``, the frame: each step takes as arguments the values
it reads, returns what it made, and writes nothing a later step reads;
``read`` may end the pass there:

- ``read``: the branch tip (fetching first from a remote); ends the pass
  when history was rewritten, or when the last pass was quiet and
  nothing moved since;
- ``verify``: the ``reader`` picks the tree to act on (the verified one,
  with verification on) and hands a snapshot of its documents and the
  recorded statuses, and what changed since the last pass; then every
  rollout's engine input (``inputs``);
- ``observe``: the agents and Prometheus (``observer``);
- ``step``: every rollout through the engine with one ``now``;
- ``fleet``: start a fleet sweep when due, decide what the last one showed;
- ``commit``: the changed status files and the dashboard (``status_files``)
  in one commit whose parent is the tip read, moving the branch only if it
  still points there; a lost race raises ``RefMoved`` and the pass starts
  over, executing nothing;
- ``notify``: the events that commit made true, queued for the receivers;
- ``send``: only then, the jobs just recorded.

Between passes the daemon keeps only caches (the reader's, the observer's,
the engine's memo, the status writer's) and the soft state a restart may
forget, declared in ``soft_state.SoftState``. Must not: decide anything
(that is the engine's), or keep rollout state anywhere but the status files.
"""

from __future__ import annotations

import contextlib
import gc
import signal
import time
import traceback
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from reconciler.daemon.agent_client import AgentClient
from reconciler.daemon.alertmanager_client import AlertmanagerClient
from reconciler.daemon.commit_log import log_commit
from reconciler.daemon.crashpoints import CrashPoints
from reconciler.daemon.fleet_watch import FleetWatch, Sweep, SweepBase, fleet_file_changes
from reconciler.daemon.gauges import PhaseGauges
from reconciler.daemon.inert import needs_passes
from reconciler.daemon.inputs import BuiltInputs
from reconciler.daemon.logs import EventLog
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.notifications import Notifier
from reconciler.daemon.observer import Observed, Observer
from reconciler.daemon.prometheus_client import PrometheusClient
from reconciler.daemon.range_queries import RangeQueries
from reconciler.daemon.reader import Delta, Reader, Snapshot
from reconciler.daemon.refusal_log import log_refusals
from reconciler.daemon.soft_state import SoftState
from reconciler.daemon.state import DaemonState
from reconciler.daemon.status_files import StatusFiles, commit_message
from reconciler.engine import canary_queries
from reconciler.engine import fleet as fleet_rules
from reconciler.engine import step as engine
from reconciler.engine.memo import StepMemo
from reconciler.engine.step import FleetStep, RolloutInput
from reconciler.git.approval import Approver
from reconciler.git.sshsig import AllowedSigner
from reconciler.git.store import GitStore
from reconciler.git.watch import BranchWatcher
from reconciler.spec.errors import HostKeyError, RefMoved, StoreError
from reconciler.spec.fleet_status import FleetStatus
from reconciler.spec.paths import DASHBOARD_PATH, SETTINGS_PATH
from reconciler.spec.rollout_status import RolloutStatus
from reconciler.text import notification_events
from reconciler.text.web_answers import StatusView

MAX_RACES = 20  # passes lost in a row to other writers before giving up
REREAD = 60.0  # seconds: the longest a serving daemon waits between passes

# One pass (docs/architecture.md), as the steps ``Daemon._attempt`` runs in
# this order; each step's signature says what it reads, its docstring what
# it touches.
PASS_STEPS = ("read", "verify", "observe", "step", "fleet", "commit", "notify", "send")


@dataclass(frozen=True)
class PassOutcome:
    tip: str  # the commit the pass read
    commit: str | None  # the status commit it made, if any
    transitions: int
    jobs_sent: int
    active: bool  # some rollout still needs passes
    wakeup: datetime | None  # earliest deadline or start time
    refused: str = ""  # why the pass did not act (rewritten history)
    job_ids: tuple[str, ...] = ()  # the jobs it recorded and sent, in order


def _earliest(*moments: datetime | None) -> datetime | None:
    """A pass is due at the first of these: a deadline or start time, the
    end of a soak that the daemon's clock keeps (the comparisons'), or a
    held answer growing too old to stand in for a read."""
    return min((m for m in moments if m is not None), default=None)


@dataclass(frozen=True)
class _Quiet:
    """A pass that changed nothing and had nothing to observe. Until the
    branches move or ``wakeup`` comes, another pass would step the same
    inputs with the same (empty) observations: the engine is pure and, with
    nothing in flight, reads the clock only against start times and
    deadlines, which ``wakeup`` covers. So it is not run again.

    With ``seen``, the pass changed statuses (``lively``, those not inert
    after its step) and the next pass is quiet only if, when it is due, it
    would observe nothing (``Observer.left_to_held_reads``): it would step
    what this step made with no observation of the jobs in flight, and the
    step stops at a fixed point (a property test pins it)."""

    tip: str
    status_branch: str
    status_tip: str | None
    wakeup: datetime | None
    outcome: PassOutcome
    approvals_tip: str | None = None  # the approvals notes ref, when approvals are required
    seen: Observed | None = None
    lively: tuple[RolloutStatus, ...] = ()


@dataclass(frozen=True)
class Stepped:
    """What the ``step`` step made: one ``now``, the engine's step, and the
    statuses read with the step's changes."""

    now: datetime
    step: FleetStep
    merged: dict[str, RolloutStatus]


@dataclass(frozen=True)
class FleetDecided:
    """What the ``fleet`` step made: the fleet status the commit leaves at
    the status tip, the sweep it applies (if any), and its files when the
    sweep's thread decided them already."""

    fleet: FleetStatus | None
    sweep: Sweep | None
    files: Mapping[str, bytes | None] | None

    def writes(
        self, before: FleetStatus | None
    ) -> tuple[FleetStatus | None, Mapping[str, bytes | None], tuple[fleet_rules.FleetChange, ...]]:
        """What the commit writes of the fleet, given ``before`` at the
        status tip: the fleet status (None: unchanged), its files that
        differ, and the node changes for the commit message."""
        fleet = self.fleet
        if fleet is None or fleet == before:
            return None, {}, ()
        files = self.files if self.files is not None else fleet_file_changes(before, fleet)
        return fleet, files, fleet_rules.fleet_changes(before, fleet)


class Daemon:
    """Runs reconcile passes against one store; the loop is ``serve``.

    With ``approver`` (verification on), statuses are checked against the
    verified spec at their ``startCommit``; with ``status_signers`` too (the
    daemon signs its status commits), a status file counts only as the
    newest commit signed by one of those keys wrote it (``statustrust``).
    With ``plain``, every pass reads and steps everything afresh, keeping
    only the soft state: the oracle the shortcuts are tested against.
    ``soft``: the soft state (``soft_state``); the agent client checks
    signatures early with its ``answers`` when built with them."""

    def __init__(
        self,
        store: GitStore,
        client: AgentClient,
        *,
        log: EventLog | None = None,
        metrics: Metrics | None = None,
        approver: Approver | None = None,
        sign: Callable[[bytes], str] | None = None,
        status_signers: Sequence[AllowedSigner] = (),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC).replace(microsecond=0),
        notifier: Notifier | None = None,
        environ: Mapping[str, str] | None = None,
        prometheus: PrometheusClient | None = None,
        plain: bool = False,
        state: DaemonState | None = None,
        publish: Callable[[StatusView], None] | None = None,
        soft: SoftState | None = None,
        crash_points: CrashPoints | None = None,
    ) -> None:
        self.store = store
        self.client = client
        self.log = log or EventLog()
        self.metrics = metrics or Metrics()
        self.approver = approver
        self.sign = sign
        self.clock = clock
        self.notifier = notifier
        self.environ = environ if environ is not None else {}
        self.plain = plain
        # Where a crash test kills the process (``daemon.crashpoints``); none by default.
        self.crash_points = crash_points or CrashPoints()
        # Durable state outside Git; None (tests that build a Daemon) keeps none.
        self.state = state
        # Hands the read API each status commit made or read (docs/web.md); never waits.
        self.publish = publish or (lambda view: None)
        self.soft = soft or SoftState()
        self._status_signers = tuple(status_signers)
        self._prometheus = prometheus or PrometheusClient()
        # Clients with their connections: they outlive the observers built on them.
        self._alertmanager = AlertmanagerClient()
        self._range_queries = RangeQueries(batched=not plain)
        self.fleet_watch = FleetWatch(
            client,
            clock=clock,
            memory=self.soft.sweeps,
            evidence=self.soft.answers.believed_heartbeat,
            on_sweep=self._swept,
        )
        self.quiet: _Quiet | None = None  # the last pass, if it changed and watched nothing
        self._forget_caches()
        # Set by ``stop``, never cleared: a signal that came before ``serve``
        # began still ends it.
        self._stopping = False
        self._wake: Callable[[], None] | None = None  # set while ``serve`` runs
        self._watcher: BranchWatcher | None = None  # likewise

    def _forget_caches(self) -> None:
        """A new reader and observer, the same soft state (``self.soft``):
        every cache (of Git, of statuses, of the engine's memo, of the
        status files written) is rebuilt by reading."""
        soft = self.soft
        self.store.forget_history()
        if self.approver is not None:
            self.approver = self.approver.fresh()
        self.reader = Reader(
            self.store,
            approver=self.approver,
            status_signers=self._status_signers,
            report=self._report,
            info=self.log.info,
            memory=soft.reading,
            state=self.state,
        )
        self.observer = Observer(
            self.client,
            clock=self.clock,
            log=self.log,
            metrics=self.metrics,
            report=self._report,
            prometheus=self._prometheus,
            memory=soft.agents,
            answers=soft.answers,
            soaks=soft.soaks,
            alertmanager=self._alertmanager,
            range_queries=self._range_queries,
            crash_points=self.crash_points,
        )
        self.memo = StepMemo()  # finished rollouts at rest
        self.files = StatusFiles()
        self.gauges = PhaseGauges(self.metrics)
        self.quiet = None

    # -- one pass ------------------------------------------------------------

    def run_pass(self) -> PassOutcome:
        """One reconcile pass, started again from the top when another writer
        moved the branch between our read and our commit."""
        started = time.perf_counter()
        try:
            for _ in range(MAX_RACES):
                try:
                    # Sweeps start no new chunk while a pass runs.
                    with self.fleet_watch.pass_running():
                        outcome, read_everything = self._attempt()
                    if read_everything:
                        _freeze_long_lived()
                    if not outcome.refused:
                        self.metrics.passed()
                    return outcome
                except RefMoved:
                    self.metrics.conflicts.inc()
                    self.log.info("conflict", "the branch moved under the pass; reading again")
            raise StoreError(
                f"lost the compare-and-swap {MAX_RACES} times in a row",
                "another writer commits to the branch continuously; the next pass tries again",
            )
        finally:
            self.metrics.passes.inc()
            self.metrics.pass_seconds.observe(time.perf_counter() - started)

    def _attempt(self) -> tuple[PassOutcome, bool]:
        """One attempt at a pass: the steps of ``PASS_STEPS`` in order, each
        given what it reads and returning what it made; ``read`` may end the
        pass there (nothing to do, or a refusal). ``RefMoved`` from
        ``commit`` ends it too: nothing is sent. Also says whether it read
        some folder whole."""
        if self.plain:
            self._forget_caches()
        tip, ended = self._read()
        if ended is not None:
            return ended, False
        snapshot, delta, built = self._verify(tip)
        try:
            seen = self._observe(snapshot, delta, built.inputs)
            stepped = self._step(snapshot, built, seen)
        except Exception:
            # Inputs built and never stepped: the engine's memo has not seen
            # what changed in them, so it is forgotten.
            self.memo = StepMemo()
            raise
        decided = self._fleet(snapshot, stepped.merged)
        commit = self._commit(snapshot, delta, stepped, decided)
        self._notify(snapshot, stepped, decided.fleet, commit)
        sent = self._send(snapshot, stepped, seen)
        self.reader.settle()
        # The next tip must contain this one, or our own commit on it.
        own_commit = commit if snapshot.status_branch == self.store.branch else None
        self.reader.acted_on(own_commit or tip)
        outcome = self._outcome(snapshot, delta, seen, stepped, commit, sent)
        return outcome, delta.read_everything

    def _read(self) -> tuple[str, PassOutcome | None]:
        """Read the branch tip. Touches: the store's refs. Ends the pass (an
        outcome besides the tip) when history was rewritten under us, or
        when the last pass was quiet and nothing moved since."""
        tip = self.reader.tip()
        refused = self.reader.rewritten(tip)
        if refused is not None:
            self._report("history_rewritten", refused, commit=tip)
            return tip, PassOutcome(tip, None, 0, 0, False, None, refused=refused)
        quiet, self.quiet = self.quiet, None
        if (
            quiet is not None
            and quiet.tip == tip
            and self.store.tip(quiet.status_branch) == quiet.status_tip
            and self.reader.approvals_tip() == quiet.approvals_tip
            and (quiet.wakeup is None or self.clock() < quiet.wakeup)
            and not self.fleet_watch.wants_pass()
            and not self.client.has_news()
        ):
            self.quiet = _still_quiet(quiet, self.observer, self.clock)
            if self.quiet is not None:
                return tip, self.quiet.outcome
        return tip, None

    def _verify(self, tip: str) -> tuple[Snapshot, Delta, BuiltInputs]:
        """The snapshot of ``tip`` to act on and what changed (``Reader.read``:
        under verification, the verified tree and the statuses it backs),
        and each rollout's engine input. Touches: the reader's caches and
        the last-acted marker."""
        snapshot, delta = self.reader.read(tip)
        if snapshot.approval is not None:
            log_refusals(self.log, self.soft.logged, snapshot.approval.refusals)
        self.publish(StatusView(snapshot.status_tip, snapshot.statuses, snapshot.fleet_status))
        return snapshot, delta, self.reader.inputs(snapshot, delta)

    def _observe(
        self, snapshot: Snapshot, delta: Delta, inputs: Collection[RolloutInput]
    ) -> Observed:
        """Ask the snapshot fleet's agents, Prometheus and Alertmanager about
        the statuses that are not inert. Touches: the agents over HTTP; the
        observer's soft state."""
        documents = snapshot.documents
        return self.observer.observe(
            snapshot.statuses,
            delta.since_pass,
            documents.fleet,
            documents.settings,
            every=self.plain,
            starting_alerts=canary_queries.starting_alerts(inputs),
        )

    def _step(self, snapshot: Snapshot, built: BuiltInputs, seen: Observed) -> Stepped:
        """Step every rollout through the engine with one ``now``. Touches:
        nothing outside the engine's values (and its memo)."""
        now = self.clock()
        step = engine.step_fleet(
            built.inputs,
            snapshot.documents.fleet,
            snapshot.documents.settings,
            seen.observations,
            now,
            unreadable=snapshot.held_by_unreadable,
            memo=self.memo,
            changed=built.changes,
        )
        self.crash_points.reach("after_step")
        # A copy updated, not {**a, **b}: the same dict, without inserting
        # thousands of statuses one by one.
        merged = snapshot.statuses.copy()
        merged.update(step.statuses)
        return Stepped(now, step, merged)

    def _fleet(self, snapshot: Snapshot, merged: Mapping[str, RolloutStatus]) -> FleetDecided:
        """Start a fleet sweep when one is due, and decide what the newest
        finished sweep shows (``engine.fleet``), with the desired state from
        ``merged``, the statuses this pass holds. Touches: the fleet watch
        (a sweep thread)."""
        settings = snapshot.documents.settings
        fleet = snapshot.documents.fleet
        before = snapshot.fleet_status
        self.fleet_watch.tick(
            lambda: [(n.agent, n.name) for n in fleet.nodes],
            settings.fleet_check_interval,
            SweepBase(before, merged, settings.offline_after),
        )
        sweep = self.fleet_watch.pending()
        if sweep is None:
            return FleetDecided(before, None, None)
        new, files = _sweep_decision(sweep, before, merged, settings.offline_after)
        applies: Sweep | None = sweep
        if new is before or (before is None and not new.nodes):
            self.fleet_watch.applied(sweep)  # nothing to commit
            applies = None
        for state, count in new.counts().items():
            self.metrics.fleet_nodes.labels(state=state).set(count)
        return FleetDecided(new, applies, files)

    def _commit(
        self, snapshot: Snapshot, delta: Delta, stepped: Stepped, decided: FleetDecided
    ) -> str | None:
        """If any status changed, write the changed status files and the
        dashboard in one commit on the snapshot's status tip, moving the
        branch only if it still points there; the commit made, if any.
        Touches: the status branch (one commit, or ``RefMoved``); the
        reader's caches of what it wrote; logs, metrics."""
        reader, step, fleet = self.reader, stepped.step, decided.fleet
        commit = None
        parent = snapshot.status_tip

        def current_dashboard() -> bytes | None:
            blob = self.store.file_blob(parent, DASHBOARD_PATH) if parent else None
            return reader.dashboard_text(blob) if blob is not None else None

        files = self.files.files(
            snapshot.statuses,
            step,
            stepped.merged,
            snapshot.broken,
            snapshot.ignored,
            delta.since_pass,
            fleet,
            snapshot.documents.fleet.nodes,
            current_dashboard,
        )
        changes = files.changes
        fleet_written, fleet_files, fleet_changes = decided.writes(snapshot.fleet_status)
        changes.update(fleet_files)
        if changes:
            message = commit_message(step, snapshot.spec_commit, snapshot.broken, fleet_changes)
            commit = self.store.commit(
                snapshot.status_branch,
                parent,
                changes,
                message,
                sign=self.sign,
                pieces=files.pieces,
            )
            watcher = self._watcher if self._wake is not None else None  # while serving
            if snapshot.status_branch == self.store.branch and watcher is not None:
                # Before the ref's file event reaches the watcher: not a hint.
                watcher.acted_on(snapshot.status_branch, commit)
            reader.remember_commit(
                snapshot, commit, changes, files.written, step.statuses, fleet_written
            )
            log_commit(self.log, self.metrics, step, fleet_changes, commit)
            self.publish(StatusView(commit, stepped.merged, fleet))
            self.crash_points.reach("after_push")
        if decided.sweep is not None:
            self.fleet_watch.applied(decided.sweep)
        return commit

    def _notify(
        self,
        snapshot: Snapshot,
        stepped: Stepped,
        fleet: FleetStatus | None,
        commit: str | None,
    ) -> None:
        """Hand the notifier the events that ``commit`` made true
        (docs/operating.md), and on the first pass the events still true;
        it queues them and returns at once. Touches: the notifier's queues
        and, when the settings changed, its receivers."""
        notifier = self.notifier
        if notifier is None:
            return
        documents = snapshot.documents
        if not any(problem.path == SETTINGS_PATH for problem in documents.problems):
            notifier.reconfigure(documents.settings.notifications, self.environ)
        logged = self.soft.logged
        standing, logged.announced = not logged.announced, True
        notifier.publish(_pass_events(snapshot, stepped, fleet, commit, standing=standing))

    def notify_fleet(
        self,
        old: Mapping[str, notification_events.NodeState],
        new: Mapping[str, notification_events.NodeState],
        commit: str,
    ) -> None:
        """The fleet watch's hook (docs/operating.md): after it
        commits ``status/fleet.yaml``, the nodes whose (state, since) became
        offline or drift are events. ``old`` empty on the daemon's first
        sweep: what is still true is delivered again."""
        if self.notifier is not None:
            self.notifier.publish(notification_events.fleet_events(old, new, commit))

    def _send(self, snapshot: Snapshot, stepped: Stepped, seen: Observed) -> int:
        """Only now, send the jobs the committed status records to the
        snapshot fleet's agents; while ``serve`` runs, keep held reads in
        flight for what is not finished. How many were sent. Touches: the
        agents over HTTP; logs and metrics."""
        step, fleet = stepped.step, snapshot.documents.fleet
        sent = self.observer.send(step.effects, fleet, stepped.now, self._wake)
        if self._wake is not None:
            self.observer.watch(seen, step.statuses, step.effects, fleet, self._wake)
        return sent

    def _outcome(
        self,
        snapshot: Snapshot,
        delta: Delta,
        seen: Observed,
        stepped: Stepped,
        commit: str | None,
        sent: int,
    ) -> PassOutcome:
        """What the pass did, for the loop; remembers a quiet pass."""
        step = stepped.step
        self.gauges.update(stepped.merged, step, delta.since_pass)
        # The statuses observed as lively, as the step left them, and those it changed.
        lively = [s for s in seen.lively if s.name not in step.statuses]
        if self.plain:
            lively += step.statuses.values()
        else:
            lively += self.observer.inert.lively(step.statuses, every=False)
        outcome = PassOutcome(
            tip=snapshot.tip,
            commit=commit,
            transitions=len(step.transitions),
            jobs_sent=sent,
            # The statuses just changed first: usually one of them is active,
            # and then the thousands of unchanged ones need not be looked at.
            active=any(needs_passes(s) for s in step.statuses.values())
            or any(needs_passes(s) for s in lively),
            wakeup=_earliest(engine.next_wakeup(lively), seen.soak_end),
            job_ids=tuple(job.job_id for job in step.effects),
        )
        serving = self._wake is not None and not self.plain
        own = snapshot.status_branch == self.store.branch
        self.quiet = _quiet_after(
            snapshot, seen, lively, outcome, self.reader.approvals_tip(), serving, own
        )
        return outcome

    # -- reporting -----------------------------------------------------------

    def _report(self, event: str, message: str, **fields: Any) -> None:
        """Log a standing problem once, not on every pass."""
        if self.soft.logged.new_problem(message):
            self.log.warning(event, message, **fields)

    def _swept(self, sweep: Sweep) -> None:
        self.metrics.fleet_sweeps.inc()
        self.metrics.fleet_sweep_seconds.observe(sweep.seconds)

    # -- the loop ------------------------------------------------------------

    def serve(self, watcher: BranchWatcher, *, interval: float, reread: float = REREAD) -> None:
        """Pass, then sleep until the branch changes, the next deadline, or
        the interval while a rollout is active; until ``stop``. A pass that
        raises is logged, counted and retried with backoff."""
        self._watcher = watcher
        self._wake = watcher.wake  # a finished job's held read starts a pass
        self.fleet_watch.start(watcher.wake)
        backoff = 0.0
        while not self._stopping:
            try:
                outcome = self.run_pass()
            except Exception as exc:  # one pass never ends the daemon
                backoff = min(max(backoff * 2, 1.0), 60.0)
                self._failed(exc, backoff)
                if watcher.wait(backoff):
                    # A hint: the branch moved, or a poll works again after
                    # failing. Either way the next pass may work: no backoff.
                    backoff = 0.0
                continue
            backoff = 0.0
            # The pass's own status commit moves the branch too: not a hint.
            watcher.acted_on(self.store.branch, self.soft.reading.seen_tip)
            sleep = interval if outcome.active else reread
            if outcome.wakeup is not None:
                until = (outcome.wakeup - self.clock()).total_seconds()
                sleep = min(sleep, max(until, 0.0) + 0.01)
            sweep_due = self.fleet_watch.seconds_until_due()
            if sweep_due is not None and not self.fleet_watch.in_flight():
                sleep = min(sleep, sweep_due + 0.01)
            if not self._stopping:
                watcher.wait(sleep)
        self._wake = None
        self.observer.stop_watching()
        self.fleet_watch.stop()  # a sweep in flight ends after its chunk

    def _failed(self, exc: Exception, backoff: float) -> None:
        """A pass that raised: counted by kind and logged. A ``StoreError``
        says what to do; anything else is a defect of ours, logged with its
        traceback, and the caches it may have left half-built are dropped,
        as a restart would drop them."""
        if isinstance(exc, StoreError):
            kind = "host_key" if isinstance(exc, HostKeyError) else "store"
            self.metrics.pass_errors.labels(kind=kind).inc()
            self.log.error("pass_failed", f"{exc}; retrying in {backoff:.0f}s")
            return
        self.metrics.pass_errors.labels(kind="unexpected").inc()
        self.log.error(
            "pass_failed",
            f"unexpected {type(exc).__name__}: {exc}; retrying in {backoff:.0f}s",
            traceback="".join(traceback.format_exception(exc)),
        )
        self._forget_caches()

    def stop(self, *_: Any) -> None:
        """Finish the pass in progress, then return from ``serve``."""
        self._stopping = True
        if self._watcher is not None:
            self._watcher.stop()
        self.fleet_watch.stop(timeout=0)


def _freeze_long_lived() -> None:
    """After a pass that read every file: what it parsed (documents,
    statuses, their caches) lives as long as the daemon, so it is moved out
    of the garbage collector's generations (``gc.freeze``), whose full
    collections would otherwise walk it again and again. Unfrozen and
    collected first, so what an earlier full read kept and has let go
    since is freed."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _quiet_after(
    snapshot: Snapshot,
    seen: Observed,
    lively: Sequence[RolloutStatus],
    outcome: PassOutcome,
    approvals_tip: str | None,
    serving: bool,
    own_branch: bool,
) -> _Quiet | None:
    """Whether the pass after ``outcome`` may be skipped (``_Quiet``): this
    one changed nothing and asked nothing, its jobs answered by held
    answers only, until one of those is too old to stand in for a read or
    a held read ends; or, while ``serving`` keeps held reads (not the plain
    daemon), it changed statuses and the next one may observe nothing
    (asked when it is due, ``_still_quiet``). ``own_branch``: the status
    branch is the branch read, so the next pass reads this pass's commit."""
    commit = outcome.commit
    if commit is None and not outcome.jobs_sent and not outcome.transitions and not seen.watching:
        wakeup = _earliest(outcome.wakeup, seen.held_until)
        return _Quiet(
            snapshot.tip,
            snapshot.status_branch,
            snapshot.status_tip,
            wakeup,
            outcome,
            approvals_tip,
        )
    if not serving:
        return None
    tip = commit if commit is not None and own_branch else snapshot.tip
    return _Quiet(
        tip,
        snapshot.status_branch,
        commit or snapshot.status_tip,
        outcome.wakeup,
        PassOutcome(tip, None, 0, 0, outcome.active, outcome.wakeup),
        approvals_tip,
        seen,
        tuple(lively),
    )


def _still_quiet(quiet: _Quiet, observer: Observer, clock: Callable[[], datetime]) -> _Quiet | None:
    """``quiet``, when nothing moved since it was made, if the pass it
    skips would still change nothing. After a pass that changed statuses
    that is asked now, once, when the pass is due: most passes after a
    commit come with news, and the question costs a look at every job in
    flight. Then quiet until the first held answer grows too old too."""
    if quiet.seen is None:
        return quiet
    asks_nothing, held_until = observer.left_to_held_reads(quiet.seen, quiet.lively)
    wakeup = _earliest(quiet.wakeup, held_until)
    if not asks_nothing or (wakeup is not None and clock() >= wakeup):
        return None
    return replace(quiet, wakeup=wakeup, seen=None, lively=())


def _sweep_decision(
    sweep: Sweep,
    before: FleetStatus | None,
    merged: Mapping[str, RolloutStatus],
    offline_after: int,
) -> tuple[FleetStatus, Mapping[str, bytes | None] | None]:
    """The fleet status ``sweep`` shows against ``before``, and its files
    when the sweep's thread decided them against the same ``before``
    already; else decided now, with the desired state of ``merged``."""
    if sweep.decided is not None and sweep.base is before:
        return sweep.decided, sweep.files
    desired = fleet_rules.desired_state(merged.values())
    return fleet_rules.next_fleet(
        before, sweep.sightings, desired, offline_after, sweep.finished
    ), None


def _pass_events(
    snapshot: Snapshot,
    stepped: Stepped,
    fleet: FleetStatus | None,
    commit: str | None,
    *,
    standing: bool,
) -> list[notification_events.Event]:
    """The events ``commit`` made true (docs/operating.md), after the
    events still true when ``standing`` (the daemon's first pass)."""
    before = snapshot.fleet_status
    events: list[notification_events.Event] = []
    if standing:
        at = commit or snapshot.status_tip or snapshot.tip
        for status in snapshot.statuses.values():
            events += notification_events.standing_rollout_events(status, stepped.now, at)
        events += notification_events.standing_fleet_events(_fleet_states(before), at)
    if commit is not None:
        for name, new in stepped.step.statuses.items():
            events += notification_events.rollout_events(snapshot.statuses.get(name), new, commit)
        if fleet is not None and fleet != before:
            events += notification_events.fleet_events(
                _fleet_states(before), _fleet_states(fleet), commit
            )
    return events


def _fleet_states(fleet: FleetStatus | None) -> dict[str, notification_events.NodeState]:
    """Each node's (state, since) in ``status/fleet.yaml``: what fleet
    events are keyed by (docs/operating.md)."""
    return {n.name: (n.state, n.since) for n in fleet.nodes} if fleet is not None else {}


@contextlib.contextmanager
def stop_on_signals(daemon: Daemon) -> Any:
    """SIGINT and SIGTERM finish the current pass, then stop the loop."""

    def handler(signum: int, frame: FrameType | None) -> None:
        daemon.log.info("stopping", f"signal {signal.Signals(signum).name}: finishing the pass")
        daemon.stop()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


__all__ = ["REREAD", "Daemon", "PassOutcome", "stop_on_signals"]
