"""What one pass's evidence writes into a rollout's node records: the
verdict on each in-flight apply, the outcome of each restore
(docs/rollouts.md). The evidence rules (``reconciler.engine.evidence``)
judge; this turns their judgements into new node records and the
outcomes of explicit rollbacks, and hands a recorded verdict that awaits
its decision to the failure policy (``reconciler.engine.policy``). Values in, changes out: the step records
them. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from reconciler.engine import evidence, releases
from reconciler.engine.backups import first_backup_after
from reconciler.engine.comparisons import failing_alert
from reconciler.engine.holds import RESTORE_STATES, VERDICT_STATES
from reconciler.engine.inputs import NodeChange
from reconciler.engine.policy import Decision, decide
from reconciler.engine.records import evolve
from reconciler.protocol.observations import JobObservation
from reconciler.spec.artifact_records import ROUTED_AT, out_of_service
from reconciler.spec.evals import check_outcomes
from reconciler.spec.rollout_status import CheckOutcome, NodeRecord, RestoreRecord


@dataclass(frozen=True)
class RestoreOutcome:
    """A restore of an explicit rollback request ended (for its record)."""

    request: str
    node: str
    outcome: str
    error: str


@dataclass(frozen=True)
class Observed:
    changes: tuple[NodeChange, ...] = ()
    outcomes: tuple[RestoreOutcome, ...] = ()


def observe(
    open_nodes: Sequence[tuple[int, NodeRecord]],
    seen: Callable[[], evidence.Seen],
    jobs: Mapping[str, JobObservation],
    in_fleet: Callable[[str], bool],
    now: datetime,
    terminal: bool,
) -> Observed:
    """Verdicts for the in-flight applies among ``open_nodes`` (index and
    record) and outcomes of their restores. ``seen``: this pass's
    observations, built when first needed; ``jobs``: the job answers read
    this pass, by job id; ``in_fleet``: whether a node
    still has its file; ``terminal``: the rollout has ended, so a restore
    that ends holds nothing."""
    changes: list[NodeChange] = []
    outcomes: list[RestoreOutcome] = []
    judging: evidence.Seen | None = None
    for i, node in open_nodes:
        if node.state == "dispatched":
            if judging is None:
                judging = seen()
            judged = evidence.judge_apply(node, judging, in_fleet(node.name))
            if judged is not None:
                new = with_verdict(node, judging, *judged)
                changes.append(NodeChange(i, new, judged[2] or judged[0]))
        elif node.state in RESTORE_STATES and node.restore is not None:
            restore = node.restore
            job = jobs.get(restore.job_id)
            ended = evidence.judge_restore(restore, job, now)
            if ended is None:
                continue
            outcome, error = ended
            new = with_restore_outcome(node, restore, job, outcome, error, now, terminal)
            changes.append(NodeChange(i, new, error or "restore succeeded"))
            if restore.request != "policy":
                outcomes.append(RestoreOutcome(restore.request, node.name, outcome, error))
    return Observed(tuple(changes), tuple(outcomes))


def with_verdict(
    node: NodeRecord,
    seen: evidence.Seen,
    verdict: str,
    state: str,
    error: str,
    job: JobObservation | None,
) -> NodeRecord:
    """``node`` with the verdict on its current attempt recorded."""
    first_backup_id, known, first_attempt = first_backup_after(node, job)
    beat = seen.observations.heartbeats.get(node.name) if seen.live else None
    ran = seen.checks_apply and job is not None and job.state == "succeeded"
    # judge_apply fails a node an alert names before anything else: that alert
    # is what the verdict rests on, so the record keeps it.
    alert = failing_alert(seen.health, seen.alerts, node.name) if seen.live else None
    timings = job.timings if job is not None and seen.live else None
    evals = job.evals if job is not None and seen.live else None
    checks = evidence.judge_node_health(node, seen).outcomes if ran else ()
    if evals:
        checks += tuple(CheckOutcome(*c) for c in check_outcomes(evals, seen.evals))
    return evolve(
        node,
        timings=timings,
        out_of_service=None if timings is None else out_of_service(timings),
        state=state,
        verdict=verdict,
        error=error,
        finished_at=seen.now,
        evidence=evidence.recorded(verdict, job, beat),
        failed_by_alert=alert if verdict == "failed" else None,
        backup_id=job.backup_id if job is not None else None,
        first_backup_id=first_backup_id,
        first_backup_known=known,
        first_apply_attempt=first_attempt,
        checks=checks,
        evals=evals,
        standby=releases.kept_slot(node, job) if seen.standby else node.standby,
    )


def with_restore_outcome(
    node: NodeRecord,
    restore: RestoreRecord,
    job: JobObservation | None,
    outcome: str,
    error: str,
    now: datetime,
    terminal: bool,
) -> NodeRecord:
    """``node`` with the outcome of its restore recorded; a policy restore
    (or a held node's) holds for its outcome while the rollout runs."""
    held = node.held
    if restore.request == "policy" or held is not None:
        held = None if terminal else outcome
    return evolve(
        node,
        state=outcome,
        held=held,
        restore=replace(
            restore,
            finished_at=now,
            error=error,
            evidence=evidence.recorded_restore(job),
            timings=_routed(job),
        ),
    )


def _routed(job: JobObservation | None) -> dict[str, str | None] | None:
    """A restore's ``{routedAt}`` when it routed back to a warm slot, else None."""
    routed = job.timings.get(ROUTED_AT) if job is not None and job.timings else None
    return {ROUTED_AT: routed} if routed is not None else None


def decision_for(node: NodeRecord, policy: str, live: bool) -> Decision | None:
    """The decision on a node's verdict not yet decided, or None when it
    has none to take: no verdict, or held already."""
    if node.state not in VERDICT_STATES or node.held is not None or node.verdict is None:
        return None
    # A backup not yet known counts as available: the restore waits for the
    # agent's backup list and falls back to rollback_unavailable.
    backup = live and (node.first_backup_id is not None or not node.first_backup_known)
    return decide(policy, node.verdict, auto_retried=node.auto_retried, backup_available=backup)
