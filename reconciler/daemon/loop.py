"""The reconcile pass and the loop around it (docs/architecture.md).

One pass is the named list ``PASS_STEPS``, each a method whose docstring
says what it touches: ``read`` the branch tip; ``verify``: with
verification on, keep to the verified tree, and read its documents (parsed
only when their blobs changed) and the recorded statuses; ``observe`` the
agents; ``step`` every rollout through the engine with one ``now``;
``fleet``: start a fleet sweep when due and decide what the last one
showed (docs/operating.md, ``fleet_watch.py``); ``commit`` all
changed status files and the dashboard in one commit whose parent is the
tip read, moving the branch only if it still points there; ``notify``:
hand the events that commit made true to the receivers' queues (never
waiting for a receiver); only then ``send`` the jobs just recorded. A pass
that loses the compare-and-swap starts over and sends nothing.

Must not: decide anything (that is the engine's), or keep rollout state
anywhere but the status files. What it keeps between passes is in one
object, ``DaemonMemory``: caches of something in Git (parsed blobs), or
what docs/architecture.md allows to be forgotten on restart (how long an agent has
been unreachable).
"""

from __future__ import annotations

import contextlib
import gc
import signal
import time
import traceback
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any

from reconciler.daemon import crashpoints
from reconciler.daemon.agent_client import AgentClient, HeartbeatWatch
from reconciler.daemon.answer_check import AnswerCheck
from reconciler.daemon.fleet_watch import (
    FleetWatch,
    Sweep,
    fleet_file_changes,
    fleet_lines,
    fleet_summary,
)
from reconciler.daemon.inert import InertStatuses, needs_passes
from reconciler.daemon.inputs import REQUEST_WALK, BuiltInputs, InputCache
from reconciler.daemon.inputs import Context as InputContext
from reconciler.daemon.logs import EventLog
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.notifications import Notifier
from reconciler.daemon.prometheus_client import PrometheusClient
from reconciler.daemon.status_trust import StatusTrust
from reconciler.engine import fleet as fleet_rules
from reconciler.engine import step as engine
from reconciler.engine.health_evidence import fold_metric_answer
from reconciler.engine.memo import StepMemo
from reconciler.engine.step import FleetStep, RolloutInput
from reconciler.git.approval import (
    Approval,
    Approver,
    descends_by_first_parent,
    last_acted,
    record_acted,
    refuse_backwards,
)
from reconciler.git.approval_notes import notes_tip
from reconciler.git.history import History
from reconciler.git.sshsig import AllowedSigner
from reconciler.git.status_writes import DaemonWrites
from reconciler.git.store import GitStore
from reconciler.git.watch import BranchWatcher
from reconciler.protocol.effects import SendJob
from reconciler.protocol.long_poll import DAEMON_WAIT_SECONDS, heartbeat_content
from reconciler.protocol.observations import Heartbeat, JobObservation, MetricCheck, Observations
from reconciler.spec import rollout_status as status_values
from reconciler.spec.documents import Assembly, Documents, ParsedFile, parse_file
from reconciler.spec.errors import HostKeyError, RefMoved, StoreError
from reconciler.spec.fleet_status import FleetStatus
from reconciler.spec.health import for_node
from reconciler.spec.model import Fleet, Node
from reconciler.spec.paths import (
    DASHBOARD_PATH,
    FLEET_STATUS_PATH,
    ROLLOUTS_DIR,
    SETTINGS_PATH,
    SPEC_FILES,
    SPEC_FOLDERS,
    STATUS_DIR,
    is_spec_path,
    name_in,
    status_path,
)
from reconciler.spec.rollout_status import ApprovalRecord, RolloutStatus
from reconciler.spec.status_texts import StatusTexts
from reconciler.spec.times import parse_time
from reconciler.views import notification_events
from reconciler.views.dashboard import DashboardOrder, DashboardParts, dashboard_parts
from reconciler.views.evidence_marks import evidence_dashboard_section
from reconciler.views.fleet_reader import FleetReader
from reconciler.views.fleet_text import fleet_dashboard_section
from reconciler.views.status_reader import StatusReader

MAX_RACES = 20  # passes lost in a row to other writers before giving up
# A job whose held read is in flight, and whose agent answered it accepted
# or running less than this ago, is not asked by the passes: its held read
# answers when it finishes. An agent that stops answering is still seen
# within this plus the agent timeout, as a plain read would see it.
HELD_ANSWER_SECONDS = 5.0


SOAK_MARGIN = 0.2  # seconds past a soak's end a held heartbeat read answers
MESSAGE_LINES = 60  # transitions listed in one commit message

# One pass (docs/architecture.md), as the steps ``Daemon._attempt`` runs in
# this order; each step's docstring says what it touches.
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


@dataclass(frozen=True)
class _Quiet:
    """A pass that changed nothing and had nothing to observe. Until the
    branches move or ``wakeup`` comes, another pass would step the same
    inputs with the same (empty) observations: the engine is pure and, with
    nothing in flight, reads the clock only against start times and
    deadlines, which ``wakeup`` covers. So it is not run again."""

    tip: str
    status_branch: str
    status_tip: str | None
    wakeup: datetime | None
    outcome: PassOutcome
    approvals_tip: str | None = None  # the approvals notes ref, when approvals are required


@dataclass
class DaemonMemory:
    """Everything the daemon keeps between passes, in one place. Each entry
    is a cache of something in Git (rebuilt by reading when dropped) or
    memory docs/architecture.md allows to lose on restart; none is rollout state."""

    # Caches of Git, by blob or tree ids.
    parsed: dict[str, ParsedFile] = field(default_factory=dict)  # blob id -> parsed document
    documents: tuple[tuple[str | None, ...], Documents] | None = None  # spec tree ids -> documents
    documents_commit: str | None = None  # the commit those documents were read at
    assembly: Assembly = field(default_factory=Assembly)  # documents, redone for what changed
    spec_blobs: dict[str, str] = field(default_factory=dict)  # spec path -> blob id, at that commit
    status_reader: StatusReader = field(default_factory=StatusReader)  # status files by blob id
    by_name: tuple[Fleet, dict[str, Node]] | None = None  # the fleet's nodes by name, per fleet
    memo: StepMemo = field(default_factory=StepMemo)  # finished rollouts at rest
    inputs: InputCache = field(default_factory=InputCache)  # engine inputs by rollout
    # Rollouts whose spec or status files the read step found changed in
    # this pass (None: it read every file, so look at every rollout).
    spec_changed: frozenset[str] | None = None
    status_changed: frozenset[str] | None = None
    quiet: _Quiet | None = None  # the last pass, if it changed and watched nothing
    read_everything: bool = False  # this pass read every spec or status file (see run_pass)
    # The daemon's last status commit on the statuses it read: (the status
    # tip read, the commit made on it, the status paths it wrote).
    own_status_write: tuple[str, str, frozenset[str]] | None = None
    # Rollouts whose recorded status may have changed since ``observe`` and
    # the phase gauges last looked (None: look at every one).
    observe_changes: set[str] | None = None
    gauge_changes: set[str] | None = None
    dashboard_changes: set[str] | None = None
    readable_changes: set[str] | None = None  # for ``last_readable``
    drawn_step: frozenset[str] = frozenset()  # the rollouts the step behind the dashboard changed
    phases: dict[str, str] = field(default_factory=dict)  # the gauges' rollouts and phases
    phase_counts: Counter[str] = field(default_factory=Counter)  # how many in each phase
    phases_shown: dict[str, int] = field(default_factory=dict)  # what the gauges were set to
    gauged_step: frozenset[str] = frozenset()  # the rollouts the step behind the gauges changed
    inert: InertStatuses = field(default_factory=InertStatuses)  # statuses that ask nothing
    dashboard: tuple[str, bytes] | None = None  # the dashboard blob read last: (id, content)
    status_texts: StatusTexts = field(default_factory=StatusTexts)  # node texts written last
    dashboard_order: DashboardOrder = field(default_factory=DashboardOrder)  # its rows' order
    # (verified commit, last acted commit) -> descends from it by first parent
    descends: dict[tuple[str, str], bool] = field(default_factory=dict)
    # Memory that may be forgotten on restart.
    last_readable: dict[str, RolloutStatus] = field(default_factory=dict)  # per rollout
    unreachable: dict[str, datetime] = field(default_factory=dict)  # node -> first failed contact
    # (node, check) -> what Prometheus has shown for the node's current job (section 11)
    metric_checks: dict[tuple[str, str], MetricCheck] = field(default_factory=dict)
    # job id -> its record once succeeded: an agent never changes a finished
    # record, and a node soaking its checks would otherwise be asked every pass
    finished_jobs: dict[str, JobObservation] = field(default_factory=dict)
    # job id -> when its agent last answered it accepted or running: not
    # asked while its held read is in flight (see HELD_ANSWER_SECONDS)
    held_jobs: dict[str, datetime] = field(default_factory=dict)
    # When the first job left waiting on its held read is to be asked again:
    # a pass quiet otherwise is quiet until then (``_Quiet``).
    held_until: datetime | None = None
    seen_tip: str | None = None  # the tip the last pass read (or its own commit on it)
    reported: set[str] = field(default_factory=set)  # problems already logged, to log each once
    watching: bool = False  # the last pass had jobs, heartbeats or backups to read
    answers: AnswerCheck = field(default_factory=AnswerCheck)  # agentKeys parsed, by line
    fleet_reader: FleetReader = field(default_factory=FleetReader)  # status/fleet.yaml by blob ids


class _Pass:
    """What one pass has learnt so far: each step of ``PASS_STEPS`` sets its
    part before the next step reads it. Lives for one attempt only; made
    empty, since most passes end in ``read`` (nothing moved)."""

    __slots__ = (
        "approval",
        "broken",
        "commit",
        "documents",
        "fleet",
        "fleet_before",
        "fleet_files",
        "fleet_sweep",
        "history",
        "ignored",
        "input_changes",
        "inputs",
        "lively",
        "merged",
        "now",
        "observations",
        "sent",
        "spec_commit",
        "status_branch",
        "status_tip",
        "statuses",
        "step",
        "tip",
        "unfinished",
    )
    tip: str
    history: History
    approval: Approval | None
    spec_commit: str | None
    documents: Documents
    status_branch: str
    status_tip: str | None
    statuses: dict[str, RolloutStatus]
    broken: dict[str, str]
    ignored: Mapping[str, str]  # status files no rollout can own: shown path -> why
    inputs: Collection[RolloutInput]
    input_changes: dict[str, RolloutInput | None] | None  # since the last build, for the memo
    observations: Observations
    lively: list[RolloutStatus]  # the statuses observed: those not inert
    unfinished: list[tuple[str, SendJob]]  # jobs the agents said are not finished yet
    now: datetime
    step: FleetStep
    merged: dict[str, RolloutStatus]
    commit: str | None
    sent: int
    fleet: FleetStatus | None  # the fleet status the commit leaves at the status tip
    fleet_before: FleetStatus | None  # the one at the status tip read
    fleet_sweep: Sweep | None  # the sweep this pass applies, if any
    fleet_files: Mapping[str, bytes | None] | None  # its files, when decided already


class Daemon:
    """Runs reconcile passes against one store; the loop is ``serve``.

    With ``approver`` (verification on), statuses are checked against the
    verified spec at their ``startCommit``; with ``status_signers`` too (the
    daemon signs its status commits), a status file counts only as the
    newest commit signed by one of those keys wrote it (``statustrust``)."""

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
    ) -> None:
        self.store = store
        # Plain: every pass reads and steps everything afresh, keeping only
        # the soft state (``_forget_caches``): the oracle the shortcuts are
        # tested against, and a way to rule them out on a live fleet.
        self.plain = plain
        self.notifier = notifier
        self.environ = environ if environ is not None else {}
        self._announced = False  # standing events handed to the notifier once, on start
        self.client = client
        self.log = log or EventLog()
        self.metrics = metrics or Metrics()
        self.approver = approver
        self.sign = sign
        self.clock = clock
        self.memory = DaemonMemory()
        client.on_signed = self.memory.answers.prepare  # signatures checked as answers arrive
        self.fleet_watch = FleetWatch(client, clock=clock, evidence=self._believed_heartbeat)
        self.fleet_watch.on_sweep = self._swept
        self.prometheus = prometheus or PrometheusClient()
        # Set by ``stop``, never cleared: a signal that came before ``serve``
        # began still ends it.
        self._stopping = False
        self._wake: Callable[[], None] | None = None  # set while ``serve`` runs
        self._watcher_of_serve: BranchWatcher | None = None  # likewise
        self._steps: tuple[Callable[[_Pass], PassOutcome | None], ...] = tuple(
            getattr(self, f"_{name}") for name in PASS_STEPS
        )
        # Under verification: statuses are checked against the verified spec.
        self._status_signers = tuple(status_signers)
        self._acted_history = History(store.repository())
        self.trust = self._status_trust()

    def _status_trust(self) -> StatusTrust | None:
        """The status checks under verification (None without it)."""
        if self.approver is None:
            return None
        repo = self.store.repository()
        signers = self._status_signers
        return StatusTrust(
            self.store, self.approver, DaemonWrites(repo, signers) if signers else None
        )

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
                        outcome = self._attempt()
                    if self.memory.read_everything:
                        self.memory.read_everything = False
                        _freeze_long_lived()
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

    def _attempt(self) -> PassOutcome:
        """One attempt at a pass: the steps of ``PASS_STEPS`` in order; a step
        that returns an outcome ends the pass there (nothing to do, or a
        refusal). ``RefMoved`` from ``commit`` ends it too: nothing is sent."""
        if self.plain:
            self._forget_caches()
        current = _Pass()
        try:
            for step in self._steps:
                outcome = step(current)
                if outcome is not None:
                    return outcome
        except Exception:
            if hasattr(current, "inputs") and not hasattr(current, "step"):
                # Inputs built and never stepped: the engine's memo has not
                # seen what changed in them, so it is forgotten.
                self.memory.memo = StepMemo()
            raise
        return self._outcome(current)

    def _forget_caches(self) -> None:
        """Start from memory holding only what may not be read again: the
        tip last read (never acting on rewritten history), how long agents
        have been unreachable, metric answers, the jobs whose held reads
        are in flight, the last readable statuses, and problems logged.
        Everything else is a cache and is rebuilt by reading."""
        old = self.memory
        self.memory = DaemonMemory(
            seen_tip=old.seen_tip,
            unreachable=old.unreachable,
            metric_checks=old.metric_checks,
            held_jobs=old.held_jobs,
            last_readable=old.last_readable,
            reported=old.reported,
            answers=old.answers,
        )
        self.store.forget_history()
        self._acted_history = History(self.store.repository())
        self.trust = self._status_trust()

    def _read(self, p: _Pass) -> PassOutcome | None:
        """Read the branch tip (fetching first from a remote). Touches: the
        store's refs; ``memory.seen_tip`` and ``memory.quiet``. Ends the pass
        when history was rewritten under us, or when the last pass was quiet
        and nothing moved since."""
        store = self.store
        tip = store.refresh()
        if tip is None:
            raise StoreError(
                f"branch {store.branch!r} does not exist in {store.location}",
                "push the fleet repository's first commit, or pass --branch",
            )
        p.tip = tip
        seen = self.memory.seen_tip
        if seen and tip != seen and not store.is_descendant(tip, seen):
            message = (
                f"branch {store.branch!r} moved from {seen[:12]} to {tip[:12]}, which does "
                "not contain it: history was rewritten (a force-push?). Refusing to act on it; "
                "push a commit on top of the history the daemon has seen, or restart the daemon "
                "to accept the new history"
            )
            self._report("history_rewritten", message, commit=tip)
            return PassOutcome(tip, None, 0, 0, False, None, refused=message)
        quiet, self.memory.quiet = self.memory.quiet, None
        if (
            quiet is not None
            and quiet.tip == tip
            and store.tip(quiet.status_branch) == quiet.status_tip
            and self._approvals_tip() == quiet.approvals_tip
            and (quiet.wakeup is None or self.clock() < quiet.wakeup)
            and not self.fleet_watch.wants_pass()
            and not self.client.has_news()
        ):
            self.memory.quiet = quiet
            return quiet.outcome
        return None

    def _verify(self, p: _Pass) -> PassOutcome | None:
        """Pick the tree to act on (the verified one, with verification on,
        and never one behind the last acted on; docs/trust.md) and read
        it: its documents, the recorded statuses (holding those the verified
        spec does not back), and each rollout's engine input. Touches: the
        branch's first-parent history, the approver and the last-acted ref,
        the spec and status trees, the parse caches of ``memory``."""
        store = self.store
        p.history = history = store.history()
        history.advance(p.tip)
        p.approval = self._forward_only(self.approver.approve(p.tip)) if self.approver else None
        p.spec_commit = p.tip if p.approval is None else p.approval.verified_commit
        p.documents = documents = self._read_documents(p.spec_commit)
        self._nodes_by_name(documents.fleet)  # a new fleet's keys and pins, before any job
        p.status_branch = documents.settings.status_branch or store.branch
        p.status_tip = p.tip if p.status_branch == store.branch else store.tip(p.status_branch)
        p.statuses, p.broken = self._read_statuses(p.status_tip)
        p.ignored = dict(self.memory.status_reader.ignored)
        for path, reason in p.ignored.items():
            self._report("status_ignored", f"{path}: {reason}", path=path)
        if self.trust is not None and p.status_tip is not None:
            tampered = self.trust.hold_unwritten(p.statuses, p.status_tip)
            # Held back at the last acted commit (a backwards move), statuses
            # belong to its history, not to the refused tip's.
            chain = history
            if p.spec_commit is not None and p.spec_commit not in history:
                chain = self._acted_history
                chain.advance(p.spec_commit)
            tampered.update(self.trust.hold_tampered(p.statuses, chain, self.memory.parsed))
            for name, reason in tampered.items():
                p.broken[name] = reason
                self._report("status_tampered", reason, rollout=name)
            self._statuses_changed(None)  # held statuses leave the mapping
        built = self._inputs(p.tip, history, p.approval, documents, p.statuses, p.broken)
        p.inputs, p.input_changes = built.inputs, built.changes
        return None

    def _observe(self, p: _Pass) -> PassOutcome | None:
        """Ask the agents: unfinished jobs (resending those they do not
        know), heartbeats, backup lists. Touches: the agents over HTTP;
        ``memory.unreachable`` and ``memory.watching``."""
        # Finished rollouts at rest ask nothing: only the others are looked
        # at, and only the statuses read again are judged again.
        memory = self.memory
        changes = memory.observe_changes
        if self.plain:
            p.lively = lively = list(p.statuses.values())
        elif changes is None:
            p.lively = lively = memory.inert.lively(p.statuses)
        else:
            p.lively = lively = memory.inert.lively_changed(p.statuses, changes)
        memory.observe_changes = set()
        p.observations, p.unfinished = self._ask_agents(lively, p.documents.fleet)
        metric_checks = self._ask_prometheus(lively, p.observations, p.documents)
        if metric_checks:
            p.observations = replace(p.observations, metric_checks=metric_checks)
        return None

    def _step(self, p: _Pass) -> PassOutcome | None:
        """Step every rollout through the engine with one ``now``. Touches:
        nothing outside the engine's values (and ``memory.memo``)."""
        p.now = self.clock()
        held = self._held_by_unreadable(p.broken, p.statuses, p.documents)
        p.step = engine.step_fleet(
            p.inputs,
            p.documents.fleet,
            p.documents.settings,
            p.observations,
            p.now,
            unreadable=held,
            memo=self.memory.memo,
            changed=p.input_changes,
        )
        crashpoints.reach("after_step")
        # A copy updated, not {**a, **b}: the same dict, without inserting
        # thousands of statuses one by one.
        p.merged = p.statuses.copy()
        p.merged.update(p.step.statuses)
        return None

    def _fleet(self, p: _Pass) -> PassOutcome | None:
        """Start a fleet sweep when one is due, and decide what the newest
        finished sweep shows (``engine.fleet``), with the desired state from
        the statuses this pass holds. Touches: the fleet watch (a sweep
        thread); ``status/fleet.yaml`` at the status tip (one blob, cached)."""
        settings = p.documents.settings
        fleet = p.documents.fleet
        self.fleet_watch.tick(
            lambda: [(n.agent, n.name) for n in fleet.nodes], settings.fleet_check_interval
        )
        p.fleet_before = p.fleet = self._fleet_at(p.status_tip)
        p.fleet_files = None
        self.fleet_watch.context(p.fleet_before, p.merged, settings.offline_after)
        p.fleet_sweep = sweep = self.fleet_watch.pending()
        if sweep is None:
            return None
        if sweep.decided is not None and sweep.base is p.fleet_before:
            new, p.fleet_files = sweep.decided, sweep.files  # decided in the sweep's thread
        else:  # the fleet status changed since: decide against the one read now
            new = fleet_rules.next_fleet(
                p.fleet_before,
                sweep.sightings,
                fleet_rules.desired_state(p.merged.values()),
                settings.offline_after,
                sweep.finished,
            )
        if new is p.fleet_before or (p.fleet_before is None and not new.nodes):
            self.fleet_watch.applied(sweep)  # nothing to commit
            p.fleet_sweep = None
        p.fleet = new
        self._fleet_gauges(new)
        return None

    def _commit(self, p: _Pass) -> PassOutcome | None:
        """If any status changed, write the changed status files and the
        dashboard in one commit on the tip read, moving the branch only if it
        still points there. Touches: the status branch (one commit, or
        ``RefMoved``); the status caches of ``memory``; logs and metrics."""
        p.commit = None
        written: dict[str, Any] = {}  # status path -> the plain data written there
        pieces: dict[str, tuple[bytes, ...]] = {}  # the dashboard's, for the store
        changes = self._status_changes(
            p.statuses,
            p.step,
            p.merged,
            p.broken,
            p.ignored,
            p.status_tip,
            p.fleet,
            p.documents.fleet.nodes,
            written,
            pieces,
        )
        fleet_changes: tuple[fleet_rules.FleetChange, ...] = ()
        fleet_written = p.fleet is not None and p.fleet != p.fleet_before
        if p.fleet is not None and fleet_written:
            files = p.fleet_files
            changes.update(
                files if files is not None else fleet_file_changes(p.fleet_before, p.fleet)
            )
            fleet_changes = fleet_rules.fleet_changes(p.fleet_before, p.fleet)
        if changes:
            message = _commit_message(p.step, p.spec_commit, p.broken, fleet_changes)
            p.commit = self.store.commit(
                p.status_branch, p.status_tip, changes, message, sign=self.sign, pieces=pieces
            )
            if p.status_tip is not None and p.status_tip == self.memory.status_reader.at:
                self.memory.own_status_write = (
                    p.status_tip,
                    p.commit,
                    frozenset(path for path in changes if path.startswith(STATUS_DIR + "/")),
                )
            if p.status_branch == self.store.branch and self._watcher_of_serve is not None:
                # Before the ref's file event reaches the watcher: not a hint.
                self._watcher_of_serve.acted_on(p.status_branch, p.commit)
            if DASHBOARD_PATH in changes:
                # What was just written is what the next pass compares with.
                written_id = self.store.file_blob(p.commit, DASHBOARD_PATH)
                dashboard = changes[DASHBOARD_PATH]
                if written_id is not None and dashboard is not None:
                    self.memory.dashboard = (written_id, dashboard)
            self._committed(p.step, p.commit)
            self._fleet_committed(fleet_changes, p.commit)
            if p.fleet is not None and fleet_written:
                # What was just written is what the next pass reads.
                self.memory.fleet_reader.remember(self.store, p.commit, p.fleet)
            self.memory.status_reader.remember(self.store, p.commit, written, p.step.statuses)
            crashpoints.reach("after_push")
        if p.fleet_sweep is not None:
            self.fleet_watch.applied(p.fleet_sweep)
        return None

    def _notify(self, p: _Pass) -> PassOutcome | None:
        """Hand the notifier the events the committed statuses made true
        (docs/operating.md), and on the first pass the events still true;
        it queues them and returns at once. Touches: the notifier's queues
        and, when the settings changed, its receivers."""
        notifier = self.notifier
        if notifier is None:
            return None
        if not any(problem.path == SETTINGS_PATH for problem in p.documents.problems):
            notifier.reconfigure(p.documents.settings.notifications, self.environ)
        events: list[notification_events.Event] = []
        if not self._announced:
            self._announced = True
            commit = p.commit or p.status_tip or p.tip
            for status in p.statuses.values():
                events += notification_events.standing_rollout_events(status, p.now, commit)
            events += notification_events.standing_fleet_events(
                _fleet_states(p.fleet_before), commit
            )
        if p.commit is not None:
            for name, new in p.step.statuses.items():
                events += notification_events.rollout_events(p.statuses.get(name), new, p.commit)
            if p.fleet is not None and p.fleet != p.fleet_before:
                events += notification_events.fleet_events(
                    _fleet_states(p.fleet_before), _fleet_states(p.fleet), p.commit
                )
        notifier.publish(events)
        return None

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

    def _send(self, p: _Pass) -> PassOutcome | None:
        """Only now, send the jobs the committed status records. Touches: the
        agents over HTTP; logs and metrics."""
        p.sent = self._execute(p.step.effects, p.documents.fleet, p.now)
        self._watch_jobs(p)
        self._watch_heartbeats(p)
        return None

    def _watch_heartbeats(self, p: _Pass) -> None:
        """While ``serve`` runs, keep a held heartbeat read in flight for every
        live node whose apply is seen succeeded and still waits for its
        verdict (checks and their soak, docs/health.md), so that a pass starts
        when its heartbeat changes, or when its soak should end, rather than
        at the interval. The passes still read those heartbeats as before."""
        wake = self._wake
        if wake is None:
            return
        nodes = self._nodes_by_name(p.documents.fleet)
        watches: list[HeartbeatWatch] = []
        # A status with a dispatched node is lively (it has a job in flight)
        # or was just changed: the thousands of inert ones are not looked at.
        candidates = {status.name: status for status in p.lively}
        candidates.update(p.step.statuses)
        for status in candidates.values():
            frozen = status.frozen
            if frozen is None or not frozen.live or status.phase not in ("running", "paused"):
                continue
            soak = frozen.health.soak if frozen.health is not None else 0
            for record in status.nodes:
                if record.state != "dispatched":
                    continue  # most records: looked up no further
                seen = p.observations.jobs.get(record.job_id or "")
                beat = p.observations.heartbeats.get(record.name)
                spec = nodes.get(record.name)
                if seen is None or seen.state != "succeeded" or beat is None or spec is None:
                    continue
                watches.append(
                    HeartbeatWatch(
                        spec.agent,
                        record.name,
                        beat.time,
                        heartbeat_content(beat),
                        _until_soaked(beat, record.job_id or "", soak),
                    )
                )
        self.client.watch_heartbeats(watches, wake)

    def _watch_jobs(self, p: _Pass) -> None:
        """While ``serve`` runs, keep a held read in flight for every job
        sent and not finished, so that a pass starts as soon as one finishes
        rather than at the interval (README "Event-driven observation")."""
        wake = self._wake
        if wake is None:
            return
        nodes = self._nodes_by_name(p.documents.fleet)
        sent = [(nodes[job.node].agent, job) for job in p.step.effects if job.node in nodes]
        self.client.watch_jobs(p.unfinished + sent, wake)

    def _outcome(self, p: _Pass) -> PassOutcome:
        """What the pass did, for the loop; remembers a quiet pass."""
        step, merged = p.step, p.merged
        self.memory.seen_tip = (
            p.commit if p.commit and p.status_branch == self.store.branch else p.tip
        )
        self._update_gauges(merged, step)
        # The statuses observed as lively, as the step left them, and those it changed.
        lively = [s for s in p.lively if s.name not in step.statuses]
        if self.plain:
            lively += step.statuses.values()
        else:
            lively += self.memory.inert.lively(step.statuses, every=False)
        outcome = PassOutcome(
            tip=p.tip,
            commit=p.commit,
            transitions=len(step.transitions),
            jobs_sent=p.sent,
            # The statuses just changed first: usually one of them is active,
            # and then the thousands of unchanged ones need not be looked at.
            active=any(needs_passes(s) for s in step.statuses.values())
            or any(needs_passes(s) for s in lively),
            wakeup=engine.next_wakeup(lively),
            job_ids=tuple(job.job_id for job in step.effects),
        )
        if p.commit is None and not p.sent and not step.transitions and not self.memory.watching:
            # Jobs answered by held answers only: quiet until one of those
            # is too old to stand in for a read, or a held read ends.
            wakeup, held_until = outcome.wakeup, self.memory.held_until
            if held_until is not None and (wakeup is None or held_until < wakeup):
                wakeup = held_until
            self.memory.quiet = _Quiet(
                p.tip, p.status_branch, p.status_tip, wakeup, outcome, self._approvals_tip()
            )
        return outcome

    def _approvals_tip(self) -> str | None:
        """A new approval moves no branch, only the notes ref: a quiet pass
        is quiet only while that stays too (docs/trust.md)."""
        if self.approver is None or not self.approver.required_approvals:
            return None
        return notes_tip(self.store.repository())

    def _forward_only(self, approval: Approval) -> Approval:
        """Refuse a verified commit that does not descend by first parent from
        the one last acted on (kept in ``approval.ACTED_REF``); record a new
        one that does."""
        repo = self.store.repository()
        acted = last_acted(repo, self.store.branch)
        verified = approval.verified_commit
        if acted is None or verified == acted:
            if verified is not None and acted is None:
                record_acted(repo, self.store.branch, verified)
            return approval
        forward = False
        if verified is not None:
            key = (verified, acted)
            known = self.memory.descends.get(key)
            if known is None:
                known = descends_by_first_parent(repo, verified, acted)
                if len(self.memory.descends) > 1000:
                    self.memory.descends.clear()
                self.memory.descends[key] = known
            forward = known
        if forward and verified is not None:
            record_acted(repo, self.store.branch, verified)
            return approval
        held = refuse_backwards(approval, acted, moves_forward=False)
        self._report("verified_moved_back", held.refusals[0].reason, commit=verified or "")
        return held

    # -- reading -------------------------------------------------------------

    def _parse(self, blob_id: str, path: str) -> ParsedFile:
        parsed = self.memory.parsed.get(blob_id)
        if parsed is None or parsed.path != path:
            parsed = parse_file(path, self.store.blob(blob_id))
            self.memory.parsed[blob_id] = parsed
        return parsed

    def _read_documents(self, commit: str | None) -> Documents:
        """The documents of ``commit``'s tree; reassembled only when a spec
        subtree changed, and then only for the files that changed since the
        commit read last (``git.history.changed_paths``, rewinds included;
        ``spec.documents.Assembly`` falls back to every file when a node,
        the settings or a rule across files is involved); reparsed only for
        blobs not seen before."""
        store = self.store
        memory = self.memory
        if commit is None:
            key: tuple[str | None, ...] = (None,)
        else:
            key = (
                *(store.subtree_id(commit, folder) for folder in SPEC_FOLDERS),
                store.file_blob(commit, SETTINGS_PATH),
            )
        if memory.documents and memory.documents[0] == key:
            memory.spec_changed = frozenset()
            return memory.documents[1]
        before = memory.documents_commit
        paths = (
            self._changed_paths(before, commit, (*SPEC_FOLDERS, *SPEC_FILES))
            if commit is not None and before is not None and memory.assembly.documents is not None
            else None
        )
        if commit is not None and paths is not None:
            changed: dict[str, ParsedFile | None] = {}
            for path in paths:
                if not is_spec_path(path):
                    continue  # nested deeper than the daemon reads
                old_blob = memory.spec_blobs.pop(path, None)
                if old_blob is not None:
                    memory.parsed.pop(old_blob, None)
                blob_id = store.file_blob(commit, path)
                if blob_id is None:
                    changed[path] = None
                else:
                    memory.spec_blobs[path] = blob_id
                    changed[path] = self._parse(blob_id, path)
            documents = memory.assembly.update(changed)
            memory.spec_changed = memory.assembly.changed_names
        else:
            memory.spec_changed = None
            memory.read_everything = True
            blobs = store.spec_files(commit) if commit is not None else {}  # path -> blob id
            documents = memory.assembly.rebuild(
                self._parse(blob_id, path) for path, blob_id in blobs.items()
            )
            memory.spec_blobs = blobs
        if len(memory.parsed) > 2 * len(memory.spec_blobs) + REQUEST_WALK:
            # Old versions parsed for rollback requests' history: forgotten.
            live = set(memory.spec_blobs.values())
            for blob_id in [b for b in memory.parsed if b not in live]:
                del memory.parsed[blob_id]
        for problem in documents.problems:
            self._report("invalid_document", str(problem), path=problem.path)
        memory.documents = (key, documents)
        memory.documents_commit = commit
        return documents

    def _changed_paths(
        self, before: str | None, commit: str | None, paths: tuple[str, ...]
    ) -> frozenset[str] | None:
        """The files under ``paths`` (folders, and top-level files) that
        differ between the commit read last and ``commit``; None when the
        commit read last is gone (a mirror's objects after a force-push):
        then everything is read again."""
        folders = tuple(p for p in paths if p not in SPEC_FILES)
        files = tuple(p for p in paths if p in SPEC_FILES)
        try:
            return self.store.changed_paths(before, commit, folders, files)
        except StoreError as exc:
            self.log.info("read_everything", f"{exc}; reading every file again")
            return None

    def _read_statuses(self, commit: str | None) -> tuple[dict[str, RolloutStatus], dict[str, str]]:
        """Recorded statuses by rollout name, and the names whose status
        files cannot be read (with why): those are held, never overwritten."""
        reader = self.memory.status_reader
        # After its own commit on the statuses read last, the daemon knows
        # what changed up to that commit: only what came after is compared
        # (one tree id, unless someone else wrote status files since).
        base, written = reader.at, frozenset[str]()
        own, self.memory.own_status_write = self.memory.own_status_write, None
        if own is not None and own[0] == reader.at:
            _, base, written = own
        changed = (
            self._changed_paths(base, commit, (STATUS_DIR,))
            if commit is not None and base is not None
            else None
        )
        if changed is not None:
            changed |= written
        if changed is not None:
            # Only the rollouts whose status files changed since the last
            # read are read again (a rewind is a change like any other).
            statuses, broken = reader.read_changed(self.store, commit, changed)
            self.memory.status_changed = reader.changed_names
        else:
            statuses, broken = reader.read(self.store, commit)
            self.memory.status_changed = None
            self.memory.read_everything = True
        self._statuses_changed(self.memory.status_changed)
        for name, reason in broken.items():
            self._report(
                "status_unreadable",
                f"{reason}; the rollout is held and its status file is left as it is: "
                f"restore it with `git revert` or delete {status_path(name)} to start the "
                "rollout anew",
                rollout=name,
            )
        return statuses, broken

    def _statuses_changed(self, names: Iterable[str] | None) -> None:
        """Tell ``observe`` and the gauges which rollouts' recorded statuses
        may differ from what they looked at last (None: any)."""
        memory = self.memory
        if names is None:
            memory.observe_changes = memory.gauge_changes = None
            memory.dashboard_changes = memory.readable_changes = None
            return
        for changes in (
            memory.observe_changes,
            memory.gauge_changes,
            memory.dashboard_changes,
            memory.readable_changes,
        ):
            if changes is not None:
                changes.update(names)

    def _held_by_unreadable(
        self,
        broken: Mapping[str, str],
        statuses: Mapping[str, RolloutStatus],
        documents: Documents,
    ) -> dict[str, tuple[str, ...]]:
        """The nodes each rollout with an unreadable status may hold: those
        of its last readable status (remembered since start-up) and those
        its spec selects. Nobody else starts on them until it is repaired."""
        memory = self.memory
        changed = memory.readable_changes
        if changed is None:
            memory.last_readable.update(statuses)
        else:  # only the statuses read again can be new
            for name in changed:
                status = statuses.get(name)
                if status is not None:
                    memory.last_readable[name] = status
        memory.readable_changes = set()
        held: dict[str, tuple[str, ...]] = {}
        for name in broken:
            last = self.memory.last_readable.get(name)
            nodes = {n.name for n in last.nodes} if last is not None else set()
            spec = documents.rollouts.get(name)
            if spec is not None:
                nodes.update(engine.resolve_nodes(spec, documents.fleet))
            held[name] = tuple(sorted(nodes))
        return held

    def _inputs(
        self,
        tip: str,
        history: History,
        approval: Approval | None,
        documents: Documents,
        statuses: Mapping[str, RolloutStatus],
        broken: Mapping[str, str],
    ) -> BuiltInputs:
        """Each rollout's engine input (``inputs.InputCache``), from this
        pass's values and what the readers found changed."""
        unverified: set[str] = set()
        if approval is not None and approval.refusals:
            # Rollouts seen only in the unverified tree still get a status
            # that says why nothing happens (docs/trust.md); only valid
            # names: another path can own no status file.
            for path in self.store.files(tip, ROLLOUTS_DIR):
                name = name_in(ROLLOUTS_DIR, path)
                if name is not None:
                    unverified.add(name)
        context = InputContext(
            tip=tip,
            history=history,
            source=self.store,
            parse=self._parse,
            refusal=_refusal_text(approval),
            approved_by=self._approved_by(approval),
            unverified=frozenset(unverified),
            settings_change=history.last_change(SETTINGS_PATH),
        )
        memory = self.memory
        return memory.inputs.build(
            context,
            documents,
            statuses,
            broken,
            (memory.spec_changed, memory.status_changed),
            look_at_every=self.trust is not None,
        )

    def _approved_by(self, approval: Approval | None) -> tuple[ApprovalRecord, ...]:
        """Who approved the verified commit acted on (section 17), when
        approvals are required; () otherwise."""
        approver = self.approver
        if approver is None or not approver.required_approvals or approval is None:
            return ()
        verified = approval.verified_commit
        if verified is None:
            return ()
        return tuple(
            ApprovalRecord(a.principal, a.key_id) for a in approver.approvals(verified).counted
        )

    # -- observing -----------------------------------------------------------

    def _ask_agents(
        self, statuses: Iterable[RolloutStatus], fleet: Fleet
    ) -> tuple[Observations, list[tuple[str, SendJob]]]:
        """Read every unfinished job, resend those the agent does not know
        (same id, same payload, fresh signature), and read the heartbeats
        and backup lists the engine needs. Failures are observations. Also
        returns the jobs the agents said are accepted or running."""
        statuses = list(statuses)
        nodes = self._nodes_by_name(fleet)
        now = self.clock()
        reachable: dict[str, bool] = {}

        def address(node: str) -> str | None:
            spec = nodes.get(node)
            return spec.agent if spec is not None else None

        in_flight = engine.in_flight(statuses)
        wanted_heartbeats = engine.wanted_heartbeats(statuses)
        wanted_backups = engine.wanted_backups(statuses)
        finished = self.memory.finished_jobs
        wanted_ids = {job.job_id for job in in_flight}
        for job_id in [j for j in finished if j not in wanted_ids]:
            del finished[job_id]
        observed: dict[str, JobObservation] = {
            job.job_id: finished[job.job_id] for job in in_flight if job.job_id in finished
        }
        jobs = [
            (url, job)
            for job in in_flight
            if job.job_id not in finished and (url := address(job.node))
        ]
        unknown: list[tuple[str, SendJob]] = []
        unverified: dict[str, str] = {}

        def believed(node: str, seen: JobObservation) -> JobObservation:
            seen, problem = self.memory.answers.job(nodes.get(node), seen)
            if problem:
                self._unverified(node, "job", problem, unverified)
            return seen

        # Finished records the held reads brought are the answers a read
        # would get now (an agent never changes a finished record). Jobs
        # waiting on their held reads are not asked (``_waiting_on_held``).
        # Only the other jobs are asked.
        held, in_wait = self.client.take_held(job.job_id for _, job in jobs)
        waiting = self._waiting_on_held(statuses, jobs, in_wait, now)
        asked = [
            (url, job) for url, job in jobs if job.job_id not in held and job.job_id not in waiting
        ]
        self.memory.watching = bool(asked or wanted_heartbeats or wanted_backups)
        kept = self.memory.held_jobs
        answers: dict[str, JobObservation | None] = {**held, **self.client.read_jobs(asked)}
        for (url, job), (job_id, seen) in zip(jobs, _ordered(answers, jobs), strict=True):
            if job_id in waiting:
                continue  # not observed this pass
            if seen is None:
                unknown.append((url, job))
                reachable[job.node] = True
                continue
            seen = believed(job.node, seen)
            if seen.state in ("accepted", "running"):
                kept[job_id] = now
            observed[job_id] = seen
            reachable[job.node] = reachable.get(job.node, False) or seen.state != "unreachable"
            if seen.state == "succeeded" and job.kind == "apply":
                finished[job_id] = seen
        if unknown:
            node_of = {job.job_id: job.node for _, job in unknown}
            for job_id, answer in self.client.send_jobs(unknown, now).items():
                observed[job_id] = believed(node_of[job_id], answer)
            self.log.info("resent", f"{len(unknown)} job(s) the agents did not know, sent again")
            self.metrics.jobs_sent.labels(kind="resend").inc(len(unknown))
        # Heartbeats read right after a held read saw a live apply succeed
        # are newer than that job, as a read now would be: the others are asked.
        read_ahead: dict[str, Heartbeat | None] = dict(
            self.client.take_heartbeats(wanted_heartbeats)
        )
        heartbeat_nodes = [
            (url, n) for n in wanted_heartbeats if n not in read_ahead and (url := address(n))
        ]
        heartbeats: dict[str, Heartbeat] = {}
        for node, beat in {**read_ahead, **self.client.read_heartbeats(heartbeat_nodes)}.items():
            if beat is not None:
                beat, problem = self.memory.answers.heartbeat(nodes.get(node), beat)
                if problem:
                    self._unverified(node, "heartbeat", problem, unverified)
            if beat is not None:
                heartbeats[node] = beat
            reachable[node] = reachable.get(node, False) or beat is not None
        backup_nodes = [(url, n) for n in wanted_backups if (url := address(n))]
        backups = {
            node: listed
            for node, listed in self.client.read_backups(backup_nodes).items()
            if listed is not None
        }
        for node, ok in reachable.items():
            if ok:
                self.memory.unreachable.pop(node, None)
            else:
                self.memory.unreachable.setdefault(node, now)
        unfinished = [
            (url, job)
            for url, job in jobs
            if job.job_id in waiting
            or (
                (seen := observed.get(job.job_id)) is not None
                and seen.state in ("accepted", "running")
            )
        ]
        observations = Observations(
            jobs=observed,
            heartbeats=heartbeats,
            unreachable_since=dict(self.memory.unreachable),
            backups=backups,
            unverified=unverified,
        )
        return observations, unfinished

    def _waiting_on_held(
        self,
        statuses: Sequence[RolloutStatus],
        jobs: Sequence[tuple[str, SendJob]],
        in_wait: set[str],
        now: datetime,
    ) -> set[str]:
        """The jobs left unobserved this pass: applies whose held read is in
        flight and whose agent answered them accepted or running less than
        HELD_ANSWER_SECONDS ago. The engine judges an unobserved apply as one
        accepted or running (it waits for it) as long as its deadline has not
        passed and its node is not counted unreachable (a node gone from the
        fleet is not asked either way); any other job is asked. Nothing is believed without a read: an answer
        that is not evidence is found when it is read, at its finish or once
        it is this old. Sets ``memory.held_until``."""
        kept = self.memory.held_jobs
        for job_id in [j for j in kept if j not in in_wait]:
            del kept[job_id]
        self.memory.held_until = None
        if not kept:
            return set()
        deadlines = {
            record.job_id: record.deadline
            for status in statuses
            for record in status.nodes
            if record.state == "dispatched" and record.job_id in kept
        }
        waiting: set[str] = set()
        until: datetime | None = None
        for _, job in jobs:
            since = kept.get(job.job_id)
            deadline = deadlines.get(job.job_id)
            if (
                since is None
                or (now - since).total_seconds() >= HELD_ANSWER_SECONDS
                or job.kind != "apply"
                or deadline is None
                or now >= deadline
                or job.node in self.memory.unreachable
            ):
                continue
            waiting.add(job.job_id)
            expires = since + timedelta(seconds=HELD_ANSWER_SECONDS)
            until = expires if until is None or expires < until else until
        self.memory.held_until = until
        return waiting

    def _unverified(self, node: str, kind: str, problem: str, found: dict[str, str]) -> None:
        """An answer not believed: counted, logged once per problem, and
        handed to the engine, which names the node in a status condition."""
        found.setdefault(node, problem)
        self.metrics.unverified_answers.labels(kind=kind).inc()
        self._report(
            "unverified_evidence",
            f"answer ({kind}) of node {node} is no evidence: {problem}",
            node=node,
        )

    def _ask_prometheus(
        self,
        statuses: Iterable[RolloutStatus],
        observed: Observations,
        documents: Documents,
    ) -> dict[tuple[str, str], MetricCheck]:
        """Ask Prometheus each prometheus check of every node whose job has
        finished successfully (section 11) and fold the answers into memory;
        memory of checks no longer wanted is dropped."""
        wanted = [
            (node, job_id, check)
            for node, job_id, check in engine.wanted_metric_checks(statuses)
            if (job := observed.jobs.get(job_id)) is not None and job.state == "succeeded"
        ]
        memory = self.memory.metric_checks
        keep = {(node, check.name) for node, _, check in wanted}
        for key in [k for k in memory if k not in keep]:
            del memory[key]
        url = documents.settings.prometheus_url
        if not wanted or url is None:
            return dict(memory)
        queries = {
            (node, check.name): for_node(check.prometheus.query, node)
            for node, _, check in wanted
            if check.prometheus is not None
        }
        answers = self.prometheus.query_all(url, queries.values())
        now = self.clock()
        for node, job_id, check in wanted:
            key = (node, check.name)
            memory[key] = fold_metric_answer(
                memory.get(key), check, job_id, answers[queries[key]], now
            )
        # Logged when a run of answers without evidence begins, not every pass.
        for (node, name), state in memory.items():
            if state.error_since == now:
                self.log.warning(
                    "prometheus_error",
                    f"check {name} of node {node} has no evidence: {state.detail}",
                    url=url,
                )
        return dict(memory)

    # -- writing -------------------------------------------------------------

    def _status_changes(
        self,
        old: Mapping[str, RolloutStatus],
        step: FleetStep,
        merged: Mapping[str, RolloutStatus],
        broken: Mapping[str, str],
        ignored: Mapping[str, str],
        parent: str | None,
        fleet: FleetStatus | None,
        nodes: Sequence[Node],
        written: dict[str, Any],
        pieces: dict[str, tuple[bytes, ...]],
    ) -> dict[str, bytes | None]:
        """The files of every changed status, and the dashboard if its text
        changed; empty when nothing changed, so an idle pass commits nothing.
        The plain data of each status file written goes into ``written``;
        the dashboard's text in pieces, when written, into ``pieces``."""
        changes: dict[str, bytes | None] = {}
        for name, new in step.statuses.items():
            write, gone = status_values.changed_files(old.get(name), new)
            for path, data in write.items():
                changes[path] = self.memory.status_texts.write(new, path, data)
                written[path] = data
            for path in gone:
                changes[path] = None
        # Only the rollouts whose status may differ from the last drawing
        # are looked at: read again, or changed by this step or that one.
        memory = self.memory
        drawn = memory.dashboard_changes
        names = drawn.union(memory.drawn_step, step.statuses) if drawn is not None else None
        dashboard = _dashboard(
            merged, broken, fleet, memory.dashboard_order, nodes, names, ignored=ignored
        )
        memory.dashboard_changes = set()
        memory.drawn_step = frozenset(step.statuses)
        # Encoded in pieces: the table's unchanged blocks are kept encoded.
        parts = dashboard.pieces()
        text = b"".join(parts)
        current = self.store.file_blob(parent, DASHBOARD_PATH) if parent else None
        if current is None or self._dashboard_text(current) != text:
            changes[DASHBOARD_PATH] = text
            pieces[DASHBOARD_PATH] = parts
        return changes

    def _dashboard_text(self, blob_id: str) -> bytes:
        """The dashboard blob's content; the last one read is kept (it is
        large at thousands of rollouts, and mostly the same blob)."""
        kept = self.memory.dashboard
        if kept is None or kept[0] != blob_id:
            kept = self.memory.dashboard = (blob_id, self.store.blob(blob_id))
        return kept[1]

    def _committed(self, step: FleetStep, commit: str) -> None:
        self.metrics.commits.inc()
        self.log.info_many(
            (
                "transition",
                f"{t.from_state} -> {t.to_state}" + (f" ({t.reason})" if t.reason else ""),
                {"rollout": t.rollout, "node": t.node, "commit": commit[:12]},
            )
            for t in step.transitions
        )
        for state, count in Counter(t.to_state for t in step.transitions if t.node).items():
            self.metrics.verdicts.labels(state=state).inc(count)

    def _execute(self, effects: Iterable[SendJob], fleet: Fleet, now: datetime) -> int:
        """Send the jobs the committed status records, all at once. Their
        answers are not needed: the next pass reads every unfinished job
        anyway, but one accepted or running spares that read while the
        job's held read is in flight (``memory.held_jobs``).
        Crash point ``mid_send``: half of the answers are in."""
        nodes = self._nodes_by_name(fleet)
        jobs = [(nodes[job.node].agent, job) for job in effects if job.node in nodes]
        if not jobs:
            return 0
        answers = self.client.send_jobs(
            jobs, now, halfway=lambda: crashpoints.reach("mid_send"), on_finished=self._wake
        )
        kept = self.memory.held_jobs
        lines: list[tuple[str, str, dict[str, str]]] = []
        for url, job in jobs:
            answer = answers.get(job.job_id)
            if answer is not None and answer.state in ("accepted", "running"):
                # Taken: it need not be asked while its held read is in flight.
                kept[job.job_id] = now
            lines.append(
                (
                    "sent",
                    f"{job.kind} attempt {job.attempt}: "
                    f"{answer.state if answer else 'unreachable'}",
                    {
                        "rollout": job.rollout,
                        "node": job.node,
                        "job": job.job_id,
                        "commit": job.source_commit[:12],
                        "agent": url,
                    },
                )
            )
        self.log.info_many(lines)
        for kind, count in Counter(job.kind for _, job in jobs).items():
            self.metrics.jobs_sent.labels(kind=kind).inc(count)
        return len(jobs)

    def _believed_heartbeat(self, node: str, beat: Heartbeat) -> bool | None:
        """The fleet watch's agentKey check (docs/trust.md and docs/operating.md), from the
        sweep's thread: None for a node without agentKey, else whether the
        heartbeat's evidence verifies against it."""
        known = self.memory.by_name
        spec = known[1].get(node) if known is not None else None
        if spec is None or spec.agent_key is None:
            return None
        _, problem = self.memory.answers.heartbeat(spec, beat)
        return not problem

    def _nodes_by_name(self, fleet: Fleet) -> dict[str, Node]:
        """``fleet.by_name()``, built once per fleet (documents are cached
        while the spec trees stay the same, and with them the fleet)."""
        if self.memory.by_name is None or self.memory.by_name[0] is not fleet:
            self.memory.by_name = (fleet, fleet.by_name())
            # The certificate pins go with the fleet they were read from (docs/trust.md).
            self.client.set_pins(
                {n.agent: n.agent_cert_sha256 for n in fleet.nodes if n.agent_cert_sha256}
            )
            self.memory.answers.use_fleet(self.memory.by_name[1])
        return self.memory.by_name[1]

    # -- reporting -----------------------------------------------------------

    def _report(self, event: str, message: str, **fields: Any) -> None:
        """Log a standing problem once, not on every pass."""
        if message in self.memory.reported:
            return
        self.memory.reported.add(message)
        if len(self.memory.reported) > 10_000:
            self.memory.reported.clear()
        self.log.warning(event, message, **fields)

    # -- the fleet watch -----------------------------------------------------

    def _fleet_at(self, commit: str | None) -> FleetStatus | None:
        """``status/fleet.yaml`` at ``commit``, parsed once per blob. A file
        that is not a fleet status is reported and replaced by the next
        decision: it is the daemon's record, not an operator's input."""
        try:
            return self.memory.fleet_reader.read(self.store, commit)
        except ValueError as exc:
            self._report(
                "fleet_status_unreadable",
                f"{exc}; the next sweep's decision replaces {FLEET_STATUS_PATH}",
            )
            return None

    def _swept(self, sweep: Sweep) -> None:
        self.metrics.fleet_sweeps.inc()
        self.metrics.fleet_sweep_seconds.observe(sweep.seconds)

    def _fleet_gauges(self, fleet: FleetStatus) -> None:
        for state, count in fleet.counts().items():
            self.metrics.fleet_nodes.labels(state=state).set(count)

    def _fleet_committed(self, changes: Sequence[fleet_rules.FleetChange], commit: str) -> None:
        """One log line per node state change (nodes listed ``ok`` for the
        first time are counted in one line); ``node_offline`` and
        ``node_drift`` are the notification events' names (section 13)."""
        first_ok = [c for c in changes if c.from_state is None and c.to_state == "ok"]
        if first_ok:
            self.log.info("fleet_listed", f"{len(first_ok)} node(s) listed ok", commit=commit[:12])
        for change in changes:
            if change.from_state is None and change.to_state == "ok":
                continue
            event = fleet_rules.FLEET_EVENTS.get(change.to_state or "", "node_state")
            text = f"{change.from_state or 'new'} -> {change.to_state or 'gone'}"
            if change.detail:
                text += f": {change.detail}"
            log = self.log.warning if change.to_state in fleet_rules.FLEET_EVENTS else self.log.info
            log(event, text, node=change.node, commit=commit[:12])

    def _update_gauges(self, merged: Mapping[str, RolloutStatus], step: FleetStep) -> None:
        """Rollouts by phase, counted again only for the rollouts whose
        status changed since the last count: read again, or changed by
        this step or the one before (whose statuses that count included)."""
        memory = self.memory
        changes = memory.gauge_changes
        if changes is None:
            memory.phases = {name: status.phase for name, status in merged.items()}
            memory.phase_counts = Counter(memory.phases.values())
        else:
            phases, counts = memory.phases, memory.phase_counts
            for name in changes.union(memory.gauged_step, step.statuses):
                old = phases.pop(name, None)
                if old is not None:
                    counts[old] -= 1
                status = merged.get(name)
                if status is not None:
                    phases[name] = status.phase
                    counts[status.phase] += 1
        memory.gauge_changes = set()
        memory.gauged_step = frozenset(step.statuses)
        shown = dict.fromkeys(status_values.PHASES, 0)
        shown.update((phase, n) for phase, n in memory.phase_counts.items() if n)
        for phase, count in shown.items():
            if memory.phases_shown.get(phase) != count:  # the gauge holds it already
                self.metrics.rollouts.labels(phase=phase).set(count)
        memory.phases_shown = shown

    # -- the loop ------------------------------------------------------------

    def serve(self, watcher: BranchWatcher, *, interval: float, reread: float = 60.0) -> None:
        """Pass, then sleep until the branch changes, the next deadline, or
        the interval while a rollout is active; until ``stop``. Errors that
        a retry can fix are logged and retried with backoff."""
        self._watcher = watcher
        self._watcher_of_serve = watcher
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
            watcher.acted_on(self.store.branch, self.memory.seen_tip)
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
        self._watcher_of_serve = None
        self.client.watch_jobs([], lambda: None)  # no held reads outlive the loop
        self.client.watch_heartbeats([], lambda: None)
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
        watcher = getattr(self, "_watcher", None)
        if watcher is not None:
            watcher.stop()
        self.fleet_watch.stop(timeout=0)


def _freeze_long_lived() -> None:
    """After a pass that read every file: what it parsed (documents,
    statuses, their caches) lives as long as the daemon, so it is moved out
    of the garbage collector's generations (``gc.freeze``), whose full
    collections would otherwise walk it again and again (about 150 ms at
    5,000 rollouts, every few passes). Unfrozen and collected first, so
    what an earlier full read kept and has let go since is freed."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _fleet_states(fleet: FleetStatus | None) -> dict[str, notification_events.NodeState]:
    """Each node's (state, since) in ``status/fleet.yaml``: what fleet
    events are keyed by (docs/operating.md)."""
    return {n.name: (n.state, n.since) for n in fleet.nodes} if fleet is not None else {}


def _until_soaked(beat: Heartbeat, job_id: str, soak: int) -> float:
    """Seconds (agent clock) from ``beat`` until every agent check of
    ``job_id`` it reports has held for ``soak``, if all hold now; else the
    daemon's usual wait. A little over, so the answer shows it soaked."""
    checks = [c for c in beat.checks if c.job_id == job_id]
    if not checks or not all(c.ok and c.ok_since for c in checks):
        return float(DAEMON_WAIT_SECONDS)
    try:
        at = parse_time(beat.time)
        since = max(parse_time(c.ok_since or "") for c in checks)
    except ValueError:
        return float(DAEMON_WAIT_SECONDS)
    left = (since + timedelta(seconds=soak) - at).total_seconds()
    return min(max(left + SOAK_MARGIN, SOAK_MARGIN), float(DAEMON_WAIT_SECONDS))


def _ordered(
    answers: Mapping[str, JobObservation | None], jobs: list[tuple[str, SendJob]]
) -> list[tuple[str, JobObservation | None]]:
    return [(job.job_id, answers.get(job.job_id)) for _, job in jobs]


def _refusal_text(approval: Approval | None) -> str | None:
    if approval is None or not approval.refusals:
        return None
    newest = approval.refusals[0]
    fallback = (
        f"acting on {approval.verified_commit[:12]}, the newest verified change"
        if approval.verified_commit
        else "no verified change yet, so nothing is acted on"
    )
    if not newest.author:  # a backwards move, not a commit's signature
        return f"{newest.reason}; {fallback.replace('the newest verified', 'the last verified')}"
    return (
        f"commit {newest.commit[:12]} by {newest.author} not verified: {newest.reason}; {fallback}"
    )


def _dashboard(
    statuses: Mapping[str, RolloutStatus],
    broken: Mapping[str, str],
    fleet: FleetStatus | None = None,
    order: DashboardOrder | None = None,
    nodes: Sequence[Node] = (),
    changed: Iterable[str] | None = None,
    *,
    ignored: Mapping[str, str] | None = None,
) -> DashboardParts:
    """The dashboard, with the fleet watch's section when there is a fleet
    status, the evidence marks of the nodes (docs/trust.md) when any applies,
    and the status files that cannot be read listed last, since those
    rollouts are held until a person repairs them."""
    text = dashboard_parts(statuses, order, changed)
    if fleet is not None:
        text = text.extended("\n\n" + fleet_dashboard_section(fleet))
    marks = evidence_dashboard_section(nodes)
    if marks:
        text = text.extended("\n\n" + marks)
    if broken:
        lines = ["", "## Status files that cannot be read or are not verified", ""]
        lines += [
            f"- `{name}`: {reason} (held until repaired)" for name, reason in sorted(broken.items())
        ]
        text = text.extended("\n" + "\n".join(lines) + "\n")
    if ignored:
        lines = ["", "## Files under status/ that are ignored", ""]
        lines += [f"- `{path}`: {reason}" for path, reason in sorted(ignored.items())]
        text = text.extended("\n" + "\n".join(lines) + "\n")
    return text


def _commit_message(
    step: FleetStep,
    spec_commit: str | None,
    broken: Mapping[str, str] | None = None,
    fleet_changes: Sequence[fleet_rules.FleetChange] = (),
) -> str:
    rollouts = sorted({t.rollout for t in step.transitions} | set(step.statuses))
    head = ", ".join(_summary(step, name) for name in rollouts[:3])
    if len(rollouts) > 3:
        head += f" and {len(rollouts) - 3} more"
    if not head and fleet_changes:
        head = fleet_summary(fleet_changes)
    if not head and broken:
        head = "unreadable status of " + ", ".join(sorted(broken)[:3])
    lines = [f"status: {head}", ""]
    for t in step.transitions[:MESSAGE_LINES]:
        who = f"{t.rollout}/{t.node}" if t.node else t.rollout
        lines.append(
            f"{who}: {t.from_state} -> {t.to_state}" + (f" ({t.reason})" if t.reason else "")
        )
    if len(step.transitions) > MESSAGE_LINES:
        lines.append(f"... and {len(step.transitions) - MESSAGE_LINES} more transitions")
    lines += fleet_lines(fleet_changes, MESSAGE_LINES)
    if step.effects:
        lines.append(f"jobs recorded: {len(step.effects)}")
    if spec_commit:
        lines += ["", f"Spec-Commit: {spec_commit}"]
    return "\n".join(lines) + "\n"


def _summary(step: FleetStep, rollout: str) -> str:
    """``web running`` for a phase change, else ``web: 2 succeeded, 1 dispatched``."""
    phases = [t.to_state for t in step.transitions if t.rollout == rollout and t.node is None]
    if phases:
        return f"{rollout} {phases[-1]}"
    counts: dict[str, int] = {}
    for t in step.transitions:
        if t.rollout == rollout and t.node is not None:
            counts[t.to_state] = counts.get(t.to_state, 0) + 1
    detail = ", ".join(f"{n} {state}" for state, n in counts.items())
    return f"{rollout}: {detail}" if detail else rollout


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


__all__ = ["Daemon", "PassOutcome", "stop_on_signals"]
