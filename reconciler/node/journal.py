"""The agent's job records as it knows them: the journal on disk
(``state_dir``) and what is kept beside it in memory, under one lock; the
answers held until a job finishes or the heartbeat changes; compaction of
records whose payload expired long ago.

A record is durable (``save``) before the job can run or be acknowledged,
and every record is written through here, so a held answer never misses a
finish.

Must not: run jobs, or answer HTTP (``agent`` does, reading from here).
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from reconciler.node.state_dir import BackupInfo, JobRecord, StateDir
from reconciler.protocol.long_poll import FINISHED_JOB_STATES
from reconciler.spec.times import format_time, parse_time

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

IN_FLIGHT = ("accepted", "running")

Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class Journal:
    """Job records, the held reads waiting on them, and the heartbeat's
    change time. ``lock`` guards all of it; methods say when they expect
    it held."""

    def __init__(self, state: StateDir, clock: Callable[[], datetime]) -> None:
        self.state = state
        self.clock = clock
        self.lock = threading.Lock()
        self.jobs = state.load_jobs()
        self.dropped = state.load_dropped()  # job id -> when its record was dropped
        # Kept beside ``jobs`` by ``keep`` (and compaction), so that a prune
        # does not scan the whole journal (a day of jobs on a busy node): the
        # records not finished yet, and each rollout's newest acceptance here
        # (None: to be counted again, after compaction dropped records).
        self.in_flight = {j: r for j, r in self.jobs.items() if r.state in IN_FLIGHT}
        self._rollout_accepted: dict[str, datetime] | None = None
        self.newest_job: dict[str, str] = {}  # runtime -> the job accepted last
        # job id -> held ``?wait=`` answers, woken from the job's thread when it finishes
        self._waiters: dict[str, list[Waiter]] = {}
        self._compacted_at: datetime | None = None
        # Held ``?newerThan=&wait=`` heartbeat reads, and when the heartbeat
        # last changed by the agent's own doing (agent clock).
        self._beat_waiters: list[Waiter] = []
        self.beat_changed_at = clock()

    # -- records -------------------------------------------------------------------

    def keep(self, record: JobRecord) -> None:
        """Called with ``lock`` held (or before serving starts): ``record``
        is what the agent knows of its job from now on."""
        self.jobs[record.job_id] = record
        if record.state in IN_FLIGHT:
            self.in_flight[record.job_id] = record
        else:
            self.in_flight.pop(record.job_id, None)
        if self._rollout_accepted is not None:  # a record's accepted_at never changes
            _note_accepted(self._rollout_accepted, record)

    def save(self, record: JobRecord) -> None:
        """Called with ``lock`` held (or before serving starts)."""
        self.state.save_job(record)
        self.known(record)

    def known(self, record: JobRecord) -> None:
        """Called with ``lock`` held: ``record`` is what the agent answers."""
        self.keep(record)
        if record.state in FINISHED_JOB_STATES:
            for loop, woken in self._waiters.pop(record.job_id, ()):
                loop.call_soon_threadsafe(_wake, woken)
            self.beat_changed()  # the config (and the checks' job) may have changed

    def update(self, record: JobRecord, **changes: Any) -> JobRecord:
        record = record.with_changes(**changes)
        with self.lock:
            self.save(record)
        return record

    def failed(self, record: JobRecord, **changes: Any) -> JobRecord:
        """``record`` ended ``failed``. When the journal cannot take it (a
        full disk), the agent still answers ``failed`` from memory and
        carries on: the journal keeps "accepted", which a restart turns
        into "failed" too, so the job never runs again either way."""
        record = record.with_changes(
            state="failed", finished_at=format_time(self.clock()), **changes
        )
        with self.lock:
            try:
                self.save(record)
            except OSError as exc:
                print(
                    f"agent: cannot record that job {record.job_id} failed: {exc.strerror}; "
                    "answering from memory",
                    file=sys.stderr,
                )
                self.known(record)
        return record

    # -- held reads ------------------------------------------------------------------

    def hold_job(self, job_id: str) -> asyncio.Future[None]:
        """Called with ``lock`` held, so no finish is missed: a future woken
        when ``job_id`` finishes."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        self._waiters.setdefault(job_id, []).append((loop, woken))
        return woken

    def release_job(self, job_id: str, woken: asyncio.Future[None]) -> JobRecord | None:
        """Forget a held read of ``job_id``; the job's record now, if kept."""
        with self.lock:
            held = self._waiters.get(job_id, [])
            held[:] = [w for w in held if w[1] is not woken]
            if not held:
                self._waiters.pop(job_id, None)
            return self.jobs.get(job_id)  # expired records are compacted away

    def hold_heartbeat(self) -> asyncio.Future[None]:
        """Called with ``lock`` held, so no change is missed: a future woken
        when the heartbeat changes."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        self._beat_waiters.append((loop, woken))
        return woken

    def release_heartbeat(self, woken: asyncio.Future[None]) -> None:
        with self.lock:
            self._beat_waiters[:] = [w for w in self._beat_waiters if w[1] is not woken]

    def heartbeat_changed(self) -> None:
        """A check's outcome moved: held heartbeat reads answer."""
        with self.lock:
            self.beat_changed()

    def beat_changed(self) -> None:
        """Called with ``lock`` held: the heartbeat changed by the agent's
        doing now, and the held heartbeat reads answer."""
        self.beat_changed_at = self.clock()
        waiters, self._beat_waiters = self._beat_waiters, []
        for loop, woken in waiters:
            loop.call_soon_threadsafe(_wake, woken)

    # -- bounded state ---------------------------------------------------------------

    def compact(self) -> int:
        """Drop finished records whose payload expired more than
        ``JOURNAL_KEEP_AFTER_EXPIRY`` ago; how many were dropped. Runs at
        most once per ``COMPACT_EVERY`` of the agent's clock."""
        now = self.clock()
        if self._compacted_at is not None and now - self._compacted_at < COMPACT_EVERY:
            return 0
        self._compacted_at = now
        with self.lock:
            probed = set(self.newest_job.values())  # its checks may still be probed
            doomed = [
                r.job_id
                for r in self.jobs.values()
                if r.state in ("succeeded", "failed")
                and r.job_id not in probed
                and _expired_before(r, now)
            ]
            if doomed or any(_before(t, now - DROPPED_IDS_KEPT) for t in self.dropped.values()):
                dropped = {
                    k: t for k, t in self.dropped.items() if not _before(t, now - DROPPED_IDS_KEPT)
                }
                dropped.update(dict.fromkeys(doomed, format_time(now)))
                self.state.save_dropped(dropped)  # before the records go
                self.dropped = dropped
            for job_id in doomed:
                self.state.delete_job(job_id)
                del self.jobs[job_id]
            if doomed:
                self._rollout_accepted = None  # a dropped one may have been the newest
        return len(doomed)

    def finished_rollouts(self, backups: Sequence[BackupInfo], horizon: datetime) -> set[str]:
        """Rollouts with no job in flight here and nothing done here (no job
        accepted, no backup taken) since ``horizon``."""
        with self.lock:
            if self._rollout_accepted is None:
                self._rollout_accepted = {}
                for record in self.jobs.values():
                    _note_accepted(self._rollout_accepted, record)
            newest = dict(self._rollout_accepted)
            busy = {_rollout_of(r) for r in self.in_flight.values()}
        for backup in backups:
            moment = stored_time(backup.created_at)
            newest[backup.rollout] = max(moment, newest.get(backup.rollout, moment))
        return {r for r, moment in newest.items() if moment < horizon and r not in busy}


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)


@lru_cache(maxsize=8192)
def stored_time(text: str) -> datetime:
    """``parse_time`` of a time the agent stored itself (a backup's creation,
    a job's acceptance). Every prune reads them all again, and a busy
    agent's journal holds a day of jobs: each text is parsed once."""
    return parse_time(text)


def _rollout_of(record: JobRecord) -> str:
    return str(record.payload.get("rollout", ""))


def _note_accepted(newest: dict[str, datetime], record: JobRecord) -> None:
    """Count ``record``'s acceptance in ``newest`` (rollout -> newest acceptance)."""
    rollout, moment = _rollout_of(record), stored_time(record.accepted_at)
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
