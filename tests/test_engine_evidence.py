"""The evidence rules of a node's verdict (docs/rollouts.md) as pure functions (``engine.evidence``): one
node's observations in, a verdict or "wait" out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from reconciler.engine.evidence import Seen, heartbeat_problem, judge_apply, judge_restore
from reconciler.protocol.observations import Heartbeat, JobObservation, Observations, RuntimeReport
from reconciler.spec.model import Target
from reconciler.spec.rollout_status import NodeRecord, RestoreRecord

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
TARGET = Target(runtime="hermes", provider="ollama", model="llama3.1-8b", profile="default")
NODE = NodeRecord(
    name="a",
    batch=1,
    state="dispatched",
    attempt=1,
    job_id="job-1",
    dispatched_at=T0,
    deadline=T0 + timedelta(minutes=5),
)
SUCCEEDED = JobObservation("job-1", "succeeded", finished_at="2026-12-01T12:00:10Z")


def judge(
    job: JobObservation | None = None,
    heartbeat: Heartbeat | None = None,
    *,
    live: bool = False,
    in_fleet: bool = True,
    unreachable_since: datetime | None = None,
    offline_after: int = 600,
    now: datetime = T0 + timedelta(seconds=30),
) -> Any:
    """judge_apply on node "a" with what a pass saw of it."""
    seen = Seen(
        Observations(
            jobs={"job-1": job} if job is not None else {},
            heartbeats={"a": heartbeat} if heartbeat is not None else {},
            unreachable_since={"a": unreachable_since} if unreachable_since is not None else {},
        ),
        TARGET,
        live,
        timedelta(seconds=offline_after),
        offline_after,
        now,
    )
    return judge_apply(NODE, seen, in_fleet)


def beat(at: str, model: str = "llama3.1-8b", runtime: str = "hermes") -> Heartbeat:
    return Heartbeat("a", at, runtimes=(RuntimeReport(runtime, "ollama", model, "default"),))


def test_a_dry_run_passes_on_the_agents_success() -> None:
    assert judge(job=SUCCEEDED) == ("passed", "succeeded", "", SUCCEEDED)


def test_the_agents_failure_or_refusal_fails_the_node_at_once() -> None:
    failed = JobObservation("job-1", "failed", error="apply_failed: exit 1")
    refused = JobObservation("job-1", "refused", error="bad_signature")
    assert judge(job=failed)[:3] == ("failed", "failed", "job failed: apply_failed: exit 1")
    assert judge(job=refused)[:3] == ("failed", "failed", "refused by the agent: bad_signature")


def test_live_success_needs_a_fresh_heartbeat_showing_the_target() -> None:
    fresh = beat("2026-12-01T12:00:20Z")
    assert judge(job=SUCCEEDED, live=True, heartbeat=fresh)[:2] == ("passed", "succeeded")
    # Before the deadline, a stale heartbeat means: wait.
    assert judge(job=SUCCEEDED, live=True, heartbeat=beat("2026-12-01T12:00:05Z")) is None


def test_past_the_deadline_drift_fails_and_missing_evidence_times_out() -> None:
    late = T0 + timedelta(minutes=6)
    drifted = beat("2026-12-01T12:00:20Z", model="mistral-7b")
    assert judge(job=SUCCEEDED, live=True, heartbeat=drifted, now=late)[:3] == (
        "failed",
        "failed",
        "drift: heartbeat shows ollama/mistral-7b, expected ollama/llama3.1-8b",
    )
    assert judge(now=late)[:3] == ("failed", "timed_out", "deadline passed: no answer")
    running = JobObservation("job-1", "running")
    assert judge(job=running, now=late)[2] == "deadline passed: job still running"


def test_an_unreachable_agent_is_unknown_after_offline_after_or_at_the_deadline() -> None:
    since = T0 - timedelta(hours=1)  # counted from dispatch, not from before it
    assert judge(unreachable_since=since, now=T0 + timedelta(minutes=1), offline_after=120) is None
    assert judge(unreachable_since=since, now=T0 + timedelta(minutes=2), offline_after=120)[:3] == (
        "unknown",
        "unknown",
        "agent unreachable for 2m or more",
    )
    unreachable = JobObservation("job-1", "unreachable")
    assert judge(job=unreachable, now=T0 + timedelta(minutes=5))[:3] == (
        "unknown",
        "unknown",
        "agent unreachable when the deadline passed",
    )


def test_evidence_seen_now_beats_the_deadline_and_a_removed_node_is_unknown() -> None:
    assert judge(job=SUCCEEDED, now=T0 + timedelta(hours=1))[:2] == ("passed", "succeeded")
    assert judge(in_fleet=False)[:3] == ("unknown", "unknown", "node removed from nodes/")


def test_heartbeat_problem_names_what_is_missing() -> None:
    assert heartbeat_problem(None, SUCCEEDED, TARGET) == "no heartbeat after the job finished"
    other = beat("2026-12-01T12:00:20Z", runtime="vllm")
    assert heartbeat_problem(other, SUCCEEDED, TARGET) == (
        "drift: heartbeat does not report runtime hermes"
    )
    assert heartbeat_problem(beat("not a time"), SUCCEEDED, TARGET) == (
        "no heartbeat after the job finished"
    )


def test_a_restore_is_decided_by_the_agent_or_by_its_deadline() -> None:
    restore = RestoreRecord(
        request="r1",
        job_id="restore-1",
        backup_id="bk-1",
        attempt=1,
        source_commit="c0ffee0",
        dispatched_at=T0,
        deadline=T0 + timedelta(minutes=5),
    )
    ok = JobObservation("restore-1", "succeeded")
    bad = JobObservation("restore-1", "failed", error="restore_failed: gone")
    assert judge_restore(restore, ok, T0) == ("rolled_back", "")
    assert judge_restore(restore, bad, T0) == (
        "rollback_failed",
        "restore failed: restore_failed: gone",
    )
    assert judge_restore(restore, None, T0 + timedelta(minutes=1)) is None
    assert judge_restore(restore, None, T0 + timedelta(minutes=5)) == (
        "rollback_failed",
        "no evidence of the restore by its deadline",
    )
