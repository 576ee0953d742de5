"""The daemon's side of the agent protocol (docs/protocol.md): send signed
jobs, read job records, heartbeats and backups, for many nodes at once.

Every answer becomes an observation value; nothing an agent does (refuse,
crash, hang, answer garbage, stream without end, name another node) raises
out of this module.

    4xx to a POST               -> JobObservation state "refused", error "code: message"
    connection error, timeout,
    5xx, 408/429, unusable body -> state "unreachable" (or None for heartbeats
                                   and backups), reason in ``error`` / the log
    404 reading a job           -> None: the agent does not know it (resend it)

The parts: ``agent_http`` speaks HTTP/1.1 (h11) within bounds of size and
time, ``agent_answers`` reads the answers, ``agent_reads`` owns the reads and
the held reads. This module runs them on a private event loop thread, at most
``concurrency`` requests at once per call, so the synchronous API can be
called from any thread, including one running its own event loop.

Must not decide anything: it reports what agents said.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from reconciler.daemon.agent_answers import (
    error_text,
    job_observation,
    read_json,
    signed_error,
    transient,
)
from reconciler.daemon.agent_http import (
    HttpClient,
    PinMismatch,
    Unreachable,
    parse_base,
)
from reconciler.daemon.agent_reads import AgentReads, HeartbeatWatch, watch_limit
from reconciler.protocol.effects import SendJob
from reconciler.protocol.job_payload import build_payload
from reconciler.protocol.long_poll import raise_open_files_limit
from reconciler.protocol.observations import (
    Backup,
    BackupList,
    Heartbeat,
    JobObservation,
    SignedAnswer,
    parse_backup_list,
)
from reconciler.protocol.signing import SigningKey, envelope_bytes
from reconciler.protocol.tls import parse_pin
from reconciler.spec.errors import AgentError

__all__ = ["AgentClient", "HeartbeatWatch", "fetch_backups"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_R = TypeVar("_R")


class AgentClient:
    """Talks to node agents for the daemon. Thread-safe; one call at a time
    runs on the client's own event loop thread."""

    def __init__(
        self,
        key: SigningKey,
        *,
        concurrency: int = 64,
        timeout: float = 5.0,
        on_signed: Callable[[str, SignedAnswer], object] | None = None,
    ) -> None:
        """``on_signed`` is called on the client's thread with (node, signed
        answer) for each signed job record read, so that its signature is
        checked while other answers are still on the wire (the daemon's
        ``AnswerCheck.prepare``)."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.key = key
        self.concurrency = concurrency
        self.timeout = timeout
        # Held reads of each kind at once, within the open files limit, and
        # as many idle connections kept: one per held read to come.
        watches = watch_limit(raise_open_files_limit())
        self._http = HttpClient(timeout, max(watches, concurrency))
        self._observer = AgentReads(self._http, timeout, watches, on_signed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="agent-client", daemon=True
        )
        self._thread.start()
        self._closed = False

    @property
    def connections_opened(self) -> int:
        """Connections opened to agents so far (for tests and benches)."""
        return self._http.opened

    @property
    def max_watches(self) -> int:
        return self._observer.max_watches

    @max_watches.setter
    def max_watches(self, limit: int) -> None:
        self._observer.max_watches = limit

    # The public calls: each runs one batch of requests on the loop thread.

    def set_pins(self, pins: Mapping[str, str]) -> None:
        """The certificate pins of https agents: base URL -> ``agentCertSha256``
        (docs/trust.md). An https agent without a pin gets nothing; one whose
        certificate differs gets nothing and its answers are unreachable."""
        parsed: dict[tuple[str, int], bytes] = {}
        for url, text in pins.items():
            try:
                origin = parse_base(url)
                parsed[(origin.host, origin.port)] = parse_pin(text)
            except (Unreachable, ValueError):
                continue  # validation reports the node file; without a pin nothing is sent
        self._http.pins = parsed

    def send_jobs(
        self,
        jobs: Sequence[tuple[str, SendJob]],
        now: datetime,
        *,
        halfway: Callable[[], None] | None = None,
        on_finished: Callable[[], None] | None = None,
    ) -> dict[str, JobObservation]:
        """POST each job, signed with ``issuedAt=now``, all at once (up to the
        concurrency); observations by job id. ``halfway`` is called (on the
        client's thread) once half of the answers, rounded up, are in and
        some are still outstanding: the crash point between "some sent" and
        "all sent". With ``on_finished``, each job accepted gets its held
        read (``watch_jobs``) once every POST is answered: the jobs go out
        first, so an agent serving many nodes (or the simulated fleet) is
        not asked to hold reads while jobs still wait for it."""
        observer = self._observer
        outstanding = len(jobs)
        signal_at = outstanding // 2 if halfway is not None and outstanding > 1 else -1
        accepted: list[tuple[str, SendJob]] = []  # their held reads start once all are in

        async def one(item: tuple[str, SendJob]) -> tuple[str, JobObservation]:
            nonlocal outstanding
            observer.posting += 1
            try:
                seen = await self._post(item[0], item[1], now)
                if seen.state in ("accepted", "running"):
                    accepted.append(item)
                return item[1].job_id, seen
            finally:
                observer.posting -= 1
                outstanding -= 1
                if outstanding == signal_at and halfway is not None:
                    halfway()

        def hold_reads() -> None:
            if on_finished is not None:
                for url, job in accepted:
                    observer.watch_job(url, job, on_finished)

        return dict(self._run_all(jobs, one, _unreachable_job, then=hold_reads))

    async def _post(self, url: str, job: SendJob, now: datetime) -> JobObservation:
        body = envelope_bytes(build_payload(job, now), self.key)
        try:
            status, answer = await self._http.request(
                url, "POST", f"/v1/nodes/{job.node}/jobs", body, node=job.node
            )
            if status in (200, 202):
                return job_observation(job.job_id, answer)
            if 400 <= status < 500 and not transient(status):
                return JobObservation(
                    job.job_id,
                    "refused",
                    error=error_text(status, answer),
                    signed=signed_error(answer),
                )
            raise Unreachable(error_text(status, answer))
        except Unreachable as exc:
            return JobObservation(job.job_id, "unreachable", error=str(exc))

    def read_jobs(self, jobs: Sequence[tuple[str, SendJob]]) -> dict[str, JobObservation | None]:
        """GET each job's record; None when the agent does not know the job."""
        read = self._observer.read_job

        async def one(item: tuple[str, SendJob]) -> tuple[str, JobObservation | None]:
            url, job = item
            try:
                return job.job_id, await read(url, job)
            except Unreachable as exc:
                return job.job_id, JobObservation(job.job_id, "unreachable", error=str(exc))

        return dict(self._run_all(jobs, one, _unreachable_job))

    def read_heartbeats(self, nodes: Sequence[tuple[str, str]]) -> dict[str, Heartbeat | None]:
        """GET each node's heartbeat; None when it is unreachable or unusable."""
        return self._read_nodes(nodes, self._observer.read_heartbeat)

    def read_backups(self, nodes: Sequence[tuple[str, str]]) -> dict[str, BackupList | None]:
        """GET each node's backups, newest first, signed where the agent has
        a key; None when unreachable or unusable."""
        return self._read_nodes(nodes, self._observer.read_backups)

    def watch_jobs(
        self, jobs: Sequence[tuple[str, SendJob]], on_finished: Callable[[], None]
    ) -> None:
        """Keep a held read (``?wait=``, docs/protocol.md) in flight for each
        of ``jobs``, and for no other job; call ``on_finished`` (from the
        client's thread) when one answers finished. Returns at once. Agents
        that ignore ``wait`` (they answer at once, unfinished) are left to
        the passes' polling."""
        if not self._closed:
            self._loop.call_soon_threadsafe(self._observer.watch_jobs, list(jobs), on_finished)

    def take_held(self, job_ids: Iterable[str]) -> tuple[dict[str, JobObservation], set[str]]:
        """``take_finished``, and which of the other ``job_ids`` still have a
        held read in flight, both at one instant: a job in that set has not
        finished yet, or its held read brings it, and a pass, in both cases."""
        wanted = list(job_ids)
        if self._closed:
            return self._observer.take_finished(wanted), set()

        async def take() -> tuple[dict[str, JobObservation], set[str]]:
            return self._observer.take_held(wanted)

        return self._call(take())

    def has_news(self) -> bool:
        """Whether, since the last ``take_held``, a held job read ended
        unfinished (lost), or a finished one's wake-up came (at once for a
        failure, else when the gather of the batch's finishes ends): the
        jobs ``take_held`` named as held are no longer all so."""
        return self._observer.has_news()

    def awaited(self) -> set[str]:
        """The job ids a pass hears of without asking: a held read is in
        flight for each, or its finished record waits for the gathered
        wake-up."""

        async def ids() -> set[str]:
            return self._observer.awaited()

        return self._call(ids())

    def take_finished(self, job_ids: Iterable[str]) -> dict[str, JobObservation]:
        """The finished records of ``job_ids`` that held reads brought since
        the last call; the others it kept are dropped (no longer wanted)."""
        return self._observer.take_finished(job_ids)

    def watch_heartbeats(
        self, nodes: Sequence[HeartbeatWatch], on_change: Callable[[], None]
    ) -> None:
        """Keep a held heartbeat read (``?newerThan=&wait=``) in flight for
        each of ``nodes`` and no other; call ``on_change`` (from the client's
        thread) when one answers changed, or at its own ``wait`` (a soak's
        end), the heartbeat kept for ``take_heartbeats``. Returns at once.
        Agents that answer at once are left to the passes' polling."""
        if not self._closed:
            self._loop.call_soon_threadsafe(self._observer.watch_heartbeats, list(nodes), on_change)

    def take_heartbeats(self, nodes: Iterable[str]) -> dict[str, Heartbeat]:
        """The heartbeats of ``nodes`` read after their held reads answered
        succeeded, since the last call; the others it kept are dropped."""
        return self._observer.take_heartbeats(nodes)

    def watching(self) -> set[str]:
        """The job ids with a held read in flight (for tests and metrics)."""

        async def ids() -> set[str]:
            return self._observer.watching()

        return self._call(ids())

    def watching_heartbeats(self) -> set[str]:
        """The nodes with a held heartbeat read in flight (for tests)."""

        async def nodes() -> set[str]:
            return self._observer.watching_heartbeats()

        return self._call(nodes())

    def stalled(self) -> set[str]:
        """The nodes not waited for: their last answer did not come in time
        (for tests and the log)."""

        async def nodes() -> set[str]:
            return {node for _, node in self._http.stalled}

        return self._call(nodes())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            self._observer.close()
            self._http.close()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Internals

    def _read_nodes(
        self,
        nodes: Sequence[tuple[str, str]],
        read: Callable[[str, str], Awaitable[_T | None]],
    ) -> dict[str, _T | None]:
        async def one(item: tuple[str, str]) -> tuple[str, _T | None]:
            return item[1], await read(*item)

        return dict(self._run_all(nodes, one, lambda item, _: (item[1], None)))

    def _run_all(
        self,
        items: Sequence[_T],
        one: Callable[[_T], Awaitable[_R]],
        on_bug: Callable[[_T, str], _R],
        then: Callable[[], None] | None = None,
    ) -> list[_R]:
        if self._closed:
            raise RuntimeError("AgentClient is closed")
        if not items:
            return []

        async def run() -> list[_R]:
            results: list[_R] = []
            queue = iter(items)

            async def worker() -> None:
                for item in queue:  # shared iterator: each item taken once
                    try:
                        results.append(await one(item))
                    except Exception as exc:  # a bug here must not lose the other answers
                        log.exception("agent request for %r failed unexpectedly", item)
                        results.append(on_bug(item, f"client error: {exc!r}"))

            workers = min(self.concurrency, len(items))
            await asyncio.gather(*(worker() for _ in range(workers)))
            if then is not None:
                then()  # on the loop, before the caller's thread has the results
            return results

        return self._call(run())

    def _call(self, coro: Coroutine[Any, Any, _R]) -> _R:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()


def _unreachable_job(item: tuple[str, SendJob], reason: str) -> tuple[str, JobObservation]:
    return item[1].job_id, JobObservation(item[1].job_id, "unreachable", error=reason)


# --- one-shot reads for the command line ---------------------------------------


def fetch_backups(agent: str, node: str, timeout: float, pin: str | None = None) -> list[Backup]:
    """One node's backups, newest first, for ``reconciler backups``: one plain
    GET (reading needs no key) with the daemon's own bounds on the answer,
    errors in words for a person. An https agent is accepted only with the
    certificate ``pin`` (``agentCertSha256``)."""
    if agent.startswith("https://") and pin is None:
        raise AgentError(
            f"the agent of {node} at {agent} is https:// without spec.agentCertSha256",
            hint="pin its certificate in the node file (reconciler keys tls prints the value)",
        )
    who = f"the agent of {node} at {agent}"
    try:
        status, body = asyncio.run(
            _get_once(agent, f"/v1/nodes/{node}/backups", node, timeout, pin)
        )
    except PinMismatch as exc:
        raise AgentError(
            f"{who} is not the pinned one: {exc}",
            hint="if the agent's certificate was replaced, update agentCertSha256 in its node file",
        ) from None
    except Unreachable as exc:
        raise AgentError(
            f"cannot reach {who}: {exc}", hint="is the agent running and reachable from here?"
        ) from None
    if status != 200:
        raise AgentError(
            f"{who} answered {error_text(status, body)}",
            hint="check that spec.agent of the node file points at this node's agent",
        )
    try:
        backups = list(parse_backup_list(read_json(body)))
    except (Unreachable, ValueError) as exc:
        raise AgentError(f"{who} sent a backup list we cannot read: {exc}") from None
    # Newest first, as the agent promises; sorting keeps that true for any agent.
    return sorted(backups, key=lambda b: b.created_at, reverse=True)


async def _get_once(
    agent: str, path: str, node: str, timeout: float, pin: str | None
) -> tuple[int, bytes]:
    http = HttpClient(timeout, 1)
    try:
        if pin is not None:
            origin = parse_base(agent)
            try:
                http.pins[(origin.host, origin.port)] = parse_pin(pin)
            except ValueError as exc:
                raise PinMismatch(f"spec.agentCertSha256 {exc}") from None
        return await http.request(agent, "GET", path, node=node)
    finally:
        http.close()
