"""Rollout status as values, and their plain-data records.

``RolloutStatus`` is what the engine returns and what ``status/NAME.yaml``
holds (docs/configuration.md). This module fixes the names (phases, node
states, hold reasons) and converts between the frozen values and the plain
data (dicts, lists, strings, ints, bools, None) that the YAML layer writes:
``to_record``/``from_record`` for one whole status, ``status_files`` /
``status_from_files`` for the file layout with node pages over 200 nodes,
and ``changed_files`` so a writer rewrites only the files that changed.

It must not read or write YAML, touch files, or decide anything: the engine
decides, the daemon writes. Times are aware UTC datetimes here and RFC 3339
text in records; the conversion is lossless (a test round-trips every status
the engine can produce).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from reconciler.spec import artifact_records, baseline_records
from reconciler.spec import evals as eval_rules
from reconciler.spec import health as health_rules
from reconciler.spec.artifact_records import StageRecord
from reconciler.spec.artifacts import Artifact, Drain, ModelSigner, Stage, Warmup
from reconciler.spec.baseline_records import BaselineJob
from reconciler.spec.batch_shapes import batch_sizes, batch_starts
from reconciler.spec.batch_states import life_state, shown_state
from reconciler.spec.compare import (
    FiringAlert,
    Measured,
    alert_from,
    alert_record,
    measured_from,
    measured_record,
)
from reconciler.spec.durations import format_duration, parse_duration
from reconciler.spec.evals import Eval
from reconciler.spec.model import API_VERSION, RolloutSpec, SpreadBy, Target
from reconciler.spec.paths import status_page_path, status_path
from reconciler.spec.times import format_time, parse_time

KIND = "RolloutStatus"
PAGE_KIND = "RolloutStatusNodes"

PHASES = ("pending", "scheduled", "running", "paused", "completed", "failed", "aborted")
TERMINAL_PHASES = frozenset({"completed", "failed", "aborted"})

NODE_STATES = (
    "pending",
    "staging",
    "staged",
    "dispatched",
    "succeeded",
    "failed",
    "timed_out",
    "unknown",
    "stopped",
    "rollback_pending",
    "restoring",
    "rolled_back",
    "rollback_failed",
    "skipped",
)

HOLD_REASONS = (
    "operator_paused",
    "pause_after_batch",
    "health_failed",
    "health_unknown",
    "retry_exhausted",
    "stopped",
    "rollback_pending",
    "rolled_back",
    "rollback_failed",
    "rollback_unavailable",
    "dispatch_refused",
    "failure_budget_exceeded",
    "stage_failed",
    "eval_baseline_failed",
)

VERDICTS = ("passed", "failed", "unknown")
BATCH_STATES = ("pending", "running", "done")
JOB_KINDS = ("apply", "restore", "stage", "eval", "release")
# Where a node's stage of the rollout's artifacts stands (docs/rollouts.md).
STAGE_STATES = ("staging", "staged", "failed", "unknown")

# Outcomes of one node in one rollback request.
ROLLBACK_OUTCOMES = (
    "restoring",  # restore job sent
    "rolled_back",
    "rollback_failed",
    "skipped",  # the rollout never changed this node
    "unavailable",  # changed, but no backup to put back (the node had no config)
    "refused",  # job in flight, changed since by another rollout, not a node of this rollout
)
# waiting: for agents' backup lists; refused: the whole request (dry-run,
# running and not held, never started); restoring: restores in flight; done.
ROLLBACK_STATES = ("waiting", "refused", "restoring", "done")

# How many node names a hold lists; the rest are counted (docs/configuration.md).
HOLD_NODES_SHOWN = 20
# How many rollout transitions a status keeps.
TRANSITIONS_KEPT = 50
# Node records per page file, and the size above which pages are used.
PAGE_SIZE = 200


# Why a batch that is due does not start yet (docs/rollouts.md): not a hold.
WAITING_REASONS = ("outside_window", "freeze", "alert_firing", "alertmanager_unreachable")
ALERT_WAITING_REASONS = ("alert_firing", "alertmanager_unreachable")  # for the rollout's alerts


@dataclass(frozen=True)
class Hold:
    """Why a started rollout is ``paused``. ``nodes`` lists at most
    ``HOLD_NODES_SHOWN`` names; ``node_count`` counts all of them.
    ``until``: when a timed ``pauseAfter`` hold lifts by itself (None: it
    waits for a person)."""

    reason: str
    message: str
    since: datetime
    nodes: tuple[str, ...] = ()
    node_count: int = 0
    until: datetime | None = None


@dataclass(frozen=True)
class Waiting:
    """A batch is due but a deploy window or a freeze keeps it from starting
    until ``until`` (None: no opening within a week), or a rollout's alerts
    do (a fleet-wide alert fires, or Alertmanager cannot be asked) until
    they change (docs/health.md)."""

    reason: str  # one of WAITING_REASONS
    until: datetime | None
    alerts: tuple[FiringAlert, ...] = ()  # alert_firing: the fleet-wide alerts


@dataclass(frozen=True)
class Condition:
    """Something an operator should know that is not a hold: a frozen field
    edited after start, a refused resume or rollback, an unverified change,
    an invalid rollout file."""

    type: str
    message: str
    since: datetime


@dataclass(frozen=True)
class TransitionRecord:
    """One phase change of the rollout, kept in status (last 50)."""

    time: datetime
    from_phase: str
    to_phase: str
    reason: str
    commit: str


@dataclass(frozen=True)
class RestoreRecord:
    """The node's latest restore job: ``request`` is the rollback request id,
    or ``policy`` for a restore the failure policy decided."""

    request: str
    job_id: str
    backup_id: str
    attempt: int  # the apply attempt the restore follows; part of the job id
    source_commit: str
    dispatched_at: datetime
    deadline: datetime
    finished_at: datetime | None = None
    error: str = ""
    # the signed restore job record its outcome rests on (docs/trust.md)
    evidence: NodeEvidence | None = None
    # a restore that routed back to a warm slot: {routedAt} (agent clock)
    timings: Mapping[str, str | None] | None = field(default=None, hash=False)


@dataclass(frozen=True)
class StandbyRecord:
    """The previous slot a standby apply kept warm on the node (its answer
    named it), and its release (docs/rollouts.md#warm-standby): the job
    sent (None: not yet), its deadline (daemon clock), when its success was
    recorded, or why it ended without one. A release never holds the rollout."""

    slot: str
    release_job_id: str | None = None
    release_deadline: datetime | None = None
    released_at: datetime | None = None
    release_error: str = ""

    @property
    def release_open(self) -> bool:
        """Sent, and neither released nor given up."""
        return (
            self.release_job_id is not None and self.released_at is None and not self.release_error
        )


@dataclass(frozen=True)
class CheckOutcome:
    """A health check's last outcome when its node was decided (docs/health.md)."""

    name: str
    ok: bool
    detail: str = ""
    measured: Measured | None = None  # a comparison's numbers (docs/health.md)


@dataclass(frozen=True)
class NodeRecord:
    """One node of a started rollout, in frozen order.

    ``job_id`` .. ``verdict`` describe the current apply attempt (attempt 0:
    never sent). ``held`` is the hold reason this node waits on for a person
    (None: not held).

    ``first_backup_id`` is what a restore puts back: the backup taken by the
    node's first apply of this rollout, never a later attempt's (docs/rollouts.md). ``first_apply_attempt`` is the attempt that counts as that first
    apply: the first the agent ran (it reported success, or a backup), or
    the first whose result was never seen. None while none counts: nothing
    sent yet, or every apply so far was failed or refused by its agent
    without a backup, which left the config as it was, so the next one
    counts. Once it is set, ``first_backup_id`` is final, None included
    (the node had no config before, or already had the target).
    ``first_backup_known`` is false while the counting apply's result was
    never seen: a restore then searches the agent's backup list for this
    rollout's job ids from that attempt on, the oldest match first.
    Records written before ``first_apply_attempt`` existed read it as None;
    their ``first_backup_id``, when set, is final as it was.
    """

    name: str
    batch: int  # 1-based
    state: str = "pending"
    attempt: int = 0
    job_id: str | None = None
    source_commit: str | None = None
    dispatched_at: datetime | None = None
    deadline: datetime | None = None
    finished_at: datetime | None = None  # daemon clock: when the verdict was recorded
    verdict: str | None = None
    error: str = ""
    backup_id: str | None = None
    first_backup_id: str | None = None
    first_backup_known: bool = True
    first_apply_attempt: int | None = None
    auto_retried: bool = False
    held: str | None = None
    restore: RestoreRecord | None = None
    checks: tuple[CheckOutcome, ...] = ()  # health checks' last outcomes, once decided
    evidence: NodeEvidence | None = None  # signed answers the verdict used
    # version 3, model artifacts (docs/rollouts.md)
    stage: StageRecord | None = None
    timings: Mapping[str, str | None] | None = field(default=None, hash=False)
    out_of_service: float | None = None  # seconds, from timings
    # version 4: the evals of the node's live apply, as its job record gave them
    evals: tuple[Mapping[str, Any], ...] | None = field(default=None, hash=False)
    # The Alertmanager alert that failed the node: the daemon's own verdict,
    # resting on Alertmanager's answer, not on any agent's (docs/health.md).
    failed_by_alert: FiringAlert | None = None
    # version 4: the previous slot a standby apply kept warm, and its release
    standby: StandbyRecord | None = None


@dataclass(frozen=True)
class NodeEvidence:
    """The signed answers a node's verdict rests on (docs/trust.md), kept so
    ``reconciler verify --evidence`` can check them offline: the job record
    and, for a live rollout, the heartbeat, each exactly as the agent
    signed it (the signature covers the whole answer, so nothing is
    trimmed), with the key id and signatures (standard base64)."""

    key_id: str
    job_record: Mapping[str, Any] = field(hash=False)
    job_signature: str
    heartbeat: Mapping[str, Any] | None = field(default=None, hash=False)
    heartbeat_signature: str | None = None


@dataclass(frozen=True)
class RollbackNode:
    name: str
    outcome: str  # one of ROLLBACK_OUTCOMES
    message: str = ""


@dataclass(frozen=True)
class RollbackRecord:
    """One handled ``rollbackRequest`` id: who asked (the author of the
    commit that carried it), when it was handled, and each node's outcome."""

    id: str
    requested_by: str
    time: datetime
    state: str  # one of ROLLBACK_STATES
    message: str = ""
    nodes: tuple[RollbackNode, ...] = ()


@dataclass(frozen=True)
class BatchRecord:
    index: int  # 1-based
    state: str  # one of BATCH_STATES


@dataclass(frozen=True)
class FrozenSpec:
    """The spec fields fixed at start (everything but the intents,
    ``healthTimeout`` and ``pauseAfter``). The ordered node list is the
    order of ``RolloutStatus.nodes``."""

    target: Target
    batch_size: int
    live: bool
    on_failure: str
    selector: tuple[tuple[str, str], ...] | None = None
    node_ids: tuple[str, ...] | None = None
    start_at: str | None = None
    include_maintenance: bool = False
    allow_overlap: bool = False
    health: health_rules.Health | None = None
    batches: tuple[int | str, ...] = ()  # as written; () means batch_size
    ignore_windows: bool = False
    spread_by: SpreadBy | None = None  # batches spread across a label's values
    failure_budget: int | str | None = None  # as written
    artifacts: tuple[Artifact, ...] = ()  # files staged before each node's apply
    stage: Stage | None = None  # set whenever there are artifacts
    drain: Drain | None = None
    warmup: tuple[Warmup, ...] = ()
    signature: Artifact | None = None  # target.signature
    signers: tuple[ModelSigner, ...] = ()  # of the settings at start, covering the model
    evals: tuple[Eval, ...] = ()  # with their suites as read at the start commit
    standby: str | None = None  # keepPrevious of spec.standby; None: no standby

    @property
    def mode(self) -> str:
        return "live" if self.live else "dry_run"

    def batch_sizes(self, count: int) -> tuple[int, ...]:
        """The size of each batch of ``count`` frozen nodes cut in order
        (without ``spread_by``; with it, ``recorded_sizes`` tells)."""
        return batch_sizes(self.batches, self.batch_size, count)

    def batch_starts(self, count: int) -> tuple[int, ...]:
        """Index of each batch's first node, then ``count`` (without ``spread_by``)."""
        return batch_starts(self.batches, self.batch_size, count)


def recorded_sizes(frozen: FrozenSpec, nodes: Sequence[NodeRecord]) -> tuple[int, ...]:
    """The size of each batch of a started rollout: with ``spreadBy``, as
    its node records say (the label values at start made them); else as
    ``batchSize`` or ``batches`` cut the frozen list."""
    if frozen.spread_by is None:
        return frozen.batch_sizes(len(nodes))
    sizes: dict[int, int] = {}
    for node in nodes:
        sizes[node.batch] = sizes.get(node.batch, 0) + 1
    return tuple(sizes.get(k, 0) for k in range(1, max(sizes, default=0) + 1))


def batch_members(nodes: Sequence[NodeRecord]) -> tuple[tuple[int, ...], ...]:
    """Indexes of the nodes of each batch, in frozen order, from the node
    records (a spread rollout's batches are not consecutive chunks)."""
    members: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        members.setdefault(node.batch, []).append(i)
    return tuple(tuple(members.get(k, ())) for k in range(1, max(members, default=0) + 1))


# The spec fields frozen at start, by ``FrozenSpec`` attribute (the same
# name on ``RolloutSpec``) and document name: everything but the intents,
# ``healthTimeout`` and ``pauseAfter``. Every frozen-field rule reads this.
FROZEN_FIELDS: tuple[tuple[str, str], ...] = (
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
    ("spread_by", "spreadBy"),
    ("failure_budget", "failureBudget"),
    ("artifacts", "target.artifacts"),
    ("stage", "stage"),
    ("drain", "drain"),
    ("warmup", "warmup"),
    ("signature", "target.signature"),
    ("signers", "signers"),
    ("evals", "health.evals"),
    ("standby", "standby"),
)
assert {attr for attr, _ in FROZEN_FIELDS} == set(FrozenSpec.__dataclass_fields__)


def freeze(spec: RolloutSpec) -> FrozenSpec:
    """The frozen part of ``spec``, as a start records it."""
    return FrozenSpec(**{attr: getattr(spec, attr) for attr, _ in FROZEN_FIELDS})


def frozen_changes(frozen: FrozenSpec, spec: RolloutSpec) -> list[str]:
    """Document names of the frozen fields ``spec`` now sets otherwise than ``frozen``."""
    return [doc for attr, doc in FROZEN_FIELDS if getattr(frozen, attr) != getattr(spec, attr)]


@dataclass(frozen=True)
class OperatorAct:
    """Who set ``paused: true`` or ``abort: true``, and why: the author and
    message of the commit that set it (``reconciler pause/abort -m``
    writes the reason into that message)."""

    author: str  # "Name <email>"
    commit: str
    message: str = ""  # the commit message, clipped to ACT_MESSAGE_LIMIT

    def describe(self) -> str:
        """One line for people: who, in which commit, and why."""
        subject = self.message.split("\n", 1)[0].strip()
        return f"{self.author} in {self.commit[:12]}" + (f": {subject}" if subject else "")


ACT_MESSAGE_LIMIT = 500  # characters of a pause or abort commit's message kept


@dataclass(frozen=True)
class ApprovalRecord:
    """A reviewer's signed approval of the spec commit acted on (docs/trust.md): the allowed-signers principal and the key's fingerprint."""

    principal: str
    key_id: str
    rules: tuple[str, ...] = ()  # the approval rules it counted for (docs/approval-rules.md)


@dataclass(frozen=True)
class RolloutStatus:
    """Everything recorded about one rollout. Equal values mean nothing
    changed: the engine returns an equal status from an idle step."""

    name: str
    phase: str = "pending"
    reason: str = ""  # short code for the phase: why pending, why it ended
    message: str = ""  # the same for a person
    hold: Hold | None = None
    waiting: Waiting | None = None
    operator_paused: bool = False
    spec_commit: str = ""
    start_commit: str | None = None
    first_seen_commit: str = ""
    health_timeout: int | None = None  # seconds, in force for new deadlines
    scheduled_for: datetime | None = None  # startAt while scheduled
    frozen: FrozenSpec | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    progress: tuple[tuple[str, int], ...] = ()  # (node state, count), NODE_STATES order
    batches: tuple[BatchRecord, ...] = ()
    nodes: tuple[NodeRecord, ...] = ()
    last_handled_resume: str = ""
    rollbacks: tuple[RollbackRecord, ...] = ()
    conditions: tuple[Condition, ...] = ()
    transitions: tuple[TransitionRecord, ...] = ()
    # under --require-approvals: who approved the spec commit acted on
    approved_by: tuple[ApprovalRecord, ...] = ()
    paused_by: OperatorAct | None = None  # while operator_paused: who paused it
    aborted_by: OperatorAct | None = None  # once aborted by the operator: who
    # version 4: eval jobs asking nodes on the old target for baseline answers
    eval_baseline: tuple[BaselineJob, ...] = ()

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def started(self) -> bool:
        return self.start_commit is not None

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    def shown_batch_states(self) -> tuple[str, ...]:
        """Each batch's state as status files and views show it (a batch
        with a failing node is failed; see ``batch_states``)."""
        states: dict[int, list[str]] = {}
        held: set[int] = set()
        for node in self.nodes:
            states.setdefault(node.batch, []).append(node.state)
            if node.held is not None:
                held.add(node.batch)
        paused = self.phase == "paused" and self.hold is not None
        return tuple(
            shown_state(b.state, states.get(b.index, ()), b.index in held or paused)
            for b in self.batches
        )


def count_progress(nodes: Iterable[NodeRecord]) -> tuple[tuple[str, int], ...]:
    """Counts by node state, in ``NODE_STATES`` order, zero counts left out."""
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node.state] = counts.get(node.state, 0) + 1
    return tuple((state, counts[state]) for state in NODE_STATES if state in counts)


# --- records ---------------------------------------------------------------
#
# Records are the plain data of the status file. Keys are camelCase as in the
# documents. Optional fields that are unset are written as null so every
# record has the same shape, except where noted.


def _t(moment: datetime | None) -> str | None:
    return None if moment is None else format_time(moment)


def _pt(text: Any) -> datetime | None:
    return None if text is None else parse_time(text)


def _target_record(target: Target) -> dict[str, Any]:
    return {
        "runtime": target.runtime,
        "provider": target.provider,
        "model": target.model,
        "profile": target.profile,
    }


def _frozen_record(frozen: FrozenSpec, nodes: tuple[NodeRecord, ...] | None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "target": _target_record(frozen.target),
        "batchSize": frozen.batch_size,
        "live": frozen.live,
        "onFailure": frozen.on_failure,
    }
    if frozen.selector is not None:
        record["selector"] = dict(frozen.selector)
    if frozen.node_ids is not None:
        record["nodeIds"] = list(frozen.node_ids)
    record["startAt"] = frozen.start_at
    record["includeMaintenance"] = frozen.include_maintenance
    record["allowOverlap"] = frozen.allow_overlap
    if frozen.health is not None:
        record["health"] = health_rules.to_document(frozen.health)
    # Version 2 fields are written only when used: a version 1 rollout's
    # status stays byte for byte what it was.
    if frozen.batches:
        record["batches"] = list(frozen.batches)
    if frozen.ignore_windows:
        record["ignoreWindows"] = True
    # Version 3 fields too.
    if frozen.spread_by is not None:
        record["spreadBy"] = {
            "label": frozen.spread_by.label,
            "maxPerBatch": frozen.spread_by.max_per_batch,
        }
    if frozen.failure_budget is not None:
        record["failureBudget"] = frozen.failure_budget
    record.update(
        artifact_records.frozen_record(
            frozen.artifacts,
            frozen.stage,
            frozen.drain,
            frozen.warmup,
            frozen.signature,
            frozen.signers,
        )
    )
    if frozen.evals:
        record["evals"] = eval_rules.frozen_record(frozen.evals)
    if frozen.standby is not None:
        record["standby"] = {"keepPrevious": frozen.standby}
    if nodes is not None:
        record["nodes"] = [n.name for n in nodes]
    return record


def _frozen_from(record: Mapping[str, Any]) -> FrozenSpec:
    t = record["target"]
    selector = record.get("selector")
    node_ids = record.get("nodeIds")
    return FrozenSpec(
        target=Target(t["runtime"], t["provider"], t["model"], t["profile"]),
        batch_size=record["batchSize"],
        live=record["live"],
        on_failure=record["onFailure"],
        selector=None if selector is None else tuple(sorted(selector.items())),
        node_ids=None if node_ids is None else tuple(node_ids),
        start_at=record.get("startAt"),
        include_maintenance=record["includeMaintenance"],
        allow_overlap=record["allowOverlap"],
        health=None if "health" not in record else health_rules.from_document(record["health"]),
        batches=tuple(record.get("batches", ())),
        ignore_windows=record.get("ignoreWindows", False),
        spread_by=None
        if (spread := record.get("spreadBy")) is None
        else SpreadBy(spread["label"], spread["maxPerBatch"]),
        failure_budget=record.get("failureBudget"),
        evals=eval_rules.frozen_from(record.get("evals", ())),
        standby=(record.get("standby") or {}).get("keepPrevious"),
        **artifact_records.frozen_from(record),
    )


def _restore_record(r: RestoreRecord) -> dict[str, Any]:
    record = {
        "request": r.request,
        "jobId": r.job_id,
        "backupId": r.backup_id,
        "attempt": r.attempt,
        "sourceCommit": r.source_commit,
        "dispatchedAt": format_time(r.dispatched_at),
        "deadline": format_time(r.deadline),
        "finishedAt": _t(r.finished_at),
        "error": r.error,
    }
    if r.evidence is not None:  # absent, not null, as a node's own evidence
        record["evidence"] = _evidence_record(r.evidence)
    if r.timings is not None:  # absent unless the restore routed back to a warm slot
        record["timings"] = dict(r.timings)
    return record


def _restore_from(d: Mapping[str, Any]) -> RestoreRecord:
    return RestoreRecord(
        request=d["request"],
        job_id=d["jobId"],
        backup_id=d["backupId"],
        attempt=d["attempt"],
        source_commit=d["sourceCommit"],
        dispatched_at=parse_time(d["dispatchedAt"]),
        deadline=parse_time(d["deadline"]),
        finished_at=_pt(d.get("finishedAt")),
        error=d.get("error", ""),
        evidence=None if d.get("evidence") is None else evidence_from(d["evidence"]),
        timings=None if d.get("timings") is None else dict(d["timings"]),
    )


def _standby_record(s: StandbyRecord) -> dict[str, Any]:
    return {
        "slot": s.slot,
        "releasedAt": _t(s.released_at),
        "releaseJobId": s.release_job_id,
        "releaseDeadline": _t(s.release_deadline),
        "releaseError": s.release_error,
    }


def _standby_from(d: Mapping[str, Any]) -> StandbyRecord:
    return StandbyRecord(
        slot=d["slot"],
        release_job_id=d.get("releaseJobId"),
        release_deadline=_pt(d.get("releaseDeadline")),
        released_at=_pt(d.get("releasedAt")),
        release_error=d.get("releaseError", ""),
    )


def _evidence_record(e: NodeEvidence) -> dict[str, Any]:
    return {
        "keyId": e.key_id,
        "jobRecord": dict(e.job_record),
        "heartbeat": None if e.heartbeat is None else dict(e.heartbeat),
        "signatures": {"jobRecord": e.job_signature, "heartbeat": e.heartbeat_signature},
    }


def evidence_from(d: Mapping[str, Any]) -> NodeEvidence:
    signatures = d.get("signatures") or {}
    return NodeEvidence(
        key_id=d["keyId"],
        job_record=d["jobRecord"],
        job_signature=signatures.get("jobRecord", ""),
        heartbeat=d.get("heartbeat"),
        heartbeat_signature=signatures.get("heartbeat"),
    )


def node_to_record(n: NodeRecord) -> dict[str, Any]:
    record = _node_record(n)
    if n.evidence is not None:  # absent, not null: unsigned records stay as in version 1
        record["evidence"] = _evidence_record(n.evidence)
    if n.stage is not None or n.timings is not None:  # absent without artifacts and timings
        record.update(artifact_records.node_record(n.stage, n.timings, n.out_of_service))
    if n.failed_by_alert is not None:  # absent otherwise, as in records before it
        record["failedByAlert"] = alert_record(n.failed_by_alert)
    if n.evals is not None:  # absent without evals
        record["evals"] = [dict(e) for e in n.evals]
    if n.standby is not None:  # absent unless a standby apply kept a slot warm
        record["standby"] = _standby_record(n.standby)
    return record


def _node_record(n: NodeRecord) -> dict[str, Any]:
    return {
        "name": n.name,
        "batch": n.batch,
        "state": n.state,
        "attempt": n.attempt,
        "jobId": n.job_id,
        "sourceCommit": n.source_commit,
        "dispatchedAt": _t(n.dispatched_at),
        "deadline": _t(n.deadline),
        "finishedAt": _t(n.finished_at),
        "verdict": n.verdict,
        "error": n.error,
        "backupId": n.backup_id,
        "firstBackupId": n.first_backup_id,
        "firstBackupKnown": n.first_backup_known,
        "firstApplyAttempt": n.first_apply_attempt,
        "autoRetried": n.auto_retried,
        "held": n.held,
        "restore": None if n.restore is None else _restore_record(n.restore),
    } | ({"checks": [_check_record(c) for c in n.checks]} if n.checks else {})


def _waiting_record(waiting: Waiting) -> dict[str, Any]:
    """A window's wait says until when; an alert's wait lasts while the alerts fire."""
    if waiting.reason in ("outside_window", "freeze"):
        return {"reason": waiting.reason, "until": _t(waiting.until)}
    if waiting.reason == "alert_firing":
        return {"reason": waiting.reason, "alerts": [alert_record(a) for a in waiting.alerts]}
    return {"reason": waiting.reason}


def _check_record(c: CheckOutcome) -> dict[str, Any]:
    record: dict[str, Any] = {"name": c.name, "ok": c.ok, "detail": c.detail}
    return record if c.measured is None else record | measured_record(c.measured)


def node_from_record(d: Mapping[str, Any]) -> NodeRecord:
    restore = d.get("restore")
    return NodeRecord(
        name=d["name"],
        batch=d["batch"],
        state=d["state"],
        attempt=d["attempt"],
        job_id=d.get("jobId"),
        source_commit=d.get("sourceCommit"),
        dispatched_at=_pt(d.get("dispatchedAt")),
        deadline=_pt(d.get("deadline")),
        finished_at=_pt(d.get("finishedAt")),
        verdict=d.get("verdict"),
        error=d.get("error", ""),
        backup_id=d.get("backupId"),
        first_backup_id=d.get("firstBackupId"),
        first_backup_known=d.get("firstBackupKnown", True),
        first_apply_attempt=d.get("firstApplyAttempt"),  # None in records written before it
        auto_retried=d.get("autoRetried", False),
        held=d.get("held"),
        restore=None if restore is None else _restore_from(restore),
        checks=tuple(
            CheckOutcome(c["name"], c["ok"], c.get("detail", ""), measured_from(c))
            for c in d.get("checks", ())
        ),
        evidence=None if d.get("evidence") is None else evidence_from(d["evidence"]),
        failed_by_alert=None if d.get("failedByAlert") is None else alert_from(d["failedByAlert"]),
        evals=None if d.get("evals") is None else tuple(d["evals"]),
        standby=None if d.get("standby") is None else _standby_from(d["standby"]),
        **artifact_records.node_from(d),
    )


def _hold_record(h: Hold) -> dict[str, Any]:
    record = {
        "reason": h.reason,
        "message": h.message,
        "nodes": list(h.nodes),
        "nodeCount": h.node_count,
        "since": format_time(h.since),
    }
    if h.until is not None:
        record["until"] = format_time(h.until)
    return record


def _hold_from(d: Mapping[str, Any]) -> Hold:
    return Hold(
        reason=d["reason"],
        message=d["message"],
        since=parse_time(d["since"]),
        nodes=tuple(d.get("nodes", ())),
        node_count=d.get("nodeCount", 0),
        until=_pt(d.get("until")),
    )


def _rollback_record(r: RollbackRecord) -> dict[str, Any]:
    return {
        "id": r.id,
        "requestedBy": r.requested_by,
        "time": format_time(r.time),
        "state": r.state,
        "message": r.message,
        "nodes": [{"name": n.name, "outcome": n.outcome, "message": n.message} for n in r.nodes],
    }


def _rollback_from(d: Mapping[str, Any]) -> RollbackRecord:
    return RollbackRecord(
        id=d["id"],
        requested_by=d["requestedBy"],
        time=parse_time(d["time"]),
        state=d["state"],
        message=d.get("message", ""),
        nodes=tuple(
            RollbackNode(n["name"], n["outcome"], n.get("message", "")) for n in d.get("nodes", ())
        ),
    )


def _act_records(status: RolloutStatus) -> dict[str, Any]:
    """``pausedBy`` and ``abortedBy``, each only when set (older status
    files have neither)."""
    acts = {"pausedBy": status.paused_by, "abortedBy": status.aborted_by}
    return {
        key: {"author": act.author, "commit": act.commit, "message": act.message}
        for key, act in acts.items()
        if act is not None
    }


def _act_from(data: Mapping[str, Any] | None) -> OperatorAct | None:
    if data is None:
        return None
    return OperatorAct(data["author"], data["commit"], data.get("message", ""))


def to_record(status: RolloutStatus, *, inline_nodes: bool = True) -> dict[str, Any]:
    """The status file's plain data. With ``inline_nodes`` false, node
    records are left out (they go to pages) and ``nodePages`` says how many."""
    record: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": status.name},
        "phase": status.phase,
        "reason": status.reason,
        "message": status.message,
        "hold": None if status.hold is None else _hold_record(status.hold),
        "operatorPaused": status.operator_paused,
        "specCommit": status.spec_commit,
        "startCommit": status.start_commit,
        "firstSeenCommit": status.first_seen_commit,
        **_approval_records(status),
        **_act_records(status),
        "healthTimeout": (
            None if status.health_timeout is None else format_duration(status.health_timeout)
        ),
        "scheduledFor": _t(status.scheduled_for),
        "frozen": (
            None
            if status.frozen is None
            else _frozen_record(status.frozen, status.nodes if inline_nodes else None)
        ),
        "startedAt": _t(status.started_at),
        "finishedAt": _t(status.finished_at),
        "progress": dict(status.progress),
        "batches": _batch_records(status),
        "nodeCount": len(status.nodes),
    }
    if status.waiting is not None:
        record["waiting"] = _waiting_record(status.waiting)
    if status.eval_baseline:  # absent without matchesBaseline cases
        record["evalBaselineJobs"] = baseline_records.jobs_record(status.eval_baseline)
        record["evalBaseline"] = baseline_records.answers_record(status.eval_baseline)
    if inline_nodes:
        record["nodes"] = [node_to_record(n) for n in status.nodes]
    else:
        record["nodePages"] = page_count(len(status.nodes))
    record.update(
        {
            "lastHandledResume": status.last_handled_resume,
            "rollbacks": [_rollback_record(r) for r in status.rollbacks],
            "conditions": _condition_records(status),
            "transitions": _transition_records(status),
        }
    )
    return record


def _approval_records(status: RolloutStatus) -> dict[str, Any]:
    """``approvedBy``, absent when no approval is recorded."""
    if not status.approved_by:
        return {}
    return {
        "approvedBy": [
            {
                "principal": a.principal,
                "keyId": a.key_id,
                **({"rules": list(a.rules)} if a.rules else {}),
            }
            for a in status.approved_by
        ]
    }


def _condition_records(status: RolloutStatus) -> list[dict[str, Any]]:
    return [
        {"type": c.type, "message": c.message, "since": format_time(c.since)}
        for c in status.conditions
    ]


def _transition_records(status: RolloutStatus) -> list[dict[str, Any]]:
    return [
        {
            "time": format_time(t.time),
            "from": t.from_phase,
            "to": t.to_phase,
            "reason": t.reason,
            "commit": t.commit,
        }
        for t in status.transitions
    ]


def _batch_records(status: RolloutStatus) -> list[dict[str, Any]]:
    """Batches as written: the shown state, and for a failed or held batch
    whether the engine has settled it (so reading gives its state back)."""
    records: list[dict[str, Any]] = []
    for batch, shown in zip(status.batches, status.shown_batch_states(), strict=True):
        record: dict[str, Any] = {"index": batch.index, "state": shown}
        if shown != batch.state:
            record["settled"] = batch.state == "done"
        records.append(record)
    return records


def from_record(
    record: Mapping[str, Any], nodes: tuple[NodeRecord, ...] | None = None
) -> RolloutStatus:
    """The inverse of ``to_record``. ``nodes`` supplies the node records when
    they were written to pages. Raises KeyError/ValueError/TypeError on data
    that is not a status record (validate against the schema first)."""
    if nodes is None:
        nodes = tuple(node_from_record(n) for n in record.get("nodes", ()))
    frozen = record.get("frozen")
    ht = record.get("healthTimeout")
    hold = record.get("hold")
    waiting = record.get("waiting")
    if frozen is not None and "nodes" in frozen:
        names = [n.name for n in nodes]
        if list(frozen["nodes"]) != names:
            raise ValueError("frozen.nodes does not match the node records' order")
    status = RolloutStatus(
        name=record["metadata"]["name"],
        phase=record["phase"],
        reason=record.get("reason", ""),
        message=record.get("message", ""),
        hold=None if hold is None else _hold_from(hold),
        waiting=None
        if waiting is None
        else Waiting(
            waiting["reason"],
            _pt(waiting.get("until")),
            tuple(alert_from(a) for a in waiting.get("alerts", ())),
        ),
        operator_paused=record.get("operatorPaused", False),
        spec_commit=record.get("specCommit", ""),
        start_commit=record.get("startCommit"),
        first_seen_commit=record.get("firstSeenCommit", ""),
        approved_by=tuple(
            ApprovalRecord(a["principal"], a["keyId"], tuple(a.get("rules", ())))
            for a in record.get("approvedBy", ())
        ),
        paused_by=_act_from(record.get("pausedBy")),
        aborted_by=_act_from(record.get("abortedBy")),
        health_timeout=None if ht is None else parse_duration(ht),
        scheduled_for=_pt(record.get("scheduledFor")),
        frozen=None if frozen is None else _frozen_from(frozen),
        started_at=_pt(record.get("startedAt")),
        finished_at=_pt(record.get("finishedAt")),
        progress=tuple(
            (state, record.get("progress", {})[state])
            for state in NODE_STATES
            if state in record.get("progress", {})
        ),
        batches=tuple(
            BatchRecord(b["index"], life_state(b["state"], b.get("settled")))
            for b in record.get("batches", ())
        ),
        nodes=nodes,
        last_handled_resume=record.get("lastHandledResume", ""),
        rollbacks=tuple(_rollback_from(r) for r in record.get("rollbacks", ())),
        conditions=tuple(
            Condition(c["type"], c["message"], parse_time(c["since"]))
            for c in record.get("conditions", ())
        ),
        transitions=tuple(
            TransitionRecord(parse_time(t["time"]), t["from"], t["to"], t["reason"], t["commit"])
            for t in record.get("transitions", ())
        ),
        eval_baseline=baseline_records.jobs_from(
            record.get("evalBaselineJobs", ()), record.get("evalBaseline", {})
        ),
    )
    if record.get("nodeCount", len(nodes)) != len(nodes):
        raise ValueError(f"nodeCount is {record.get('nodeCount')}, found {len(nodes)} node records")
    return status


# --- files -----------------------------------------------------------------


main_path = status_path
page_path = status_page_path


def page_count(node_count: int) -> int:
    return 0 if node_count <= PAGE_SIZE else -(-node_count // PAGE_SIZE)


def page_nodes(nodes: tuple[NodeRecord, ...], page: int) -> tuple[NodeRecord, ...]:
    """The node records on node page ``page`` (counted from 1)."""
    return nodes[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]


def _page_record(name: str, page: int, nodes: Iterable[NodeRecord]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": PAGE_KIND,
        "metadata": {"name": name},
        "page": page,
        "nodes": [node_to_record(n) for n in nodes],
    }


def status_files(status: RolloutStatus) -> dict[str, dict[str, Any]]:
    """Path relative to the repository root -> plain data, for every file of
    this status: the main file, plus node pages when over ``PAGE_SIZE`` nodes."""
    pages = page_count(len(status.nodes))
    if not pages:
        return {main_path(status.name): to_record(status)}
    files = {main_path(status.name): to_record(status, inline_nodes=False)}
    for page in range(1, pages + 1):
        chunk = page_nodes(status.nodes, page)
        files[page_path(status.name, page)] = _page_record(status.name, page, chunk)
    return files


def status_from_files(
    main: Mapping[str, Any], pages: Mapping[str, Mapping[str, Any]]
) -> RolloutStatus:
    """Rebuild a status from its main file's data and its node pages' data
    (keyed by path, as ``status_files`` returns them; extra paths ignored).
    ValueError if a page is missing or belongs to another rollout."""
    count = main.get("nodePages")
    if not count:
        return from_record(main)
    name = main["metadata"]["name"]
    nodes: list[NodeRecord] = []
    for page in range(1, count + 1):
        path = page_path(name, page)
        data = pages.get(path)
        if data is None:
            raise ValueError(f"{path}: missing node page {page} of {count} for rollout {name}")
        if data.get("metadata", {}).get("name") != name or data.get("page") != page:
            raise ValueError(f"{path}: not page {page} of rollout {name}")
        nodes.extend(node_from_record(n) for n in data["nodes"])
    return from_record(main, tuple(nodes))


def page_paths(status: RolloutStatus) -> tuple[str, ...]:
    """Every node page path the status uses (empty when not paged)."""
    return tuple(page_path(status.name, p) for p in range(1, page_count(len(status.nodes)) + 1))


def changed_files(
    old: RolloutStatus | None, new: RolloutStatus
) -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
    """The files to write and the files to delete to go from ``old`` to
    ``new``. Node pages are compared record by record and converted only
    when they changed, so a transition touching one page writes that page
    and the main file. The main file is written whenever anything changed."""
    if old is not None and old == new:
        return {}, ()
    if old is None or old.name != new.name:
        return status_files(new), ()
    new_pages = page_count(len(new.nodes))
    old_pages = page_count(len(old.nodes))
    if not new_pages:
        gone = page_paths(old)
        return {main_path(new.name): to_record(new)}, gone
    write: dict[str, dict[str, Any]] = {main_path(new.name): to_record(new, inline_nodes=False)}
    for page in range(1, new_pages + 1):
        new_chunk = page_nodes(new.nodes, page)
        if page <= old_pages and page_nodes(old.nodes, page) == new_chunk:
            continue
        write[page_path(new.name, page)] = _page_record(new.name, page, new_chunk)
    gone = tuple(page_path(new.name, p) for p in range(new_pages + 1, old_pages + 1))
    return write, gone


__all__ = [
    "BATCH_STATES",
    "FROZEN_FIELDS",
    "HOLD_REASONS",
    "NODE_STATES",
    "PAGE_SIZE",
    "PHASES",
    "TERMINAL_PHASES",
    "BatchRecord",
    "Condition",
    "FrozenSpec",
    "Hold",
    "NodeRecord",
    "OperatorAct",
    "RestoreRecord",
    "RollbackNode",
    "RollbackRecord",
    "RolloutStatus",
    "StageRecord",
    "TransitionRecord",
    "Waiting",
    "batch_members",
    "changed_files",
    "count_progress",
    "freeze",
    "from_record",
    "frozen_changes",
    "page_nodes",
    "recorded_sizes",
    "status_files",
    "status_from_files",
    "to_record",
]
