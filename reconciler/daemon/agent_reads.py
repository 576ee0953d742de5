"""The agent client's reads of agents: how each job record, heartbeat and
backup list is read (polled), the held reads (``?wait=``, docs/protocol.md)
that stand in for polling while ``serve`` runs, and the held answers they
bring until a pass takes them.

A pass asks ``take_held`` which of its jobs a held read already answered
finished (no need to read them again) and which are still held; it polls the
others. A held read that answers finished wakes a pass, gathered with the
batch's other finishes (GATHER_SECONDS). A held heartbeat read wakes a pass
when a node's heartbeat changes or its soak ends. An agent that ignores
``wait`` (it answers at once, unfinished) is left to the polling.

Runs on the agent client's event loop; only ``take_finished``,
``take_heartbeats`` and ``has_news`` may be called from another thread.
Must not decide anything: it reports what agents said, and when.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from reconciler.daemon.agent_answers import (
    backups_of,
    error_text,
    heartbeat_of,
    job_observation,
)
from reconciler.daemon.agent_http import HttpClient, Origin, Unreachable
from reconciler.protocol.effects import SendJob
from reconciler.protocol.long_poll import (
    DAEMON_WAIT_SECONDS,
    FINISHED_JOB_STATES,
    heartbeat_content,
    heartbeat_query,
    wait_query,
)
from reconciler.protocol.observations import (
    SIGNED_LIST_QUERY,
    BackupList,
    Heartbeat,
    JobObservation,
    SignedAnswer,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# Held ``?wait=`` reads in flight at once, each on its own connection: jobs
# beyond it are read by the passes' polling, as from agents without ``wait``.
# Enough for every job of a batch of thousands, when the open files limit
# allows (``watch_limit``).
MAX_WATCHES = 4096
# File descriptors kept for everything but held reads and idle connections:
# the repository's pack files, the log, the concurrent requests, the watcher.
FD_RESERVE = 256
# After a held read answers succeeded, the pass waits this long for the other
# held reads to answer too, so that a batch's finishes make one pass and one
# status commit rather than one each. Each further finish within it waits
# this long again (a batch sent over a second finishes over a second), up to
# GATHER_LIMIT gathers since the first. It starts at once when none is left
# held, or when an answer is a failure (a hold is not delayed).
GATHER_SECONDS = 0.1
GATHER_LIMIT = 10


@dataclass(frozen=True)
class HeartbeatWatch:
    """A held heartbeat read to keep: answer when the node's heartbeat
    differs from ``content`` (``heartbeat_content`` of the one last seen, at
    ``newer_than``), or when ``wait`` seconds have passed (a soak's end)."""

    url: str
    node: str
    newer_than: str
    content: tuple[object, ...]
    wait: float = DAEMON_WAIT_SECONDS


def watch_limit(open_files: int) -> int:
    """Held reads of each kind (jobs, heartbeats) allowed at once with
    ``open_files`` descriptors, up to MAX_WATCHES. Past FD_RESERVE, a third
    each goes to held job reads, held heartbeat reads and the idle
    connections kept for them, so that a held read finds an idle
    connection to its agent: the one its job's POST came back on, or one
    that a finished held read left."""
    return max(16, min(MAX_WATCHES, (open_files - FD_RESERVE) // 3))


class AgentReads:
    """Polls and held reads of agents, over one ``HttpClient``."""

    def __init__(
        self,
        http: HttpClient,
        timeout: float,
        max_watches: int,
        on_signed: Callable[[str, SignedAnswer], object] | None = None,
    ) -> None:
        self.http = http
        self.timeout = timeout
        self.max_watches = max_watches
        # Called on the loop thread with (node, signed answer) for each signed
        # job record read, so its signature is checked while other answers
        # are still on the wire (the daemon's AnswerCheck.prepare).
        self.on_signed = on_signed
        # Loop thread only: job id -> its held read; origins that ignore
        # ``wait``; the pending gathered wake-up (see GATHER_SECONDS).
        self._watches: dict[str, asyncio.Task[None]] = {}
        self._no_wait: set[Origin] = set()
        self._gathering: asyncio.TimerHandle | None = None
        self._gathering_since = 0.0  # loop time of the first finish it gathers
        self._last_finish = 0.0  # loop time of the newest finish it gathers
        self._on_gathered: Callable[[], None] = lambda: None
        # Finished records that held reads brought, until a pass takes them
        # (``take_finished``): the pass need not ask for them again.
        self._lock = threading.Lock()
        self._finished: dict[str, JobObservation] = {}
        # node -> its heartbeat read right after a held read saw its live
        # apply succeed, or a held heartbeat read brought: read meanwhile.
        self._heartbeats: dict[str, Heartbeat] = {}
        self.posting = 0  # POSTs in flight (loop thread): their held reads are still to come
        # Set (loop thread) when a held job read ends unfinished, or when the
        # gather of finished ones ends; reset by ``take_held``: a pass has
        # something new to look at.
        self._news = False
        # Loop thread only: node -> its held heartbeat read; origins that
        # answer heartbeats at once whatever the query.
        self._beat_watches: dict[str, asyncio.Task[None]] = {}
        self._no_beat_wait: set[Origin] = set()

    # -- polling: one read each --------------------------------------------------

    async def read_job(self, url: str, job: SendJob) -> JobObservation | None:
        """A job's record; None when the agent does not know the job;
        Unreachable without a usable answer."""
        status, answer = await self.http.request(
            url, "GET", f"/v1/nodes/{job.node}/jobs/{job.job_id}", node=job.node
        )
        if status == 404:
            return None
        if status != 200:
            raise Unreachable(error_text(status, answer))
        seen = job_observation(job.job_id, answer)
        if seen.signed is not None and self.on_signed is not None:
            self.on_signed(job.node, seen.signed)
        return seen

    async def read_heartbeat(self, url: str, node: str) -> Heartbeat | None:
        return await self._read_node(url, node, "heartbeat", heartbeat_of)

    async def read_backups(self, url: str, node: str) -> BackupList | None:
        return await self._read_node(url, node, "backups", backups_of, f"?{SIGNED_LIST_QUERY}")

    async def _read_node(
        self,
        url: str,
        node: str,
        what: str,
        reader: Callable[[str, bytes], _T],
        query: str = "",
    ) -> _T | None:
        try:
            status, answer = await self.http.request(
                url, "GET", f"/v1/nodes/{node}/{what}{query}", node=node
            )
            if status != 200:
                raise Unreachable(error_text(status, answer))
            return reader(node, answer)
        except Unreachable as exc:
            log.warning("%s of node %s at %s unusable: %s", what, node, url, exc)
            return None

    # -- held job reads ------------------------------------------------------------

    def watch_jobs(
        self, jobs: Sequence[tuple[str, SendJob]], on_finished: Callable[[], None]
    ) -> None:
        """Held reads for exactly ``jobs``: new ones start, the others end."""
        wanted = {job.job_id: (url, job) for url, job in jobs}
        for job_id in [j for j in self._watches if j not in wanted]:
            self._watches.pop(job_id).cancel()
        for url, job in wanted.values():
            self.watch_job(url, job, on_finished)

    def watch_job(self, url: str, job: SendJob, on_finished: Callable[[], None]) -> None:
        if job.job_id in self._watches or len(self._watches) >= self.max_watches:
            return
        with self._lock:
            # Its held read ended finished after the pass asked: the record
            # waits for the next pass, and an agent never changes it.
            if job.job_id in self._finished:
                return
        try:
            origin = self.http.origin(url)
        except Unreachable:
            return  # the passes report it
        # A stalled node is polled (and probed) by the passes, not held.
        if origin not in self._no_wait and not self.http.is_stalled(origin, job.node):
            task = asyncio.ensure_future(self._held_read(origin, url, job, on_finished))
            self._watches[job.job_id] = task

    def take_held(self, job_ids: Iterable[str]) -> tuple[dict[str, JobObservation], set[str]]:
        """``take_finished``, and which of the other ``job_ids`` still have a
        held read in flight, both at one instant (on the loop thread)."""
        wanted = list(job_ids)
        self._news = False
        return self.take_finished(wanted), {j for j in wanted if j in self._watches}

    def has_news(self) -> bool:
        return self._news

    def take_finished(self, job_ids: Iterable[str]) -> dict[str, JobObservation]:
        """The finished records of ``job_ids`` that held reads brought since
        the last call; the others it kept are dropped (no longer wanted)."""
        with self._lock:
            found, self._finished = self._finished, {}
        return {job_id: found[job_id] for job_id in job_ids if job_id in found}

    def watching(self) -> set[str]:
        return set(self._watches)

    def awaited(self) -> set[str]:
        """The jobs a pass hears of without asking: those whose held read is
        in flight, and those whose finished record waits for the gather's
        wake-up (``has_news`` turns true with it)."""
        awaited = set(self._watches)
        if self._gathering is not None:
            with self._lock:
                awaited.update(self._finished)
        return awaited

    async def _held_read(
        self, origin: Origin, url: str, job: SendJob, on_finished: Callable[[], None]
    ) -> None:
        """Held reads of one job until it is finished; ends quietly on any
        trouble, which the next pass's read reports."""
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()  # asked once: in Python 3.11 it is not free
        path = f"/v1/nodes/{job.node}/jobs/{job.job_id}?{wait_query(DAEMON_WAIT_SECONDS)}"
        gathered = False  # a finish is news once its gather ends (``_wake_gathered``)
        try:
            while True:
                asked = loop.time()
                status, answer = await self.http.request(
                    url, "GET", path, node=job.node, timeout=DAEMON_WAIT_SECONDS + self.timeout
                )
                if status != 200:
                    return
                seen = job_observation(job.job_id, answer)
                if seen.state in FINISHED_JOB_STATES:
                    await self._finished_read(url, job, seen, me)
                    gathered = True
                    self._wake_gathered(seen.state == "failed", on_finished)
                    return
                if loop.time() - asked < DAEMON_WAIT_SECONDS / 2:
                    # Answered unfinished before the wait could end: it ignores ``wait``.
                    self._no_wait.add(origin)
                    log.info("agent at %s answers at once: its jobs are polled", url)
                    return
        except Unreachable:
            return
        finally:
            if not gathered:
                self._news = True
            if self._watches.get(job.job_id) is me:
                del self._watches[job.job_id]

    async def _finished_read(
        self, url: str, job: SendJob, seen: JobObservation, me: asyncio.Task[object] | None
    ) -> None:
        """Keep a finished record for the next pass, with the heartbeat that
        pass will ask for when a live apply succeeded."""
        if seen.signed is not None and self.on_signed is not None:
            # Checked now, while the batch's other answers come in.
            self.on_signed(job.node, seen.signed)
        beat = None
        if seen.state == "succeeded" and job.kind == "apply" and job.mode == "live":
            # The pass deciding this node asks for a heartbeat newer than
            # the job (docs/rollouts.md): read it now, while the batch finishes.
            beat = await self._one_heartbeat(url, job.node)
        if self._watches.get(job.job_id) is me:
            del self._watches[job.job_id]
        with self._lock:
            self._finished[job.job_id] = seen
            if beat is not None:
                self._heartbeats[job.node] = beat

    async def _one_heartbeat(self, url: str, node: str) -> Heartbeat | None:
        try:
            status, answer = await self.http.request(
                url, "GET", f"/v1/nodes/{node}/heartbeat", node=node
            )
            return heartbeat_of(node, answer) if status == 200 else None
        except (Unreachable, ValueError):
            return None  # the pass reads it again and reports what is wrong

    def _wake_gathered(self, at_once: bool, on_finished: Callable[[], None]) -> None:
        """Start a pass now when asked to or when no held read is left, else
        once GATHER_SECONDS have passed without another finish, and at the
        latest GATHER_LIMIT times that since the first finish waiting."""
        if at_once or not (self._watches or self.posting):
            if self._gathering is not None:
                self._gathering.cancel()
                self._gathering = None
            self._news = True
            on_finished()
            return
        loop = asyncio.get_running_loop()
        self._last_finish = now = loop.time()
        self._on_gathered = on_finished
        if self._gathering is None:
            # One timer for the whole gather: a batch's thousand finishes move
            # ``_last_finish``, and the timer, when it fires early, waits again.
            self._gathering_since = now
            self._gathering = loop.call_at(now + GATHER_SECONDS, self._gathered)

    def _gathered(self) -> None:
        latest = self._gathering_since + GATHER_SECONDS * GATHER_LIMIT
        due = min(self._last_finish + GATHER_SECONDS, latest)
        loop = asyncio.get_running_loop()
        if due - loop.time() > 0.001:  # a finish came since it was set: wait again
            self._gathering = loop.call_at(due, self._gathered)
            return
        self._gathering = None
        self._news = True
        self._on_gathered()

    # -- held heartbeat reads ---------------------------------------------------------

    def watch_heartbeats(
        self, nodes: Sequence[HeartbeatWatch], on_change: Callable[[], None]
    ) -> None:
        """Held heartbeat reads for exactly ``nodes``: new ones start, the others end."""
        wanted = {w.node: w for w in nodes}
        for node in [n for n in self._beat_watches if n not in wanted]:
            self._beat_watches.pop(node).cancel()
        for node, watch in wanted.items():
            if node in self._beat_watches or len(self._beat_watches) >= self.max_watches:
                continue
            try:
                origin = self.http.origin(watch.url)
            except Unreachable:
                continue
            if origin not in self._no_beat_wait and not self.http.is_stalled(origin, node):
                task = asyncio.ensure_future(self._held_heartbeat(origin, watch, on_change))
                self._beat_watches[node] = task

    def take_heartbeats(self, nodes: Iterable[str]) -> dict[str, Heartbeat]:
        """The heartbeats of ``nodes`` read after their held reads answered
        succeeded, since the last call; the others it kept are dropped."""
        with self._lock:
            found, self._heartbeats = self._heartbeats, {}
        return {node: found[node] for node in nodes if node in found}

    def watching_heartbeats(self) -> set[str]:
        return set(self._beat_watches)

    async def _held_heartbeat(
        self, origin: Origin, watch: HeartbeatWatch, on_change: Callable[[], None]
    ) -> None:
        """Held heartbeat reads of one node until one shows a change or its
        first wait (the caller's, up to a soak's end) ends; quiet on trouble."""
        loop = asyncio.get_running_loop()
        # A wait shorter than the usual one ends at a soak's end: worth a pass.
        newer, wait = watch.newer_than, watch.wait
        timed = wait < DAEMON_WAIT_SECONDS
        try:
            while True:
                asked = loop.time()
                path = f"/v1/nodes/{watch.node}/heartbeat?{heartbeat_query(newer, wait)}"
                status, answer = await self.http.request(
                    watch.url, "GET", path, node=watch.node, timeout=wait + self.timeout
                )
                if status != 200:
                    return
                beat = heartbeat_of(watch.node, answer)
                took = loop.time() - asked
                changed = heartbeat_content(beat) != watch.content
                if changed or (timed and took >= wait * 0.9):
                    if self._beat_watches.get(watch.node) is asyncio.current_task():
                        del self._beat_watches[watch.node]
                    with self._lock:
                        self._heartbeats[watch.node] = beat
                    on_change()
                    return
                if took < wait / 2:
                    # Answered, unchanged, before the wait could end: it ignores the query.
                    self._no_beat_wait.add(origin)
                    log.info("agent at %s answers heartbeats at once: they are polled", watch.url)
                    return
                newer, wait, timed = beat.time, DAEMON_WAIT_SECONDS, False
        except Unreachable:
            return
        finally:
            if self._beat_watches.get(watch.node) is asyncio.current_task():
                del self._beat_watches[watch.node]

    def close(self) -> None:
        """End every held read and the pending wake-up (on the loop thread)."""
        if self._gathering is not None:
            self._gathering.cancel()
        for task in [*self._watches.values(), *self._beat_watches.values()]:
            task.cancel()
        self._watches.clear()
        self._beat_watches.clear()
