"""Start-up recovery: every job a previous run of the agent left unfinished
ends ``failed``, saying whether the config was left old or new. A job id is
never run again, so nothing here runs one.

One exception to leaving the config as found: a live apply with evals that
left the new config in place had not seen its evals hold, and a model that
did not pass them must never serve. Its previous bytes are put back from
its backup (or the config removed, when there was none), and ``recover``
returns it so the agent runs after-apply and undrain for it.

Must not: change a backup, or a config other than that way back.
"""

from __future__ import annotations

from typing import Any

from reconciler.node import model_dirs
from reconciler.node.artifact_store import config_entries
from reconciler.node.journal import Journal
from reconciler.node.runtime_config import TARGET_FIELDS, JobFailed, parse_config
from reconciler.node.state_dir import BackupInfo, JobRecord, StateDir, digest
from reconciler.protocol.job_view import JobPayload
from reconciler.spec.safe_yaml import dump_yaml
from reconciler.spec.times import format_time


def recover(journal: Journal, state: StateDir) -> list[JobRecord]:
    """Fail every job a previous run left unfinished; never run it again.
    Returns the live applies whose unevaluated config was put back."""
    now = format_time(journal.clock())
    put_back = []
    for record in list(journal.jobs.values()):
        if record.state == "accepted":
            ended = _recovered_accepted(state, record, now)
        elif record.state == "running":  # journalled by agents before 2.x
            ended = _recovered(state, record, now)
        else:
            continue
        journal.save(ended)
        if ended.error == UNEVALUATED_PUT_BACK:
            put_back.append(ended)
    return put_back


UNEVALUATED_PUT_BACK = (
    "eval_failed: agent restarted before the job's evals held; the previous config was put "
    "back, so a model that did not pass them never serves"
)


def _recovered_accepted(state: StateDir, record: JobRecord, now: str) -> JobRecord:
    """A job the journal holds as "accepted": it never ran, or it was
    running. "running" is not journalled, since that would cost two
    fsyncs per job for what this reads back instead: the backup, durable
    before the config is replaced and naming its job, holds the bytes
    before; the bytes after follow from them and the payload. A job with
    no backup of its own replaced no config (it may have created one).
    The one case told less exactly than from a journalled "running": with
    no config before, a job still queued behind one that created exactly
    its own target config is also reported as having left it new."""
    job = record.job
    if job.kind == "stage":
        return record.with_changes(
            state="failed",
            finished_at=now,
            error="agent restarted while staging; no config was changed, and what was "
            "downloaded is kept for the next stage job to resume",
        )
    if job.kind == "eval":
        return record.with_changes(
            state="failed",
            finished_at=now,
            error="agent restarted during the eval job; nothing was changed",
        )
    if job.kind not in ("apply", "restore"):  # a release: it writes no config
        return record.with_changes(
            state="failed",
            finished_at=now,
            error=f"agent restarted during the {job.kind} job; no config was changed "
            "(a release is idempotent: send it again)",
        )
    runtime = job.target.runtime
    # The job's own backup is the newest of its runtime, so no prune
    # (retention is at least 1) removes it before the job's verdict.
    taken = next((b for b in state.list_backups() if b.job_id == record.job_id), None)
    before = taken.digest if taken is not None else None
    after = _planned_digest(state, job, taken)
    current = state.read_config(runtime)
    if taken is None and (current is None or after is None or digest(current[0]) != after):
        return record.with_changes(
            state="failed",
            finished_at=now,
            error="agent restarted before the job ran; nothing was changed",
        )
    planned = taken.backup_id if taken is not None else None
    running = record.with_changes(before=before, after=after, planned_backup=planned)
    return _recovered(state, running, now)


def _planned_digest(state: StateDir, job: JobPayload, taken: BackupInfo | None) -> str | None:
    """The digest of the config a live job writes, given the backup it
    took (None: there was no config); None when it cannot be told."""
    if not job.live:
        return None
    if job.kind == "restore":
        source = state.find_backup(str(job.backup_id))
        return source.digest if source is not None else None
    target = job.target
    wanted: dict[str, Any] = {k: getattr(target, k) for k in TARGET_FIELDS}
    if job.artifacts:
        artifacts = job.artifact_entries()
        wanted["artifacts"] = config_entries(state.root, artifacts)
        wanted["modelDir"] = str(model_dirs.location(state.root, artifacts))
    try:
        values = parse_config(target.runtime, state.read_backup(taken)) if taken is not None else {}
    except (JobFailed, OSError):
        return None
    return digest(dump_yaml({**values, **wanted}))


def _recovered(state: StateDir, record: JobRecord, now: str) -> JobRecord:
    runtime = record.job.target.runtime
    current = state.read_config(runtime)
    now_digest = digest(current[0]) if current else None
    if record.before is None and record.after is None:
        left = "untouched (the job was a dry run)"
    elif now_digest == record.after and now_digest != record.before:
        left = "new"
    elif now_digest == record.before:
        left = "old"
    else:
        left = "neither old nor new (changed by something else)"
    backup = record.planned_backup
    if backup is not None and state.find_backup(backup) is None:
        backup = None
    # A switch between slots wrote the config only once its evals held and
    # the new slot was routed to (``standby_switch``).
    evaluated = record.job.standby
    if left == "new" and record.job.evals and not evaluated and _put_back(state, record, backup):
        return record.with_changes(
            state="failed", finished_at=now, backup_id=backup, error=UNEVALUATED_PUT_BACK
        )
    return record.with_changes(
        state="failed",
        finished_at=now,
        backup_id=backup,
        error=f"agent restarted during apply; config left as {left}",
    )


def _put_back(state: StateDir, record: JobRecord, backup: str | None) -> bool:
    """The config before ``record``, byte for byte, in place again (no file
    when there was none); False when its bytes are not at hand."""
    runtime = record.job.target.runtime
    if record.before is None:
        state.write_config(runtime, None)
        return True
    info = state.find_backup(backup) if backup is not None else None
    if info is None:
        return False
    data = state.read_backup(info)
    if digest(data) != record.before:
        return False
    state.write_config(runtime, data, info.mode)
    return True
