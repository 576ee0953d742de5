"""Running one accepted job on one of the agent's two workers: a live
apply or restore (on the job worker) writes a backup of the old config,
then the new config, then runs ``--after-apply`` (putting the old bytes
back if it fails); a dry run only says what it would change; a stage job
(on the stage worker) downloads, so that no download ever delays an apply
or a restore. Every verdict goes through the journal.

Must not: answer HTTP, or admit jobs (``agent`` does both); run a job id
twice (the journal's "accepted" record is the only way in).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from reconciler.node import model_signatures
from reconciler.node.agent_config import AgentConfig
from reconciler.node.agent_log import AgentLog
from reconciler.node.agent_metrics import AgentMetrics
from reconciler.node.artifact_download import DownloadSettings
from reconciler.node.artifact_retention import (
    artifacts_to_prune,
    config_artifacts,
    job_artifacts,
    model_dirs_to_remove,
    pinned_by_jobs,
)
from reconciler.node.artifact_store import ArtifactStore
from reconciler.node.eval_job import run_eval_job
from reconciler.node.journal import Journal
from reconciler.node.live_switch import LiveSwitch
from reconciler.node.model_dirs import ModelDirs
from reconciler.node.node_command import run_command
from reconciler.node.probes import Prober
from reconciler.node.runtime_config import (
    TARGET_FIELDS,
    JobFailed,
    ParsedConfigs,
    describe_change,
    parse_config,
)
from reconciler.node.stage_job import Stager
from reconciler.node.standby_switch import StandbySwitch
from reconciler.node.state_dir import (
    CONFIG_MODE,
    BackupInfo,
    JobRecord,
    StateDir,
    UnsafePath,
    backups_to_prune,
    digest,
)
from reconciler.node.switchover import Timings
from reconciler.protocol.job_view import JobPayload, JobTarget
from reconciler.spec.artifacts import DEFAULT_STAGE_TIMEOUT, SIGNATURE_NAME
from reconciler.spec.safe_yaml import dump_yaml
from reconciler.spec.times import format_time


class JobRunner:
    """Runs jobs (``run``): applies and restores one at a time on the job
    worker, stage jobs one at a time on the stage worker."""

    def __init__(
        self,
        config: AgentConfig,
        state: StateDir,
        journal: Journal,
        configs: ParsedConfigs,
        prober: Prober,
        log: AgentLog,
        metrics: AgentMetrics,
        store: ArtifactStore,
    ) -> None:
        self.config = config
        self.state = state
        self.journal = journal
        self.clock: Callable[[], datetime] = journal.clock
        self.configs = configs
        self.prober = prober
        self.log = log
        self.metrics = metrics
        self.store = store
        self.models = ModelDirs(state.root, store)
        self.stager = Stager(
            store,
            DownloadSettings(rate=config.stage_rate, ca_file=config.ca_file),
            metrics.downloaded.inc,
        )
        # The two workers both note uses of artifacts and prune them.
        self._artifacts = threading.Lock()
        # The after-apply command's environment, to which each job adds its own:
        # read once (``os.environ`` decodes every entry each time it is copied).
        self._environment = dict(os.environ)
        self.slots = (
            StandbySwitch(
                config, state, self.command_environment, self.clock, metrics.counted_evals
            )
            if config.slots is not None
            else None
        )

    def close(self) -> None:
        self.stager.close()

    def probe_after(self, runtime: str, record: JobRecord) -> None:
        """Probe the checks of ``record`` when it was a successful live apply carrying them."""
        job = record.job
        if record.state == "succeeded" and job.kind == "apply" and job.live and job.checks:
            self.prober.start(runtime, record.job_id, job.checks)

    def run(self, job_id: str) -> None:
        started = time.monotonic()
        with self.journal.lock:
            record = self.journal.jobs[job_id]
        try:
            record = self._execute(record)
            runtime = record.job.target.runtime
            with self.journal.lock:
                newest = self.journal.newest_job.get(runtime) == record.job_id
            if newest:  # a job accepted since ends this one's checks
                self.probe_after(runtime, record)
        except JobFailed as exc:
            with self.journal.lock:
                record = self.journal.jobs[job_id]
            # A backup taken before the failure stays (and is reported): it holds
            # the config as it was before this job, whatever happened next.
            planned = record.planned_backup
            kept = planned if planned and self.state.find_backup(planned) else None
            extra: dict[str, Any] = {"timings": exc.timings} if exc.timings is not None else {}
            if exc.evals is not None:
                extra["evals"] = exc.evals
            record = self.journal.failed(
                record, error=exc.message, detail=exc.detail, backup_id=kept, **extra
            )
        except Exception as exc:  # the job fails, the agent carries on
            print(f"agent: job {job_id} failed unexpectedly: {exc!r}", file=sys.stderr)
            record = self.journal.failed(self.journal.jobs[job_id], error=f"agent error: {exc}")
        job = record.job
        self.log.finished(job, record.state, record.error or "")
        self.metrics.jobs.labels(kind=job.kind, outcome=record.state).inc()
        if job.kind == "stage" and job.live:
            self.metrics.stage_seconds.observe(time.monotonic() - started)
        try:
            self.journal.compact()
        except OSError as exc:  # the journal stays longer; the next job tries again
            print(f"agent: journal compaction failed: {exc}", file=sys.stderr)

    def _execute(self, record: JobRecord) -> JobRecord:
        """Run ``record``'s job by its kind: the one place a kind is told apart."""
        kind = record.job.kind
        runs: dict[str, Callable[[JobRecord], JobRecord]] = {
            "apply": self._change_config,
            "restore": self._change_config,
            "stage": self._stage,
            "release": self._release,
            "eval": lambda record: run_eval_job(self.journal, record),
        }
        run = runs.get(kind)
        if run is None:
            raise JobFailed(
                f"unsupported_kind: this agent does not run {kind} jobs; nothing was changed "
                "(upgrade the agent on this node)"
            )
        return run(record)

    def _change_config(self, record: JobRecord) -> JobRecord:
        """An apply or a restore."""
        job = record.job
        runtime = job.target.runtime
        try:
            self.state.refuse_config_symlink(runtime)
        except UnsafePath as exc:
            raise JobFailed(f"{exc.message}; nothing was changed: {exc.hint}") from None
        current = self.state.read_config(runtime)
        before_values = self.configs.values(runtime, current[0]) if current is not None else None
        if job.kind == "restore":
            new_data, new_mode, change = self._restored(job, runtime)
        else:
            planned = self._planned(job, current, before_values)
            if isinstance(planned, str):  # nothing to write: a dry run, or already in place
                return self.journal.update(
                    record, state="succeeded", detail=planned, finished_at=format_time(self.clock())
                )
            new_data, new_mode, change = planned
        if self.slots is not None and self.slots.takes(job):
            return self._switch_slots(record, current, before_values, (new_data, new_mode), change)
        return self._write(record, current, before_values, (new_data, new_mode), change)

    def _restored(self, job: JobPayload, runtime: str) -> tuple[bytes, int, str]:
        """The bytes, mode and description of the backup a restore puts back."""
        backup_id = job.backup_id or ""  # a restore always names one
        backup = self.state.find_backup(backup_id)
        if backup is None or backup.runtime != runtime:
            raise JobFailed(
                f"backup {backup_id} of runtime {runtime} is not on this node "
                "(GET /v1/nodes/NODE/backups lists what it holds)"
            )
        data = self.state.read_backup(backup)
        if digest(data) != backup.digest:
            raise JobFailed(f"backup {backup.backup_id} is damaged (digest mismatch)")
        return (
            data,
            backup.mode,
            f"restore backup {backup.backup_id} ({backup.provider} {backup.model})",
        )

    def _planned(
        self,
        job: JobPayload,
        current: tuple[bytes, int] | None,
        before_values: Mapping[str, Any] | None,
    ) -> tuple[bytes, int, str] | str:
        """What an apply writes (bytes, mode, description), or the detail of
        one that writes nothing."""
        wanted: dict[str, Any] = _target_values(job.target)
        change = describe_change(before_values, wanted)
        artifacts = job.artifact_entries()
        if artifacts:
            wanted["artifacts"] = self.store.config_entries(artifacts)
            wanted["modelDir"] = str(self.models.location(artifacts))
            before = before_values or {}
            pointed = ""
            if before.get("artifacts") != wanted["artifacts"]:
                pointed = "point to artifacts " + ", ".join(a.name for a in job.artifacts)
            elif before.get("modelDir") != wanted["modelDir"]:
                pointed = f"point to model directory {wanted['modelDir']}"
            if pointed:
                change = (change + "; " if change else "") + pointed
        if job.mode == "dry_run":
            return f"would {change}" if change else "no change: already in place"
        if not change:
            return "no change: already in place; nothing written, no backup"
        if artifacts:
            self.stager.require_held(artifacts)
            with self._artifacts:  # the stage worker may lay out the same directory
                model_dir = self.models.lay_out(artifacts)
            if job.signature:
                wanted["signedBy"] = self._vouched_for(job, model_dir)
        new_values = {**(before_values or {}), **wanted}
        if "signedBy" not in wanted:  # an unsigned target: no one vouched for it
            new_values.pop("signedBy", None)
        return dump_yaml(new_values), current[1] if current is not None else CONFIG_MODE, change

    def _write(
        self,
        record: JobRecord,
        current: tuple[bytes, int] | None,
        before_values: Mapping[str, Any] | None,
        new: tuple[bytes, int],
        change: str,
    ) -> JobRecord:
        """Back up the current config, write the new one, run after-apply
        (and drain and warm up around it when the job says so)."""
        job = record.job
        runtime = job.target.runtime
        old_data = current[0] if current is not None else None
        old_mode = current[1] if current is not None else CONFIG_MODE
        record, backup_id = self._running(record, current, new[0])
        switch = LiveSwitch.begin(
            job, before_values or {}, self.config, self.command_environment, Timings(self.clock)
        )
        if current is not None and backup_id is not None:
            now = format_time(self.clock())
            _take_backup(self.state, now, backup_id, job, current, before_values)
        written = self.configs.values(runtime, new[0])
        self.state.write_config(runtime, new[0], new[1])
        switch.activated()
        failure = self._after_apply(job, written) if self.config.after_apply else None
        if failure is None:
            failure = switch.warm_up()
        if failure is None:
            failure = switch.evaluate()
        self.metrics.counted_evals(r.held for r in switch.eval_results)
        if failure is not None:
            # Put the previous bytes (and mode) back exactly, or no file if none.
            self.state.write_config(runtime, old_data, old_mode)
            what, tail = failure
            what += switch.put_back(self._after_apply if self.config.after_apply else None)
            last = tail.strip()[-300:]
            raise JobFailed(
                what + (f"; output: {last}" if last else ""),
                detail=tail,
                timings=switch.timings(),
                evals=switch.eval_records(),
            )
        switch.serving(written)
        self._prune(runtime)
        self.prune_artifacts(runtime, job)
        return self.journal.update(
            record,
            state="succeeded",
            backup_id=backup_id,
            detail=change[0].upper() + change[1:] if change else "",
            finished_at=format_time(self.clock()),
            timings=switch.timings(),
            evals=switch.eval_records(),
        )

    def _running(
        self, record: JobRecord, current: tuple[bytes, int] | None, new_data: bytes
    ) -> tuple[JobRecord, str | None]:
        """The record as running, with the backup id it will take."""
        runtime = record.job.target.runtime
        backup_id = self._backup_id(runtime, record.job) if current is not None else None
        # In memory only, for GET: recovery reads the same from the backup
        # (``_recovered_accepted``), so the journal keeps "accepted" until the verdict.
        record = record.with_changes(
            state="running",
            before=digest(current[0] if current is not None else None),
            after=digest(new_data),
            planned_backup=backup_id,
        )
        with self.journal.lock:
            self.journal.keep(record)
        return record, backup_id

    def _switch_slots(
        self,
        record: JobRecord,
        current: tuple[bytes, int] | None,
        before_values: Mapping[str, Any] | None,
        new: tuple[bytes, int],
        change: str,
    ) -> JobRecord:
        """A switch to another slot (``standby_switch``): the runtime's
        config changes only once the new slot is routed to; no after-apply."""
        assert self.slots is not None
        job = record.job
        runtime = job.target.runtime
        record, backup_id = self._running(record, current, new[0])
        if current is not None and backup_id is not None:
            now = format_time(self.clock())
            _take_backup(self.state, now, backup_id, job, current, before_values)
        written = self.configs.values(runtime, new[0])
        switched = self.slots.switch(job, new, written)
        self.state.write_config(runtime, new[0], new[1])
        said = self.slots.settle(job, switched)
        self._prune(runtime)
        self.prune_artifacts(runtime, job)
        detail = "; ".join(
            d for d in (change[0].upper() + change[1:] if change else "", switched.detail) if d
        )
        return self.journal.update(
            record,
            state="succeeded",
            backup_id=backup_id,
            detail=detail + said,
            finished_at=format_time(self.clock()),
            timings=switched.timings,
            evals=switched.evals,
            standby=switched.standby,
        )

    def _release(self, record: JobRecord) -> JobRecord:
        """Stop the slot kept warm; with no slots, nothing was kept."""
        if self.slots is None:
            released: dict[str, Any] = {"slot": None, "stopped": False}
            detail = "no slots on this node: nothing kept warm, nothing to stop"
        else:
            released, detail = self.slots.release(record.job)
        return self.journal.update(
            record,
            state="succeeded",
            detail=detail,
            finished_at=format_time(self.clock()),
            released=released,
        )

    def serve_previous(self, record: JobRecord) -> None:
        """After a restart put back the config of a live apply whose evals
        had not held (``recovery``): after-apply for it, and undrain when the
        job had drained the node."""
        job = record.job
        runtime = job.target.runtime
        current = self.state.read_config(runtime)
        values = self.configs.values(runtime, current[0]) if current is not None else {}
        switch = LiveSwitch(
            job,
            values,
            self.config,
            self.command_environment,
            Timings(self.clock),
            versioned=True,  # an apply with evals: after-apply and undrain as for any switch
        )
        switch.drained = job.drain is not None
        said = switch.put_back(self._after_apply if self.config.after_apply else None)
        # put_back's words start with "; previous config restored": said already.
        more = said.removeprefix("; previous config restored")
        self.journal.update(record, error=(record.error or "") + more)

    def _stage(self, record: JobRecord) -> JobRecord:
        job = record.job
        artifacts = job.artifact_entries()
        signature = job.signature
        # The signature is staged like an artifact, into the store only.
        files = (
            [*artifacts, {"name": SIGNATURE_NAME, **signature.entry}] if signature else artifacts
        )
        # A job from an older daemon carries no timeout: the default stage.timeout.
        seconds = float(
            job.timeout_seconds if job.timeout_seconds is not None else DEFAULT_STAGE_TIMEOUT
        )
        vouched = None
        if job.mode == "dry_run":
            detail = self.stager.dry_run(files, seconds)
        else:
            with self._artifacts:
                self.store.note_use([a["sha256"] for a in files], job.target.runtime)
            self.prune_artifacts(job.target.runtime, job)  # room for these
            detail = self.stager.stage(files, seconds)
            with self._artifacts:  # ahead, so the apply finds it ready
                model_dir = self.models.lay_out(artifacts)
            if signature:
                # Outside the lock: the library re-hashes every file, and an
                # apply or restore must not wait for that.
                vouched = model_signatures.verify(
                    model_dir,
                    self.store.path(signature.sha256),
                    signature.sha256,
                    job.signers,
                    artifacts,
                )
                with self._artifacts:
                    self.models.mark_verified(model_dir, vouched.signer, vouched.sha256)
                detail += f"; verified: signed by {vouched.signer}"
        return self.journal.update(
            record,
            state="succeeded",
            detail=detail,
            finished_at=format_time(self.clock()),
            signature=None if vouched is None else vouched.record(),
        )

    def _vouched_for(self, job: JobPayload, model_dir: Path) -> str:
        """The signer that vouched for ``model_dir`` at its stage, or
        ``not_staged``: a signed target is never activated unverified."""
        assert job.signature is not None
        sha256 = job.signature.sha256
        signer = self.models.verified(model_dir, sha256)
        if signer is None or signer not in {s.name for s in job.signers}:
            raise JobFailed(
                f"not_staged: the model directory {model_dir} was not verified against "
                f"signature {sha256[:12]}... on this node; a stage job verifies "
                "it first; nothing was changed"
            )
        model_signatures.refuse_links(model_dir)  # nothing slipped in since
        return signer

    def prune_artifacts(self, runtime: str, job: JobPayload) -> None:
        """Delete the artifacts retention no longer keeps (``artifact_retention``)."""
        with self._artifacts:
            self._prune_artifacts(job)

    def _prune_artifacts(self, job: JobPayload) -> None:
        held = self.store.held()
        if not held:
            return  # nothing to delete: no need to work out what is pinned
        pinned: set[str] = set()
        newest_backup: dict[str, BackupInfo] = {}
        for backup in self.state.list_backups():
            known = newest_backup.get(backup.runtime)
            if known is None or backup.seq > known.seq:
                newest_backup[backup.runtime] = backup
        for name in self.config.runtimes:
            current = self.state.read_config(name)
            previous = newest_backup.get(name)
            for data in (
                current[0] if current is not None else None,
                self.state.read_backup(previous) if previous is not None else None,
            ):
                if data is not None:
                    with contextlib.suppress(JobFailed):
                        pinned |= config_artifacts(parse_config(name, data))
        with self.journal.lock:
            pinned |= pinned_by_jobs(list(self.journal.jobs.values()))
        pinned |= job_artifacts(job.signed)
        doomed = artifacts_to_prune(self.store.uses, held, pinned, self.config.keep_artifacts)
        if doomed:
            # The directories first: a crash in between leaves files, not a
            # directory missing some.
            self.models.delete(model_dirs_to_remove(self.models.held(), doomed))
            self.store.delete(doomed)

    def _backup_id(self, runtime: str, job: JobPayload) -> str:
        stamp = self.clock().strftime("%Y%m%dT%H%M%SZ")
        # A job id runs once, so its digest makes the id unique on this node.
        return f"{runtime}-{stamp}-{hashlib.sha256(job.job_id.encode()).hexdigest()[:8]}"

    def _prune(self, runtime: str) -> None:
        with self.journal.lock:
            busy = {r.job.backup_id for r in self.journal.in_flight.values()}
        every = self.state.list_backups()
        # A rollout with nothing done here for ``keep_first_backups`` no
        # longer keeps its first backups beyond ``backup_retention``.
        horizon = self.clock() - timedelta(seconds=self.config.keep_first_backups)
        backups = [b for b in every if b.runtime == runtime]
        for backup_id in backups_to_prune(
            backups,
            self.config.backup_retention,
            {b for b in busy if b},
            self.journal.finished_rollouts(every, horizon),
        ):
            self.state.delete_backup(backup_id)

    def _after_apply(self, job: JobPayload, written: Mapping[str, Any]) -> tuple[str, str] | None:
        """None when the command succeeded, else (what happened, output tail).
        Provider, model and profile are those of the config just written: for
        a restore, the restored ones, not the target rolled back from."""
        command = self.config.after_apply
        assert command is not None
        return run_command(
            "after-apply command",
            command,
            self.command_environment(job, written),
            self.config.after_apply_timeout,
        )

    def command_environment(self, job: JobPayload, written: Mapping[str, Any]) -> dict[str, str]:
        """The environment node-local commands run with for ``job``."""
        runtime = job.target.runtime
        env = dict(self._environment)
        env.update(
            {
                "RECONCILER_JOB_ID": job.job_id,
                "RECONCILER_KIND": job.kind,
                "RECONCILER_NODE": job.node,
                "RECONCILER_ROLLOUT": job.rollout,
                "RECONCILER_ATTEMPT": str(job.attempt),
                "RECONCILER_MODE": job.mode,
                "RECONCILER_RUNTIME": runtime,
                "RECONCILER_PROVIDER": str(written.get("provider", "")),
                "RECONCILER_MODEL": str(written.get("model", "")),
                "RECONCILER_PROFILE": str(written.get("profile", "")),
                "RECONCILER_BACKUP_ID": job.backup_id or "",
                "RECONCILER_SOURCE_COMMIT": job.source_commit,
                "RECONCILER_CONFIG": self.state.config_location(runtime),
            }
        )
        return env


def _take_backup(
    state: StateDir,
    now: str,
    backup_id: str,
    job: JobPayload,
    current: tuple[bytes, int],
    values: Mapping[str, Any] | None,
) -> None:
    """Save ``current`` (bytes, mode), the config a job replaces, as ``backup_id``."""
    values = values or {}
    info = BackupInfo(
        backup_id=backup_id,
        runtime=job.target.runtime,
        created_at=now,
        seq=state.next_seq(),
        job_id=job.job_id,
        rollout=job.rollout,
        provider=str(values.get("provider", "")),
        model=str(values.get("model", "")),
        profile=str(values.get("profile", "")),
        mode=current[1],
        digest=digest(current[0]) or "",
    )
    state.save_backup(info, current[0])


def _target_values(target: JobTarget) -> dict[str, Any]:
    """The target's fields a runtime config holds, in ``TARGET_FIELDS`` order."""
    return {k: getattr(target, k) for k in TARGET_FIELDS}
