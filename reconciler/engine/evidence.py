"""The evidence rules of a node's verdict (docs/rollouts.md, "Health verdicts"), as pure functions: what an observation says
about one node's apply or restore. Values in, a verdict (or nothing yet)
out; the engine records what these return and applies the failure policy
to it. Evidence seen now beats the deadline."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from reconciler.engine import comparisons, health_evidence
from reconciler.protocol.canary_observations import AlertAnswer
from reconciler.protocol.observations import NO_EVIDENCE, Heartbeat, JobObservation, Observations
from reconciler.spec.durations import format_duration
from reconciler.spec.evals import Eval
from reconciler.spec.health import Health
from reconciler.spec.model import Target
from reconciler.spec.rollout_status import NodeEvidence, NodeRecord, RestoreRecord
from reconciler.spec.times import parse_time

# How a node's error starts when its agent itself failed or refused the apply
# job (not a health verdict): the agent then leaves or puts the previous
# config back byte for byte (docs/protocol.md), so that attempt changed nothing.
JOB_FAILED = "job failed"
JOB_REFUSED = "refused by the agent"


# (verdict, node state, error, the job observation it rests on)
Judgement = tuple[str, str, str, JobObservation | None]


@dataclass(frozen=True)
class Seen:
    """What one pass saw of the fleet, and what evidence is judged against:
    the rollout's frozen target and mode, ``offlineAfter``, the pass's ``now``."""

    observations: Observations
    target: Target
    live: bool
    offline_after: timedelta
    offline_after_seconds: int  # as written in settings, for the message
    now: datetime
    # docs/health.md: the frozen checks and soak (None: version 1's rule only),
    # and whether settings name a Prometheus server for prometheus checks
    health: Health | None = None
    prometheus_configured: bool = True
    alerts: AlertAnswer | None = None  # Alertmanager's answer for this rollout's alerts
    evals: tuple[Eval, ...] = ()  # the frozen evals (docs/evals.md)
    standby: bool = False  # the rollout keeps previous slots warm (spec.standby)

    @property
    def checks_apply(self) -> bool:
        """Dry runs ignore health: nothing was applied."""
        h = self.health
        return self.live and h is not None and bool(h.checks or h.compare or h.alerts)


def judge_apply(node: NodeRecord, seen: Seen, in_fleet: bool) -> Judgement | None:
    """The verdict on a dispatched node's current attempt, or None while it
    waits: the agent's own failure or refusal fails it; success passes it
    (live: only with a fresh heartbeat showing the target); a node gone from
    nodes/ (``in_fleet`` false) or unreachable for ``offlineAfter`` is
    unknown; past the deadline it is timed out (failed, if a heartbeat shows
    drift)."""
    assert node.job_id is not None
    assert node.deadline is not None and node.dispatched_at is not None
    obs, now = seen.observations, seen.now
    job = obs.jobs.get(node.job_id)
    alerted = comparisons.alert_failure(seen.health, seen.alerts, node.name) if seen.live else ""
    if alerted:  # an alert naming the node fails it at once, whatever its job says
        return "failed", "failed", alerted, job
    drift = ""
    if job is not None:
        if job.state in ("failed", "refused"):
            what = JOB_REFUSED if job.state == "refused" else JOB_FAILED
            return "failed", "failed", f"{what}: {job.error}" if job.error else what, job
        if job.state == "succeeded":
            if not seen.live:
                return "passed", "succeeded", "", job
            drift = heartbeat_problem(obs.heartbeats.get(node.name), job, seen.target)
            if not drift and not seen.checks_apply:
                return "passed", "succeeded", "", job
            if not drift:
                health = judge_node_health(node, seen)
                if health.verdict is not None:
                    state = "succeeded" if health.verdict == "passed" else health.verdict
                    verdict = "failed" if health.verdict == "timed_out" else health.verdict
                    return verdict, state, health.error, job
    if not in_fleet:
        return "unknown", "unknown", "node removed from nodes/", job
    since = obs.unreachable_since.get(node.name)
    unreachable = since is not None or (job is not None and job.state == "unreachable")
    # An outage counts only from dispatch: a new attempt gets its own offlineAfter.
    if since is not None and now - max(since, node.dispatched_at) >= seen.offline_after:
        lasted = format_duration(seen.offline_after_seconds)
        if job is not None and job.error.startswith(NO_EVIDENCE):
            # Reachable, but not believed: say so, not "unreachable".
            return "unknown", "unknown", f"{job.error} (for {lasted} or more)", job
        return "unknown", "unknown", f"agent unreachable for {lasted} or more", job
    if now >= node.deadline:
        if unreachable:
            return "unknown", "unknown", "agent unreachable when the deadline passed", job
        if job is not None and job.state == "succeeded":
            if drift.startswith("drift"):
                return "failed", "failed", drift, job
            return "failed", "timed_out", f"deadline passed: {drift}", job
        state = "no answer" if job is None else f"job still {job.state}"
        return "failed", "timed_out", f"deadline passed: {state}", job
    return None


def judge_node_health(node: NodeRecord, seen: Seen) -> health_evidence.HealthJudgement:
    """The health checks (docs/health.md) on a live node whose apply succeeded and whose fresh
    heartbeat shows the target: its checks decide."""
    assert seen.health is not None and node.job_id is not None and node.deadline is not None
    beat = seen.observations.heartbeats.get(node.name)
    beat_time = None
    if beat is not None:
        try:
            beat_time = parse_time(beat.time)
        except ValueError:
            beat = None
    found = health_evidence.standings(
        seen.health,
        node.name,
        node.job_id,
        {} if beat is None else {c.name: c for c in beat.checks if c.job_id == node.job_id},
        beat_time,
        seen.observations.metric_checks,
        seen.now,
        seen.offline_after,
        seen.prometheus_configured,
    ) + comparisons.standings(
        seen.health,
        node.name,
        node.job_id,
        seen.observations.canary.get(node.name),
        seen.alerts,
        seen.now,
    )
    return health_evidence.judge_health(found, deadline_passed=seen.now >= node.deadline)


def heartbeat_problem(beat: Heartbeat | None, job: JobObservation, target: Target) -> str:
    """Empty when a heartbeat after the job finished shows the target;
    else what is missing (``drift: ...`` when it shows something else)."""
    if beat is None:
        return "no heartbeat after the job finished"
    try:
        fresh = job.finished_at is not None and parse_time(beat.time) > parse_time(job.finished_at)
    except ValueError:
        fresh = False
    if not fresh:
        return "no heartbeat after the job finished"
    runtime = beat.runtime(target.runtime)
    if runtime is None:
        return f"drift: heartbeat does not report runtime {target.runtime}"
    if (runtime.provider, runtime.model) != (target.provider, target.model):
        return (
            f"drift: heartbeat shows {runtime.provider}/{runtime.model}, "
            f"expected {target.provider}/{target.model}"
        )
    return ""


def judge_restore(
    restore: RestoreRecord, job: JobObservation | None, now: datetime
) -> tuple[str, str] | None:
    """(outcome, error) of a restore job, or None while it waits: the
    agent's answer decides; with none by the deadline it failed."""
    if job is not None and job.state in ("failed", "refused"):
        error = f"restore {job.state}: {job.error}" if job.error else f"restore {job.state}"
        return "rollback_failed", error
    if job is not None and job.state == "succeeded":
        return "rolled_back", ""
    if now >= restore.deadline:
        return "rollback_failed", NO_RESTORE_EVIDENCE
    return None


# A restore's error when its deadline, not an answer, decided it.
NO_RESTORE_EVIDENCE = "no evidence of the restore by its deadline"


def recorded_restore(job: JobObservation | None) -> NodeEvidence | None:
    """What a restore keeps of the signed answer its outcome used: the job
    record, when an answer (succeeded, failed or refused) decided it and it
    verified against the node's agentKey; a restore reads no heartbeat."""
    if job is None or job.state not in ("succeeded", "failed", "refused"):
        return None
    return recorded("decided", job, None)


def recorded(
    verdict: str, job: JobObservation | None, beat: Heartbeat | None
) -> NodeEvidence | None:
    """What a node's status keeps of the signed answers its verdict used
    (docs/trust.md): the job record, and for a live rollout the heartbeat.
    The daemon leaves ``signed`` on an observation only when it verified
    against the node's agentKey, so unsigned evidence records nothing;
    ``unknown`` rests on no evidence at all."""
    if verdict == "unknown" or job is None or job.signed is None:
        return None
    signed_beat = beat.signed if beat is not None else None
    if signed_beat is not None and signed_beat.key_id != job.signed.key_id:
        signed_beat = None
    return NodeEvidence(
        key_id=job.signed.key_id,
        job_record=job.signed.body,
        job_signature=job.signed.signature,
        heartbeat=signed_beat.body if signed_beat is not None else None,
        heartbeat_signature=signed_beat.signature if signed_beat is not None else None,
    )
