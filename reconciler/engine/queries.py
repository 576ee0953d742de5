"""What a recorded status asks of the daemon between steps: the jobs in
flight (rebuilt from status alone, so any daemon builds the same payload
for the same job id), the heartbeats, metric answers and backup lists the
next step needs, and when a step could next change something. Read from
the node records, never from the stored ``progress``. Pure; decides no
rule (the step does)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime

from reconciler.engine import baselines, releases, staging
from reconciler.engine.holds import RESTORE_STATES, restore_waiting
from reconciler.engine.staging import stage_job
from reconciler.protocol.effects import SendJob
from reconciler.spec.baseline_records import Answers
from reconciler.spec.health import HealthCheck
from reconciler.spec.rollout_status import FrozenSpec, NodeRecord, RestoreRecord, RolloutStatus


def apply_job(
    rollout: str, frozen: FrozenSpec, node: NodeRecord, baseline: Answers = ()
) -> SendJob:
    """A node's apply, rebuilt from status alone; ``baseline``: the
    recorded baseline answers its evals' matchesBaseline cases carry."""
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
        artifacts=frozen.artifacts,
        signature=frozen.signature,
        signers=frozen.signers,
        drain=frozen.drain if frozen.live else None,
        warmup=frozen.warmup if frozen.live else (),
        evals=frozen.evals if frozen.live else (),
        baseline_answers=baseline if frozen.live else (),
        standby=frozen.standby if frozen.live else None,
    )


def restore_job(rollout: str, frozen: FrozenSpec, node: str, restore: RestoreRecord) -> SendJob:
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


def open_nodes(status: RolloutStatus) -> Iterable[NodeRecord]:
    """Nodes that may have a job in flight: running batches, restores, and
    the batches staged ahead."""
    if status.frozen is None:
        return
    if status.frozen.spread_by is not None:
        # Spread batches are not consecutive chunks: each record names its batch.
        running = {b.index for b in status.batches if b.state == "running"}
        yield from (node for node in status.nodes if node.batch in running)
    else:
        starts = status.frozen.batch_starts(len(status.nodes))
        for b in status.batches:
            if b.state == "running":
                yield from status.nodes[starts[b.index - 1] : starts[b.index]]
    for node in status.nodes:
        if node.state in RESTORE_STATES and status.batches[node.batch - 1].state != "running":
            yield node
    ahead = staging.window(status.frozen, status.batches)
    if ahead and status.frozen.spread_by is None:
        starts = status.frozen.batch_starts(len(status.nodes))
        yield from status.nodes[starts[ahead.start - 1] : starts[ahead.stop - 1]]
    elif ahead:
        yield from (node for node in status.nodes if node.batch in ahead)


def restores_in_flight(status: RolloutStatus) -> bool:
    """Whether some node is being restored, read from the node records."""
    return any(node.state in RESTORE_STATES for node in status.nodes)


def in_flight(statuses: Iterable[RolloutStatus]) -> tuple[SendJob, ...]:
    """Every recorded job not finished: the daemon reads each from its agent
    and resends (same id, same payload) any the agent does not know. The
    payload is rebuilt from status alone."""
    jobs: list[SendJob] = []
    for status in statuses:
        if status.frozen is None:
            continue
        answers = baselines.answers_for_applies(status.eval_baseline)
        if not status.terminal and status.start_commit is not None:
            jobs.extend(
                baselines.eval_job(status.name, status.frozen, status.start_commit, job)
                for job in status.eval_baseline
                if job.state == "running"
            )
        for node in open_nodes(status):
            if node.state == "dispatched":
                jobs.append(apply_job(status.name, status.frozen, node, answers))
            elif node.state == "staging" and status.start_commit is not None:
                jobs.append(stage_job(status.name, status.frozen, status.start_commit, node))
            elif node.state in RESTORE_STATES and node.restore is not None:
                jobs.append(restore_job(status.name, status.frozen, node.name, node.restore))
        if status.frozen.standby is not None:
            jobs.extend(
                releases.release_job(status.name, status.frozen, node)
                for node in open_releases(status)
            )
    return tuple(jobs)


def open_releases(status: RolloutStatus) -> Iterable[NodeRecord]:
    """Nodes whose release was sent and not yet answered (any phase)."""
    if status.frozen is None or status.frozen.standby is None:
        return ()
    return (n for n in status.nodes if n.standby is not None and n.standby.release_open)


def stage_deadlines(
    statuses: Iterable[RolloutStatus], job_ids: Collection[str]
) -> dict[str, datetime]:
    """Stage job id -> its deadline, for the stage jobs in flight among ``job_ids``."""
    found: dict[str, datetime] = {}
    for status in statuses:
        if status.frozen is None or not status.frozen.artifacts:
            continue
        for node in open_nodes(status):
            stage = node.stage
            if node.state == "staging" and stage is not None and stage.job_id in job_ids:
                found[stage.job_id] = staging.deadline(status.frozen, stage)
    return found


def wanted_heartbeats(statuses: Iterable[RolloutStatus]) -> tuple[str, ...]:
    """Nodes whose heartbeat the next step needs: dispatched nodes of live rollouts."""
    names: dict[str, None] = {}
    for status in statuses:
        if status.frozen is None or not status.frozen.live:
            continue
        for node in open_nodes(status):
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
        for node in open_nodes(status):
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
        for node in open_nodes(status):
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
        if not status.terminal:
            for job in status.eval_baseline:
                if job.state == "running":
                    consider(job.deadline)
        for node in open_nodes(status):
            if node.state == "dispatched":
                consider(node.deadline)
            elif node.state == "staging" and node.stage is not None and status.frozen is not None:
                consider(staging.deadline(status.frozen, node.stage))
            elif node.state in RESTORE_STATES and node.restore is not None:
                consider(node.restore.deadline)
        for node in open_releases(status):
            assert node.standby is not None
            consider(node.standby.release_deadline)
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
        or any(restore_waiting(n) for n in open_nodes(status))
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
        and not any(restore_waiting(n) for n in open_nodes(status))
    )
