"""The node agent: verifies signed jobs, applies them to a runtime's config
(dry-run or live), keeps backups, restores them, and reports heartbeats
(docs/protocol.md).

Life of a posted job::

    admission checks (admission.admit_job)  -> 4xx, nothing written
    journal record "accepted", fsynced      -> 202
    worker thread: "running" with the config digests before and after, in
                   memory only (see ``_recovered_accepted``)
                   backup of the old bytes naming the job, fsynced
                   new config (atomic rename), fsynced
                   after-apply command; if it fails or times out the old
                   bytes (and mode) go back and the job fails
                   -> "succeeded" / "failed", fsynced

A live apply costs the durable writes its promises need and no more: the
record behind a 202 (one file and one directory fsync), the backup before
the config is replaced (two files, one directory fsync), the config before
"succeeded", and the verdict before it is shown.

Jobs run one at a time, in the order accepted. A job id is executed at most
once: the journal is written before anything runs, and on start an agent
turns every record it finds "accepted" or "running" into "failed", saying
whether the config was left old or new. The config is never torn, since it
is only ever replaced by rename.

Must not: trust anything unsigned; write outside its state directory (the
after-apply command is the operator's); decide anything about rollouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import selectors
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from reconciler import __version__
from reconciler.node.agent_log import AgentLog
from reconciler.node.agent_metrics import AgentMetrics
from reconciler.node.http_server import HttpServer, Request, Response, json_response
from reconciler.node.probes import Prober
from reconciler.node.state_dir import (
    CONFIG_MODE,
    BackupInfo,
    JobRecord,
    StateDir,
    UnsafePath,
    backups_to_prune,
    digest,
)
from reconciler.protocol.admission import admit_job
from reconciler.protocol.evidence import sign_answer
from reconciler.protocol.long_poll import FINISHED_JOB_STATES, newer_than, wait_seconds
from reconciler.protocol.observations import signed_list_asked
from reconciler.protocol.signing import JobRefused, SigningKey, TrustedKey
from reconciler.spec.safe_yaml import YamlProblem, dump_yaml, load_yaml
from reconciler.spec.times import format_time, parse_time

TARGET_FIELDS = ("provider", "model", "profile")
OUTPUT_TAIL = 2000  # characters of after-apply output kept in a job's result
DEFAULT_RETENTION = 20
DEFAULT_AFTER_APPLY_TIMEOUT = 60.0
DEFAULT_KEEP_FIRST_BACKUPS = 30 * 24 * 3600  # seconds
# A finished job's record is kept this long after its payload expired. Until
# expiresAt (issuedAt + 15 minutes) the record is what stops the job running
# twice; after it, admission refuses the payload as `expired` anyway, and the
# record only answers a daemon that still reads the job (one that was down, or
# slow). A day covers a daemon restart or an outage of that length.
JOURNAL_KEEP_AFTER_EXPIRY = timedelta(hours=24)
# A dropped record's id is kept this long more: a resend (fresh issuedAt)
# of a job that ran is refused, not run again, while it is kept.
DROPPED_IDS_KEPT = timedelta(days=30)
COMPACT_EVERY = timedelta(minutes=1)  # agent clock; compaction is a scan of the journal


@dataclass(frozen=True)
class AgentConfig:
    node: str
    trusted: Mapping[str, TrustedKey]
    runtimes: frozenset[str]
    allow_live: bool = False
    after_apply: str | None = None
    after_apply_timeout: float = DEFAULT_AFTER_APPLY_TIMEOUT
    backup_retention: int = DEFAULT_RETENTION
    key: SigningKey | None = None  # signs every answer (docs/trust.md); None: unsigned
    keep_first_backups: int = DEFAULT_KEEP_FIRST_BACKUPS  # seconds


class _JobFailed(Exception):
    """Ends a job as failed with this message (and ``detail``)."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


def _now() -> datetime:
    return datetime.now(UTC)


def _parse_config(runtime: str, data: bytes) -> dict[str, Any]:
    try:
        value = load_yaml(f"runtimes/{runtime}.yaml", data)
    except YamlProblem as exc:
        raise _JobFailed(
            f"the current config is not valid YAML ({exc.problem}); fix or remove it"
        ) from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _JobFailed(f"the current config runtimes/{runtime}.yaml is not a YAML mapping")
    return value


def _describe(before: Mapping[str, Any] | None, target: Mapping[str, str]) -> str:
    if before is None:
        return "create the config with " + ", ".join(f"{k} {target[k]}" for k in TARGET_FIELDS)
    changes = [
        f"{k} {before.get(k)} -> {target[k]}" for k in TARGET_FIELDS if before.get(k) != target[k]
    ]
    return "change " + ", ".join(changes) if changes else ""


class Agent:
    """One node's agent: ``handle`` serves the protocol, a worker thread runs jobs."""

    def __init__(
        self,
        config: AgentConfig,
        state: StateDir,
        clock: Callable[[], datetime] = _now,
        log: AgentLog | None = None,
    ) -> None:
        self.config = config
        self.state = state
        self.clock = clock
        self.log = log or AgentLog()
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-job")
        self._worker.submit(int)  # its thread starts now, not in the first job's POST
        # The after-apply command's environment, to which each job adds its own:
        # read once (``os.environ`` decodes every entry each time it is copied).
        self._environment = dict(os.environ)
        self.jobs = state.load_jobs()
        self._dropped = state.load_dropped()  # job id -> when its record was dropped
        # runtime -> the config bytes last parsed and what they hold (read
        # only): the heartbeat and the next job read the config the last job
        # wrote, so it is parsed once, not at every read. Replaced whole, from
        # either thread.
        self._parsed: dict[str, tuple[bytes, Mapping[str, Any]]] = {}
        # Kept beside ``jobs`` by ``_keep`` (and compaction), so that a prune
        # does not scan the whole journal (a day of jobs on a busy node): the
        # records not finished yet, and each rollout's newest acceptance here
        # (None: to be counted again, after compaction dropped records).
        self._in_flight = {j: r for j, r in self.jobs.items() if r.state in _IN_FLIGHT}
        self._rollout_accepted: dict[str, datetime] | None = None
        # job id -> held ``?wait=`` answers, woken from the job's thread when it finishes
        self._waiters: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}
        self._compacted_at: datetime | None = None
        # Held ``?newerThan=&wait=`` heartbeat reads, and when the heartbeat
        # last changed by the agent's own doing (agent clock).
        self._beat_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._beat_changed_at = clock()
        self._recover()
        self.prober = Prober(clock, on_change=self._heartbeat_changed)
        self.metrics = AgentMetrics(self.prober.reports, state.list_backups, config.runtimes)
        self._newest_job: dict[str, str] = {}  # runtime -> the job accepted last
        self._resume_probes()
        self.compact()

    # -- start-up ------------------------------------------------------------------

    def _recover(self) -> None:
        """Fail every job a previous run left unfinished; never run it again."""
        now = format_time(self.clock())
        for record in list(self.jobs.values()):
            if record.state == "accepted":
                self._save(self._recovered_accepted(record, now))
            elif record.state == "running":  # journalled by agents before 2.x
                self._save(self._recovered(record, now))

    def _recovered_accepted(self, record: JobRecord, now: str) -> JobRecord:
        """A job the journal holds as "accepted": it never ran, or it was
        running. "running" is not journalled, since that would cost two
        fsyncs per job for what this reads back instead: the backup, durable
        before the config is replaced and naming its job, holds the bytes
        before; the bytes after follow from them and the payload. A job with
        no backup of its own replaced no config (it may have created one).
        The one case told less exactly than from a journalled "running": with
        no config before, a job still queued behind one that created exactly
        its own target config is also reported as having left it new."""
        payload = record.payload
        runtime = payload["target"]["runtime"]
        # The job's own backup is the newest of its runtime, so no prune
        # (retention is at least 1) removes it before the job's verdict.
        taken = next((b for b in self.state.list_backups() if b.job_id == record.job_id), None)
        before = taken.digest if taken is not None else None
        after = self._planned_digest(payload, taken)
        current = self.state.read_config(runtime)
        if taken is None and (current is None or after is None or digest(current[0]) != after):
            return record.with_changes(
                state="failed",
                finished_at=now,
                error="agent restarted before the job ran; nothing was changed",
            )
        planned = taken.backup_id if taken is not None else None
        running = record.with_changes(before=before, after=after, planned_backup=planned)
        return self._recovered(running, now)

    def _planned_digest(self, payload: Mapping[str, Any], taken: BackupInfo | None) -> str | None:
        """The digest of the config a live job writes, given the backup it
        took (None: there was no config); None when it cannot be told."""
        if payload.get("mode") != "live":
            return None
        if payload["kind"] == "restore":
            source = self.state.find_backup(str(payload.get("backupId")))
            return source.digest if source is not None else None
        wanted = {k: payload["target"][k] for k in TARGET_FIELDS}
        try:
            values = (
                _parse_config(payload["target"]["runtime"], self.state.read_backup(taken))
                if taken is not None
                else {}
            )
        except (_JobFailed, OSError):
            return None
        return digest(dump_yaml({**values, **wanted}))

    def _recovered(self, record: JobRecord, now: str) -> JobRecord:
        runtime = record.payload["target"]["runtime"]
        current = self.state.read_config(runtime)
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
        if backup is not None and self.state.find_backup(backup) is None:
            backup = None
        return record.with_changes(
            state="failed",
            finished_at=now,
            backup_id=backup,
            error=f"agent restarted during apply; config left as {left}",
        )

    def _config_values(self, runtime: str, data: bytes) -> Mapping[str, Any]:
        """``_parse_config`` of the runtime's current config bytes."""
        known = self._parsed.get(runtime)
        if known is not None and known[0] == data:
            return known[1]
        values = MappingProxyType(_parse_config(runtime, data))
        self._parsed[runtime] = (data, values)
        return values

    def _resume_probes(self) -> None:
        """After a restart, probe again the checks of each runtime's newest
        job when it was a successful live apply carrying checks (from
        scratch: a restart never lengthens a run of successes)."""
        newest: dict[str, JobRecord] = {}
        for record in self.jobs.values():
            runtime = record.payload["target"]["runtime"]
            known = newest.get(runtime)
            if known is None or parse_time(record.accepted_at) > parse_time(known.accepted_at):
                newest[runtime] = record
        for runtime, record in newest.items():
            self._newest_job[runtime] = record.job_id
            self._probe_after(runtime, record)

    def _probe_after(self, runtime: str, record: JobRecord) -> None:
        payload = record.payload
        if (
            record.state == "succeeded"
            and payload.get("kind") == "apply"
            and payload.get("mode") == "live"
            and payload.get("checks")
        ):
            self.prober.start(runtime, record.job_id, payload["checks"])

    def close(self) -> None:
        self._worker.shutdown(wait=True)
        self.prober.close()

    # -- bounded state ---------------------------------------------------------------

    def compact(self) -> int:
        """Drop finished records whose payload expired more than
        ``JOURNAL_KEEP_AFTER_EXPIRY`` ago; how many were dropped. Runs at
        most once per ``COMPACT_EVERY`` of the agent's clock."""
        now = self.clock()
        if self._compacted_at is not None and now - self._compacted_at < COMPACT_EVERY:
            return 0
        self._compacted_at = now
        with self._lock:
            probed = set(self._newest_job.values())  # its checks may still be probed
            doomed = [
                r.job_id
                for r in self.jobs.values()
                if r.state in ("succeeded", "failed")
                and r.job_id not in probed
                and _expired_before(r, now)
            ]
            if doomed or any(_before(t, now - DROPPED_IDS_KEPT) for t in self._dropped.values()):
                dropped = {
                    k: t for k, t in self._dropped.items() if not _before(t, now - DROPPED_IDS_KEPT)
                }
                dropped.update(dict.fromkeys(doomed, format_time(now)))
                self.state.save_dropped(dropped)  # before the records go
                self._dropped = dropped
            for job_id in doomed:
                self.state.delete_job(job_id)
                del self.jobs[job_id]
            if doomed:
                self._rollout_accepted = None  # a dropped one may have been the newest
        return len(doomed)

    def _finished_rollouts(self, backups: Sequence[BackupInfo]) -> set[str]:
        """Rollouts with no job in flight here and nothing done here (no job
        accepted, no backup taken) for ``keep_first_backups``: their first
        backups are no longer kept beyond ``backup_retention``."""
        horizon = self.clock() - timedelta(seconds=self.config.keep_first_backups)
        with self._lock:
            if self._rollout_accepted is None:
                self._rollout_accepted = {}
                for record in self.jobs.values():
                    _note_accepted(self._rollout_accepted, record)
            newest = dict(self._rollout_accepted)
            busy = {_rollout_of(r) for r in self._in_flight.values()}
        for backup in backups:
            moment = _stored_time(backup.created_at)
            newest[backup.rollout] = max(moment, newest.get(backup.rollout, moment))
        return {r for r, moment in newest.items() if moment < horizon and r not in busy}

    # -- the protocol ----------------------------------------------------------------

    def _json(self, status: int, answer: dict[str, Any]) -> Response:
        """An answer object, signed with the agent's key when it has one."""
        return json_response(status, sign_answer(answer, self.config.key))

    def _error(self, status: int, code: str, message: str) -> Response:
        return self._json(status, {"error": code, "message": message})

    def handle(self, request: Request) -> Response | Awaitable[Response]:
        if request.path == "/metrics":
            if request.method != "GET":
                return self._error(405, "method_not_allowed", "GET /metrics only")
            # Prometheus text; scrapers read it whatever the Content-Type says.
            return Response(200, self.metrics.text())
        parts = request.path.split("/")
        if len(parts) < 5 or parts[:3] != ["", "v1", "nodes"]:
            return self._error(404, "not_found", f"no such endpoint: {request.path}")
        if parts[3] != self.config.node:
            if request.method == "POST" and parts[4:] == ["jobs"]:
                return self.post_job(request.body, parts[3])
            return self._error(
                404, "unknown_node", f"this agent serves node {self.config.node}, not {parts[3]}"
            )
        route = (request.method, *parts[4:])
        if route == ("POST", "jobs"):
            return self.post_job(request.body, parts[3])
        if len(route) == 3 and route[:2] == ("GET", "jobs"):
            try:
                wait = wait_seconds(request.query)
            except ValueError as exc:
                return self._error(400, "bad_request", str(exc))
            with self._lock:
                record = self.jobs.get(route[2])
                if record is None:
                    return self._error(404, "unknown_job", f"no job {route[2]} on this node")
                if not wait or record.state in FINISHED_JOB_STATES:
                    return self._json(200, record.public())
                # Registered under the lock the job's thread saves with: no finish is missed.
                loop = asyncio.get_running_loop()
                woken: asyncio.Future[None] = loop.create_future()
                self._waiters.setdefault(route[2], []).append((loop, woken))
            return self._held_job(route[2], woken, wait)
        if route == ("GET", "heartbeat"):
            try:
                wait, newer = wait_seconds(request.query), newer_than(request.query)
            except ValueError as exc:
                return self._error(400, "bad_request", str(exc))
            if not wait or newer is None:
                return self._json(200, self.heartbeat())
            with self._lock:
                changed = self._beat_changed_at > parse_time(newer)
                if not changed:
                    # Registered under the lock changes are recorded with: none is missed.
                    loop = asyncio.get_running_loop()
                    beat_woken: asyncio.Future[None] = loop.create_future()
                    self._beat_waiters.append((loop, beat_woken))
            if changed:
                return self._json(200, self.heartbeat())
            return self._held_heartbeat(beat_woken, wait)
        if route == ("GET", "backups"):
            listed = [b.public() for b in self.state.list_backups()]
            if signed_list_asked(request.query):
                # An object, unlike a bare list, carries evidence: it covers each jobId.
                return self._json(200, {"node": self.config.node, "backups": listed})
            return json_response(200, listed)
        return self._error(404, "not_found", f"no such endpoint: {request.method} {request.path}")

    async def _held_job(self, job_id: str, woken: asyncio.Future[None], wait: float) -> Response:
        """The job's record once it finished, or as it is when ``wait`` ends."""
        try:
            await _woken_or_timeout(woken, wait)
        finally:
            with self._lock:
                held = self._waiters.get(job_id, [])
                held[:] = [w for w in held if w[1] is not woken]
                if not held:
                    self._waiters.pop(job_id, None)
                record = self.jobs.get(job_id)  # expired records are compacted away
        if record is None:
            return self._error(404, "unknown_job", f"no job {job_id} on this node")
        return self._json(200, record.public())

    async def _held_heartbeat(self, woken: asyncio.Future[None], wait: float) -> Response:
        """The heartbeat once it changed, or as it is when ``wait`` ends."""
        try:
            await _woken_or_timeout(woken, wait)
        finally:
            with self._lock:
                self._beat_waiters[:] = [w for w in self._beat_waiters if w[1] is not woken]
        return self._json(200, self.heartbeat())

    def _heartbeat_changed(self) -> None:
        """A check's outcome moved: held heartbeat reads answer."""
        with self._lock:
            self._beat_changed()

    def _beat_changed(self) -> None:
        """Called with ``_lock`` held: the heartbeat changed by the agent's
        doing now, and the held heartbeat reads answer."""
        self._beat_changed_at = self.clock()
        waiters, self._beat_waiters = self._beat_waiters, []
        for loop, woken in waiters:
            loop.call_soon_threadsafe(_wake, woken)

    def _refuse(self, status: int, code: str, message: str, envelope: Any = None) -> Response:
        """A job refused: logged, counted and answered."""
        payload = envelope.get("payload") if isinstance(envelope, dict) else None
        job_id = payload.get("jobId") if isinstance(payload, dict) else None
        job_id = job_id if isinstance(job_id, str) else None
        self.log.refused(status, code, message, job_id or "")
        self.metrics.refusals.labels(code=code).inc()
        # Signed over the job id it refuses: no other signed answer (a
        # heartbeat, another job's refusal) can pass for this refusal.
        refusal = {"error": code, "message": message, "node": self.config.node}
        return self._json(status, refusal if job_id is None else {**refusal, "jobId": job_id})

    def post_job(self, body: bytes, path_node: str) -> Response:
        try:
            envelope = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep
            return self._refuse(400, "invalid_job", "the body is not JSON")
        with self._lock:
            try:
                payload = admit_job(
                    envelope,
                    node=self.config.node,
                    trusted=self.config.trusted,
                    now=self.clock(),
                    runtimes=self.config.runtimes,
                    allow_live=self.config.allow_live,
                    known=lambda job_id: r.payload if (r := self.jobs.get(job_id)) else None,
                    path_node=path_node,
                )
            except JobRefused as refusal:
                return self._refuse(refusal.status, refusal.code, refusal.message, envelope)
            known = self.jobs.get(payload["jobId"])
            if known is not None:
                return self._json(200, known.public())
            if payload["jobId"] in self._dropped:
                return self._error(
                    409,
                    "already_executed",
                    f"job {payload['jobId']} ran here; its record was dropped from the "
                    f"journal at {self._dropped[payload['jobId']]}, and it is not run again",
                )
            record = JobRecord(
                job_id=payload["jobId"],
                payload=payload,
                state="accepted",
                accepted_at=format_time(self.clock()),
            )
            try:
                self._save(record)  # durable before the job can run or be acknowledged
            except OSError as exc:
                return self._refuse(
                    503, "journal_unwritable", f"cannot record the job: {exc.strerror}", envelope
                )
        # Checks of the runtime's previous job say nothing about this one.
        with self._lock:
            self._newest_job[payload["target"]["runtime"]] = record.job_id
        self.prober.stop(payload["target"]["runtime"])
        self.log.accepted(payload)
        self.metrics.jobs.labels(kind=payload["kind"], outcome="accepted").inc()
        self._worker.submit(self._run, record.job_id)
        return self._json(202, record.public())

    def heartbeat(self) -> dict[str, Any]:
        runtimes = []
        for runtime in sorted(self.config.runtimes):
            current = self.state.read_config(runtime)
            if current is None:
                continue
            entry: dict[str, Any] = {"type": runtime}
            values: Mapping[str, Any]
            try:
                values = self._config_values(runtime, current[0])
            except _JobFailed as exc:
                values = {}
                entry["error"] = exc.message
            for key in TARGET_FIELDS:
                value = values.get(key)
                entry[key] = value if isinstance(value, str) else ""
            entry["configDigest"] = digest(current[0])
            runtimes.append(entry)
        beat: dict[str, Any] = {
            "node": self.config.node,
            "time": format_time(self.clock()),
            "agentVersion": __version__,
            "runtimes": runtimes,
        }
        checks = self.prober.reports()
        if checks:
            beat["checks"] = checks
        return beat

    # -- running jobs ----------------------------------------------------------------

    def _keep(self, record: JobRecord) -> None:
        """Called with ``_lock`` held (or before serving starts): ``record``
        is what the agent knows of its job from now on."""
        self.jobs[record.job_id] = record
        if record.state in _IN_FLIGHT:
            self._in_flight[record.job_id] = record
        else:
            self._in_flight.pop(record.job_id, None)
        if self._rollout_accepted is not None:  # a record's accepted_at never changes
            _note_accepted(self._rollout_accepted, record)

    def _save(self, record: JobRecord) -> None:
        """Called with ``_lock`` held (or before serving starts)."""
        self.state.save_job(record)
        self._known(record)

    def _known(self, record: JobRecord) -> None:
        """Called with ``_lock`` held: ``record`` is what the agent answers."""
        self._keep(record)
        if record.state in FINISHED_JOB_STATES:
            for loop, woken in self._waiters.pop(record.job_id, ()):
                loop.call_soon_threadsafe(_wake, woken)
            self._beat_changed()  # the config (and the checks' job) may have changed

    def _update(self, record: JobRecord, **changes: Any) -> JobRecord:
        record = record.with_changes(**changes)
        with self._lock:
            self._save(record)
        return record

    def _failed(self, record: JobRecord, **changes: Any) -> JobRecord:
        """``record`` ended ``failed``. When the journal cannot take it (a
        full disk), the agent still answers ``failed`` from memory and
        carries on: the journal keeps "accepted", which a restart turns
        into "failed" too, so the job never runs again either way."""
        record = record.with_changes(
            state="failed", finished_at=format_time(self.clock()), **changes
        )
        with self._lock:
            try:
                self._save(record)
            except OSError as exc:
                print(
                    f"agent: cannot record that job {record.job_id} failed: {exc.strerror}; "
                    "answering from memory",
                    file=sys.stderr,
                )
                self._known(record)
        return record

    def _run(self, job_id: str) -> None:
        with self._lock:
            record = self.jobs[job_id]
        try:
            record = self._execute(record)
            runtime = record.payload["target"]["runtime"]
            with self._lock:
                newest = self._newest_job.get(runtime) == record.job_id
            if newest:  # a job accepted since ends this one's checks
                self._probe_after(runtime, record)
        except _JobFailed as exc:
            with self._lock:
                record = self.jobs[job_id]
            # A backup taken before the failure stays (and is reported): it holds
            # the config as it was before this job, whatever happened next.
            planned = record.planned_backup
            kept = planned if planned and self.state.find_backup(planned) else None
            record = self._failed(record, error=exc.message, detail=exc.detail, backup_id=kept)
        except Exception as exc:  # the job fails, the agent carries on
            print(f"agent: job {job_id} failed unexpectedly: {exc!r}", file=sys.stderr)
            record = self._failed(self.jobs[job_id], error=f"agent error: {exc}")
        payload = record.payload
        self.log.finished(payload, record.state, record.error or "")
        self.metrics.jobs.labels(kind=payload["kind"], outcome=record.state).inc()
        try:
            self.compact()
        except OSError as exc:  # the journal stays longer; the next job tries again
            print(f"agent: journal compaction failed: {exc}", file=sys.stderr)

    def _execute(self, record: JobRecord) -> JobRecord:
        payload = record.payload
        target = payload["target"]
        runtime = target["runtime"]
        try:
            self.state.refuse_config_symlink(runtime)
        except UnsafePath as exc:
            raise _JobFailed(f"{exc.message}; nothing was changed: {exc.hint}") from None
        current = self.state.read_config(runtime)
        before_values = self._config_values(runtime, current[0]) if current is not None else None

        if payload["kind"] == "restore":
            backup = self.state.find_backup(payload["backupId"])
            if backup is None or backup.runtime != runtime:
                raise _JobFailed(
                    f"backup {payload['backupId']} of runtime {runtime} is not on this node "
                    "(GET /v1/nodes/NODE/backups lists what it holds)"
                )
            new_data, new_mode = self.state.read_backup(backup), backup.mode
            if digest(new_data) != backup.digest:
                raise _JobFailed(f"backup {backup.backup_id} is damaged (digest mismatch)")
            change = f"restore backup {backup.backup_id} ({backup.provider} {backup.model})"
        else:
            wanted = {k: target[k] for k in TARGET_FIELDS}
            change = _describe(before_values, wanted)
            if payload["mode"] == "dry_run":
                detail = f"would {change}" if change else "no change: already in place"
                return self._update(
                    record,
                    state="succeeded",
                    detail=detail,
                    finished_at=format_time(self.clock()),
                )
            if not change:
                return self._update(
                    record,
                    state="succeeded",
                    detail="no change: already in place; nothing written, no backup",
                    finished_at=format_time(self.clock()),
                )
            new_values = {**(before_values or {}), **wanted}
            new_data = dump_yaml(new_values)
            new_mode = current[1] if current is not None else CONFIG_MODE

        old_data = current[0] if current is not None else None
        backup_id = self._backup_id(runtime, payload) if current is not None else None
        # In memory only, for GET: recovery reads the same from the backup
        # (``_recovered_accepted``), so the journal keeps "accepted" until the verdict.
        record = record.with_changes(
            state="running",
            before=digest(old_data),
            after=digest(new_data),
            planned_backup=backup_id,
        )
        with self._lock:
            self._keep(record)
        if current is not None and backup_id is not None:
            self._take_backup(backup_id, runtime, payload, current[0], current[1], before_values)
        written = self._config_values(runtime, new_data) if self.config.after_apply else {}
        self.state.write_config(runtime, new_data, new_mode)
        if self.config.after_apply:
            outcome = self._after_apply(payload, written)
            if outcome is not None:
                # Put the previous bytes (and mode) back exactly, or no file if none.
                self.state.write_config(runtime, old_data, current[1] if current else CONFIG_MODE)
                what, tail = outcome
                last = tail.strip()[-300:]
                raise _JobFailed(
                    f"{what}; previous config restored" + (f"; output: {last}" if last else ""),
                    detail=tail,
                )
        self._prune(runtime)
        return self._update(
            record,
            state="succeeded",
            backup_id=backup_id,
            detail=change[0].upper() + change[1:] if change else "",
            finished_at=format_time(self.clock()),
        )

    def _backup_id(self, runtime: str, payload: Mapping[str, Any]) -> str:
        stamp = self.clock().strftime("%Y%m%dT%H%M%SZ")
        # A job id runs once, so its digest makes the id unique on this node.
        return f"{runtime}-{stamp}-{hashlib.sha256(payload['jobId'].encode()).hexdigest()[:8]}"

    def _take_backup(
        self,
        backup_id: str,
        runtime: str,
        payload: Mapping[str, Any],
        data: bytes,
        mode: int,
        values: Mapping[str, Any] | None,
    ) -> None:
        values = values or {}
        info = BackupInfo(
            backup_id=backup_id,
            runtime=runtime,
            created_at=format_time(self.clock()),
            seq=self.state.next_seq(),
            job_id=payload["jobId"],
            rollout=payload["rollout"],
            provider=str(values.get("provider", "")),
            model=str(values.get("model", "")),
            profile=str(values.get("profile", "")),
            mode=mode,
            digest=digest(data) or "",
        )
        self.state.save_backup(info, data)

    def _prune(self, runtime: str) -> None:
        with self._lock:
            busy = {r.payload.get("backupId") for r in self._in_flight.values()}
        every = self.state.list_backups()
        backups = [b for b in every if b.runtime == runtime]
        for backup_id in backups_to_prune(
            backups,
            self.config.backup_retention,
            {b for b in busy if b},
            self._finished_rollouts(every),
        ):
            self.state.delete_backup(backup_id)

    def _after_apply(
        self, payload: Mapping[str, Any], written: Mapping[str, Any]
    ) -> tuple[str, str] | None:
        """None when the command succeeded, else (what happened, output tail).
        Provider, model and profile are those of the config just written: for
        a restore, the restored ones, not the target rolled back from."""
        command = self.config.after_apply
        assert command is not None
        target = payload["target"]
        env = dict(self._environment)
        env.update(
            {
                "RECONCILER_JOB_ID": payload["jobId"],
                "RECONCILER_KIND": payload["kind"],
                "RECONCILER_NODE": payload["node"],
                "RECONCILER_ROLLOUT": payload["rollout"],
                "RECONCILER_ATTEMPT": str(payload["attempt"]),
                "RECONCILER_MODE": payload["mode"],
                "RECONCILER_RUNTIME": target["runtime"],
                "RECONCILER_PROVIDER": str(written.get("provider", "")),
                "RECONCILER_MODEL": str(written.get("model", "")),
                "RECONCILER_PROFILE": str(written.get("profile", "")),
                "RECONCILER_BACKUP_ID": payload.get("backupId") or "",
                "RECONCILER_SOURCE_COMMIT": payload["sourceCommit"],
                "RECONCILER_CONFIG": self.state.config_location(target["runtime"]),
            }
        )
        timeout = self.config.after_apply_timeout
        try:
            process = subprocess.Popen(
                ["/bin/sh", "-c", command],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group, so a timeout kills all of it
            )
        except OSError as exc:
            return f"after-apply command could not start: {exc.strerror}", ""
        assert process.stdout is not None
        output, finished = _read_bounded(process, timeout)
        if not finished:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            tail = output.decode("utf-8", "replace")[-OUTPUT_TAIL:]
            return f"after-apply command timed out after {timeout:g}s", tail
        tail = output.decode("utf-8", "replace")[-OUTPUT_TAIL:]
        if process.returncode != 0:
            how = (
                f"killed by signal {-process.returncode}"
                if process.returncode < 0
                else f"exit status {process.returncode}"
            )
            return f"after-apply command failed ({how})", tail
        return None


async def _woken_or_timeout(woken: asyncio.Future[None], wait: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(woken), wait)


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


@lru_cache(maxsize=8192)
def _stored_time(text: str) -> datetime:
    """``parse_time`` of a time the agent stored itself (a backup's creation,
    a job's acceptance). Every prune reads them all again, and a busy
    agent's journal holds a day of jobs: each text is parsed once."""
    return parse_time(text)


_IN_FLIGHT = ("accepted", "running")


def _rollout_of(record: JobRecord) -> str:
    return str(record.payload.get("rollout", ""))


def _note_accepted(newest: dict[str, datetime], record: JobRecord) -> None:
    """Count ``record``'s acceptance in ``newest`` (rollout -> newest acceptance)."""
    rollout, moment = _rollout_of(record), _stored_time(record.accepted_at)
    newest[rollout] = max(moment, newest.get(rollout, moment))


def _before(text: str, moment: datetime) -> bool:
    """Is the RFC 3339 time ``text`` before ``moment`` (unreadable: yes)?"""
    try:
        return parse_time(text) < moment
    except ValueError:
        return True


def _expired_before(record: JobRecord, now: datetime) -> bool:
    try:
        expires = parse_time(str(record.payload["expiresAt"]))
    except (KeyError, ValueError):
        return False  # cannot tell: kept
    return expires + JOURNAL_KEEP_AFTER_EXPIRY < now


OUTPUT_GRACE = 1.0  # seconds to drain output after the command exited


def _read_bounded(process: subprocess.Popen[bytes], timeout: float) -> tuple[bytes, bool]:
    """The command's output, and whether it exited within ``timeout``.

    Never waits past ``timeout`` (plus a short grace to drain the pipe once
    the command exited): a background process the command started, even in
    a session of its own, may keep the pipe open for as long as it lives, so
    end of output is not awaited; the pipe is closed when we stop reading.
    """
    assert process.stdout is not None
    fd = process.stdout.fileno()
    os.set_blocking(fd, False)
    kept = bytearray()
    deadline = time.monotonic() + timeout
    exited_at: float | None = None
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if exited_at is None and process.poll() is not None:
                exited_at = now
            limit = deadline if exited_at is None else min(deadline, exited_at + OUTPUT_GRACE)
            if now >= limit:
                break
            if not selector.select(min(limit - now, 0.2)):
                continue
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:  # end of output: only the exit status is left to wait for
                selector.unregister(fd)
                remaining = deadline - time.monotonic()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=max(remaining, 0))
                break
            kept += chunk
            del kept[: max(0, len(kept) - 4 * OUTPUT_TAIL)]  # memory stays bounded
    process.stdout.close()
    return bytes(kept), process.poll() is not None


# -- running it ---------------------------------------------------------------------


def managed_runtimes(given: Sequence[str] | None, state: StateDir) -> frozenset[str]:
    """``--runtime`` values, or the runtimes that have a config file already."""
    return frozenset(given) if given else frozenset(state.runtime_names())


async def serve(
    agent: Agent,
    host: str,
    port: int,
    *,
    ready: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    tls: ssl.SSLContext | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Serve ``agent`` on ``host:port``, or on ``sock`` when one was handed over."""
    server = HttpServer(agent.handle, host, port, on_error=_print_error, tls=tls, sock=sock)
    await server.start()
    if ready is not None:
        ready(server.address)
    try:
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        await server.close()


def _print_error(exc: BaseException) -> None:
    print(f"agent: internal error: {exc!r}", file=sys.stderr)
