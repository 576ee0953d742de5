"""The daemon's side of the agent protocol (docs/protocol.md): send signed
jobs, read job records, heartbeats and backups, for many nodes at once.

Every answer becomes an observation value; nothing an agent does (refuse,
crash, hang, answer garbage, name another node) raises out of this module.

    4xx to a POST               -> JobObservation state "refused", error "code: message"
    connection error, timeout,
    5xx, 408/429, unusable body -> state "unreachable" (or None for heartbeats
                                   and backups), reason in ``error`` / the log
    404 reading a job           -> None: the agent does not know it (resend it)

Design, from measurements (docs/performance.md, ``bench/dispatch.py``): httpx's
AsyncClient costs ~2 ms of CPU per request and a sync httpx.Client ~0.5 ms,
too much for 2,000 jobs/s on a 2-core machine where each job is a POST and a
GET. So this is a small HTTP/1.1 client on asyncio protocols (streams and
``wait_for`` cost a task and several buffers per request): keep-alive
connections pooled per origin, a fixed number of worker coroutines (the
concurrency cap) per call, one deadline per request (connect included), one
retry on a fresh connection when a reused keep-alive connection turns out
closed (safe: jobs are idempotent by id). The event loop runs in a private thread, so the
synchronous API can be called from any thread, including one running its
own event loop.

Must not decide anything: it reports what agents said.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

from reconciler.protocol.effects import SendJob
from reconciler.protocol.evidence import split_answer
from reconciler.protocol.job_payload import build_payload
from reconciler.protocol.long_poll import (
    DAEMON_WAIT_SECONDS,
    FINISHED_JOB_STATES,
    heartbeat_content,
    heartbeat_query,
    raise_open_files_limit,
    wait_query,
)
from reconciler.protocol.observations import (
    Backup,
    Heartbeat,
    JobObservation,
    RuntimeReport,
    SignedAnswer,
    parse_backup_list,
    parse_check_reports,
)
from reconciler.protocol.signing import SigningKey, envelope_bytes
from reconciler.protocol.tls import client_context, parse_pin, pin_problem
from reconciler.spec.errors import AgentError

log = logging.getLogger(__name__)

AGENT_JOB_STATES = frozenset({"accepted", "running", "succeeded", "failed"})
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
MAX_HEAD_BYTES = 64 * 1024
MAX_IDLE_CONNECTIONS = 512  # across all origins; a fleet of 10,000 agents must not pin 10,000 fds
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
USER_AGENT = "reconciler-daemon"
_T = TypeVar("_T")
_R = TypeVar("_R")


class _Unreachable(Exception):
    """No usable HTTP answer; the message says why."""


@dataclass(frozen=True)
class _Origin:
    scheme: str
    host: str
    port: int
    prefix: str  # path prefix of the base URL, without a trailing slash

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


def _parse_base(url: str) -> _Origin:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _Unreachable(f"agent address {url!r} is not an http(s) URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise _Unreachable(f"agent address {url!r}: {exc}") from None
    return _Origin(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


class _StaleConnection(Exception):
    """A reused keep-alive connection was closed before any answer: retry fresh."""


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: one request at a time, answer parsed as bytes arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self.head: tuple[int, int | None, bool, bool] | None = None
        self.body_start = 0
        self.closed = False
        self.pin: bytes | None = None  # the certificate pin this TLS connection was checked with

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self.head is not None and self.head[1] is None and not self.head[2]:
            self._complete(self.buffer[self.body_start :], False)  # body ends with the connection
        elif not self.buffer:
            reason = f"{exc}" if exc else "closed before answering"
            waiter.set_exception(_StaleConnection(reason))
        else:
            waiter.set_exception(_Unreachable("connection closed in the middle of the answer"))

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            self.close()  # bytes nobody asked for: this connection cannot be trusted
            return
        self.buffer = self.buffer + data if self.buffer else data
        try:
            self._parse()
        except _Unreachable as exc:
            waiter.set_exception(exc)
            self.close()

    def _parse(self) -> None:
        buffer = self.buffer
        if self.head is None:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    raise _Unreachable("answer headers too large")
                return
            self.head = _parse_head(buffer[:end])
            self.body_start = end + 4
        _, length, chunked, keep_alive = self.head
        if chunked:
            body = _chunked_body(buffer, self.body_start)
            if body is not None:
                self._complete(body, keep_alive)
        elif length is not None:
            if len(buffer) - self.body_start >= length:
                self._complete(buffer[self.body_start : self.body_start + length], keep_alive)
        elif len(buffer) - self.body_start > MAX_RESPONSE_BYTES:
            raise _Unreachable("answer too large")

    def _complete(self, body: bytes, keep_alive: bool) -> None:
        assert self.head is not None and self.waiter is not None
        self.waiter.set_result((self.head[0], body, keep_alive))

    async def exchange(self, data: bytes) -> tuple[int, bytes, bool]:
        assert self.transport is not None
        self.buffer = b""
        self.head = None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class _Pool:
    """Idle keep-alive connections, per origin, capped overall (oldest go first)."""

    def __init__(self, limit: int) -> None:
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._order: OrderedDict[int, tuple[_Origin, _Connection]] = OrderedDict()
        self._limit = limit

    def take(self, origin: _Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()  # newest first: least likely closed by the server
            del self._order[id(conn)]
            if not conn.closed:
                return conn
        return None

    def give(self, origin: _Origin, conn: _Connection) -> None:
        self._idle.setdefault(origin, []).append(conn)
        self._order[id(conn)] = (origin, conn)
        while len(self._order) > self._limit:
            _, (old_origin, old) = self._order.popitem(last=False)
            self._idle[old_origin].remove(old)
            old.close()

    def close_all(self) -> None:
        for _, conn in self._order.values():
            conn.close()
        self._order.clear()
        self._idle.clear()


class _HttpClient:
    """HTTP/1.1 on asyncio protocols: just what the agent protocol needs."""

    def __init__(self, timeout: float, idle_limit: int) -> None:
        self.timeout = timeout
        self.pool = _Pool(idle_limit)
        self._origins: dict[str, _Origin] = {}
        self._ssl: ssl.SSLContext | None = None
        # https agents: (host, port) -> SHA-256 of the one certificate accepted
        self.pins: dict[tuple[str, int], bytes] = {}

    def origin(self, base_url: str) -> _Origin:
        origin = self._origins.get(base_url)
        if origin is None:
            origin = self._origins[base_url] = _parse_base(base_url)
        return origin

    async def request(
        self,
        base_url: str,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        timeout: float | None = None,
    ) -> tuple[int, bytes]:
        origin = self.origin(base_url)
        head = (
            f"{method} {origin.prefix}{path} HTTP/1.1\r\nHost: {origin.host_header}\r\n"
            f"User-Agent: {USER_AGENT}\r\nAccept: application/json\r\n"
        )
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        data = (head + "\r\n").encode("latin-1") + (body or b"")
        loop = asyncio.get_running_loop()
        limit = timeout or self.timeout
        deadline = loop.time() + limit
        conn = self.pool.take(origin)
        if conn is not None and conn.pin != self.pins.get((origin.host, origin.port)):
            conn.close()  # checked against a pin that has changed since
            conn = None
        if conn is not None:
            try:
                return await self._send(origin, conn, data, deadline, limit)
            except _StaleConnection:
                pass  # the agent closed an idle keep-alive connection: retry once, fresh
        conn = await self._connect(origin, deadline)
        try:
            return await self._send(origin, conn, data, deadline, limit)
        except _StaleConnection as exc:
            raise _Unreachable(f"connection closed by the agent: {exc}") from None

    async def _connect(self, origin: _Origin, deadline: float) -> _Connection:
        loop = asyncio.get_running_loop()
        context = None
        pin = None
        if origin.scheme == "https":
            pin = self.pins.get((origin.host, origin.port))
            if pin is None:
                # A job must never go to a peer whose certificate nobody pinned.
                raise _Unreachable(
                    f"https agent {origin.host}:{origin.port} has no pinned certificate "
                    "(spec.agentCertSha256); nothing sent"
                )
            if self._ssl is None:
                self._ssl = client_context()
            context = self._ssl
        try:
            transport, conn = await asyncio.wait_for(
                loop.create_connection(_Connection, origin.host, origin.port, ssl=context),
                max(deadline - loop.time(), 0.001),
            )
        except TimeoutError:
            raise _Unreachable(
                f"cannot connect to {origin.host}:{origin.port}: no answer within {self.timeout:g}s"
            ) from None
        except (OSError, ssl.SSLError) as exc:
            raise _Unreachable(f"cannot connect to {origin.host}:{origin.port}: {exc}") from None
        if pin is not None:
            ssl_object = transport.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(True) if ssl_object is not None else None
            problem = pin_problem(der, pin)
            if problem:
                conn.close()
                raise _Unreachable(f"TLS {origin.host}:{origin.port}: {problem}; nothing sent")
            conn.pin = pin
        return conn

    async def _send(
        self, origin: _Origin, conn: _Connection, data: bytes, deadline: float, limit: float
    ) -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        # A timer instead of wait_for: wait_for costs a task per request.
        timer = loop.call_at(deadline, _time_out, conn, limit)
        done = False
        try:
            status, body, keep_alive = await conn.exchange(data)
            done = True
        finally:
            timer.cancel()
            if not done:
                conn.close()
        if keep_alive and not conn.closed:
            self.pool.give(origin, conn)
        else:
            conn.close()
        return status, body

    def close(self) -> None:
        self.pool.close_all()


def _time_out(conn: _Connection, timeout: float) -> None:
    if conn.waiter is not None and not conn.waiter.done():
        conn.waiter.set_exception(_Unreachable(f"no answer within {timeout:g}s"))
    conn.close()


def _parse_head(head: bytes) -> tuple[int, int | None, bool, bool]:
    try:
        lines = head.decode("latin-1").split("\r\n")
        version, code, *_ = lines[0].split(" ", 2)
        if not version.startswith("HTTP/1."):
            raise ValueError(version)
        status = int(code)
    except ValueError:
        raise _Unreachable(f"not an HTTP answer: {head[:60]!r}") from None
    length: int | None = None
    chunked = False
    keep_alive = version == "HTTP/1.1"
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        value = value.strip()
        if name == "content-length":
            try:
                length = int(value)
            except ValueError:
                raise _Unreachable(f"bad Content-Length {value!r}") from None
            if not 0 <= length <= MAX_RESPONSE_BYTES:
                raise _Unreachable(f"answer too large ({length} bytes)")
        elif name == "transfer-encoding":
            chunked = "chunked" in value.lower()
        elif name == "connection":
            keep_alive = value.lower() == "keep-alive" or (keep_alive and value.lower() != "close")
    if status in (204, 304) or 100 <= status < 200:
        length = 0
    return status, length, chunked, keep_alive


def _chunked_body(buffer: bytes, start: int) -> bytes | None:
    """The decoded body when ``buffer[start:]`` holds all of it, else None."""
    parts: list[bytes] = []
    pos = start
    total = 0
    while True:
        end = buffer.find(b"\r\n", pos)
        if end < 0:
            return None
        try:
            size = int(buffer[pos:end].split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise _Unreachable("bad chunk in the answer") from None
        pos = end + 2
        if size == 0:
            trailer_end = buffer.find(b"\r\n\r\n", pos - 2)
            return b"".join(parts) if trailer_end >= 0 else None
        total += size
        if total > MAX_RESPONSE_BYTES:
            raise _Unreachable("answer too large")
        if len(buffer) < pos + size + 2:
            return None
        parts.append(buffer[pos : pos + size])
        pos += size + 2


# -- reading answers -----------------------------------------------------------


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep
        raise _Unreachable(f"answer is not JSON: {body[:60]!r}") from None


def _error_text(status: int, body: bytes) -> str:
    """``code: message`` from an error answer, or what we can say about it."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        message = data.get("message")
        return f"{data['error']}: {message}" if isinstance(message, str) else data["error"]
    excerpt = body[:80].decode("utf-8", "replace").strip()
    return f"http_{status}: {excerpt}" if excerpt else f"http_{status}"


def _signed_error(body: bytes) -> SignedAnswer | None:
    """The evidence of an error answer (a signed refusal), if it has any."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep
        return None
    return split_answer(data) if isinstance(data, dict) else None


def _optional_str(record: dict[str, Any], key: str) -> str | None:
    value = record.get(key)
    if value is None or isinstance(value, str):
        return value
    raise _Unreachable(f"job record field {key} is not text: {value!r}")


def _job_observation(job_id: str, body: bytes) -> JobObservation:
    record = _json(body)
    if not isinstance(record, dict):
        raise _Unreachable("job record is not a JSON object")
    if record.get("jobId") != job_id:
        raise _Unreachable(f"answer is about job {record.get('jobId')!r}, not {job_id!r}")
    state = record.get("state")
    if state not in AGENT_JOB_STATES:
        raise _Unreachable(f"job record has no valid state: {state!r}")
    return JobObservation(
        job_id=job_id,
        state=state,
        error=_optional_str(record, "error") or "",
        backup_id=_optional_str(record, "backupId"),
        finished_at=_optional_str(record, "finishedAt"),
        source_commit=_optional_str(record, "sourceCommit"),
        detail=_optional_str(record, "detail") or "",
        signed=split_answer(record),
    )


def _text(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise _Unreachable(f"field {key} is missing or not text")
    return value


def _heartbeat(node: str, body: bytes) -> Heartbeat:
    data = _json(body)
    if not isinstance(data, dict):
        raise _Unreachable("heartbeat is not a JSON object")
    if data.get("node") != node:
        raise _Unreachable(f"heartbeat names node {data.get('node')!r}, not {node!r}")
    runtimes = data.get("runtimes")
    if not isinstance(runtimes, list) or not all(isinstance(r, dict) for r in runtimes):
        raise _Unreachable("heartbeat runtimes is not a list of objects")
    agent_version = data.get("agentVersion")
    try:
        checks = parse_check_reports(data.get("checks"))
    except ValueError as exc:
        raise _Unreachable(str(exc)) from None
    return Heartbeat(
        node=node,
        time=_text(data, "time"),
        agent_version=agent_version if isinstance(agent_version, str) else "",
        runtimes=tuple(
            RuntimeReport(
                type=_text(r, "type"),
                provider=_text(r, "provider"),
                model=_text(r, "model"),
                profile=_text(r, "profile"),
                config_digest=r["configDigest"] if isinstance(r.get("configDigest"), str) else "",
            )
            for r in runtimes
        ),
        checks=checks,
        signed=split_answer(data),
    )


def _backups(body: bytes) -> tuple[Backup, ...]:
    try:
        return parse_backup_list(_json(body))
    except ValueError as exc:
        raise _Unreachable(str(exc)) from None


def _transient(status: int) -> bool:
    """Answers that say nothing about the job: try again later."""
    return status >= 500 or status in (408, 429)


# -- the client ----------------------------------------------------------------


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
    ``open_files`` descriptors: what is left after the idle connections and
    FD_RESERVE, shared by the two kinds, up to MAX_WATCHES."""
    return max(16, min(MAX_WATCHES, (open_files - MAX_IDLE_CONNECTIONS - FD_RESERVE) // 2))


class AgentClient:
    """Talks to node agents for the daemon. Thread-safe; one call at a time
    runs on the client's own event loop thread."""

    def __init__(self, key: SigningKey, *, concurrency: int = 64, timeout: float = 5.0) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.key = key
        self.concurrency = concurrency
        self.timeout = timeout
        self._http = _HttpClient(timeout, max(MAX_IDLE_CONNECTIONS, concurrency))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="agent-client", daemon=True
        )
        self._thread.start()
        self._closed = False
        # On the loop thread only: job id -> its held read; origins that ignore
        # ``wait``; the pending gathered wake-up (see GATHER_SECONDS).
        self._watches: dict[str, asyncio.Task[None]] = {}
        self._no_wait: set[_Origin] = set()
        self._gathering: asyncio.TimerHandle | None = None
        self._gathering_since = 0.0  # loop time of the first finish it gathers
        self._last_finish = 0.0  # loop time of the newest finish it gathers
        self._on_gathered: Callable[[], None] = lambda: None
        # Finished records that held reads brought, until a pass takes them
        # (``take_finished``): the pass need not ask for them again.
        self._finished_lock = threading.Lock()
        self._finished: dict[str, JobObservation] = {}
        # node -> its heartbeat read right after a held read saw its live
        # apply succeed: the evidence that pass will ask for, read meanwhile.
        self._heartbeats: dict[str, Heartbeat] = {}
        self._posting = 0  # POSTs in flight (loop thread): their held reads are still to come
        # Set (loop thread) when a held job read ends, finished or not; reset
        # by ``take_held``: a pass has something new to look at.
        self._news = False
        # On the loop thread only: node -> its held heartbeat read; origins
        # that answer heartbeats at once whatever the query.
        self._beat_watches: dict[str, asyncio.Task[None]] = {}
        self._no_beat_wait: set[_Origin] = set()
        # Held reads of each kind at once, within the open files limit.
        self.max_watches = watch_limit(raise_open_files_limit())
        # Called on the loop thread with (node, signed answer) for each signed
        # job record read, so its signature is checked while other answers
        # are still on the wire (the daemon's AnswerCheck.prepare).
        self.on_signed: Callable[[str, SignedAnswer], object] | None = None

    # The public calls: each runs one batch of requests on the loop thread.

    def set_pins(self, pins: Mapping[str, str]) -> None:
        """The certificate pins of https agents: base URL -> ``agentCertSha256``
        (docs/trust.md). An https agent without a pin gets nothing; one whose
        certificate differs gets nothing and its answers are unreachable."""
        parsed: dict[tuple[str, int], bytes] = {}
        for url, text in pins.items():
            try:
                origin = _parse_base(url)
                parsed[(origin.host, origin.port)] = parse_pin(text)
            except (_Unreachable, ValueError):
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
        key = self.key
        outstanding = len(jobs)
        signal_at = outstanding // 2 if halfway is not None and outstanding > 1 else -1
        accepted: list[tuple[str, SendJob]] = []  # their held reads start once all are in

        def body(job: SendJob) -> bytes:
            return envelope_bytes(build_payload(job, now), key)

        async def one(item: tuple[str, SendJob]) -> tuple[str, JobObservation]:
            nonlocal outstanding
            self._posting += 1
            try:
                job_id, seen = await post(item)
                if seen.state in ("accepted", "running"):
                    accepted.append(item)
                return job_id, seen
            finally:
                self._posting -= 1
                outstanding -= 1
                if outstanding == signal_at and halfway is not None:
                    halfway()

        async def post(item: tuple[str, SendJob]) -> tuple[str, JobObservation]:
            url, job = item
            try:
                status, answer = await self._http.request(
                    url, "POST", f"/v1/nodes/{job.node}/jobs", body(job)
                )
                if status in (200, 202):
                    return job.job_id, _job_observation(job.job_id, answer)
                if 400 <= status < 500 and not _transient(status):
                    return job.job_id, JobObservation(
                        job.job_id,
                        "refused",
                        error=_error_text(status, answer),
                        signed=_signed_error(answer),
                    )
                raise _Unreachable(_error_text(status, answer))
            except _Unreachable as exc:
                return job.job_id, JobObservation(job.job_id, "unreachable", error=str(exc))

        def hold_reads() -> None:
            if on_finished is not None:
                for url, job in accepted:
                    self._watch_one(url, job, on_finished)

        return dict(self._run_all(jobs, one, _unreachable_job, then=hold_reads))

    def read_jobs(self, jobs: Sequence[tuple[str, SendJob]]) -> dict[str, JobObservation | None]:
        """GET each job's record; None when the agent does not know the job."""

        async def one(item: tuple[str, SendJob]) -> tuple[str, JobObservation | None]:
            url, job = item
            try:
                status, answer = await self._http.request(
                    url, "GET", f"/v1/nodes/{job.node}/jobs/{job.job_id}"
                )
                if status == 200:
                    seen = _job_observation(job.job_id, answer)
                    if seen.signed is not None and self.on_signed is not None:
                        self.on_signed(job.node, seen.signed)
                    return job.job_id, seen
                if status == 404:
                    return job.job_id, None
                raise _Unreachable(_error_text(status, answer))
            except _Unreachable as exc:
                return job.job_id, JobObservation(job.job_id, "unreachable", error=str(exc))

        return dict(self._run_all(jobs, one, _unreachable_job))

    def read_heartbeats(self, nodes: Sequence[tuple[str, str]]) -> dict[str, Heartbeat | None]:
        """GET each node's heartbeat; None when it is unreachable or unusable."""
        return self._read_nodes(nodes, "heartbeat", _heartbeat_reader)

    def read_backups(
        self, nodes: Sequence[tuple[str, str]]
    ) -> dict[str, tuple[Backup, ...] | None]:
        """GET each node's backups, newest first; None when unreachable or unusable."""
        return self._read_nodes(nodes, "backups", _backups_reader)

    def watch_jobs(
        self, jobs: Sequence[tuple[str, SendJob]], on_finished: Callable[[], None]
    ) -> None:
        """Keep a held read (``?wait=``, docs/protocol.md) in
        flight for each of ``jobs``, and for no other job; call ``on_finished``
        (from the client's thread) when one answers finished. Returns at once.
        Agents that ignore ``wait`` (they answer at once, unfinished) are
        left to the passes' polling."""
        if self._closed:
            return
        wanted = list(jobs)
        self._loop.call_soon_threadsafe(self._watch, wanted, on_finished)

    def take_held(self, job_ids: Iterable[str]) -> tuple[dict[str, JobObservation], set[str]]:
        """``take_finished``, and which of the other ``job_ids`` still have a
        held read in flight, both at one instant: a job in that set has not
        finished yet, or its held read brings it, and a pass, in both cases."""
        wanted = list(job_ids)
        if self._closed:
            return self.take_finished(wanted), set()

        async def take() -> tuple[dict[str, JobObservation], set[str]]:
            self._news = False
            return self.take_finished(wanted), {j for j in wanted if j in self._watches}

        return self._call(take())

    def has_news(self) -> bool:
        """Whether a held job read ended (finished, failed, or lost) since
        the last ``take_held``: the jobs ``take_held`` named as held are no
        longer all so."""
        return self._news

    def take_finished(self, job_ids: Iterable[str]) -> dict[str, JobObservation]:
        """The finished records of ``job_ids`` that held reads brought since
        the last call; the others it kept are dropped (no longer wanted)."""
        with self._finished_lock:
            found, self._finished = self._finished, {}
        return {job_id: found[job_id] for job_id in job_ids if job_id in found}

    def watch_heartbeats(
        self, nodes: Sequence[HeartbeatWatch], on_change: Callable[[], None]
    ) -> None:
        """Keep a held heartbeat read (``?newerThan=&wait=``) in flight for
        each of ``nodes`` and no other; call ``on_change`` (from the client's
        thread) when one answers changed, or at its own ``wait`` (a soak's
        end), the heartbeat kept for ``take_heartbeats``. Returns at once.
        Agents that answer at once are left to the passes' polling."""
        if self._closed:
            return
        self._loop.call_soon_threadsafe(self._watch_beats, list(nodes), on_change)

    def _watch_beats(self, nodes: list[HeartbeatWatch], on_change: Callable[[], None]) -> None:
        wanted = {w.node: w for w in nodes}
        for node in [n for n in self._beat_watches if n not in wanted]:
            self._beat_watches.pop(node).cancel()
        for node, watch in wanted.items():
            if node in self._beat_watches or len(self._beat_watches) >= self.max_watches:
                continue
            try:
                origin = self._http.origin(watch.url)
            except _Unreachable:
                continue
            if origin not in self._no_beat_wait:
                task = asyncio.ensure_future(self._held_heartbeat(origin, watch, on_change))
                self._beat_watches[node] = task

    async def _held_heartbeat(
        self, origin: _Origin, watch: HeartbeatWatch, on_change: Callable[[], None]
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
                status, answer = await self._http.request(
                    watch.url, "GET", path, timeout=wait + self.timeout
                )
                if status != 200:
                    return
                beat = _heartbeat(watch.node, answer)
                took = loop.time() - asked
                changed = heartbeat_content(beat) != watch.content
                if changed or (timed and took >= wait * 0.9):
                    if self._beat_watches.get(watch.node) is asyncio.current_task():
                        del self._beat_watches[watch.node]
                    with self._finished_lock:
                        self._heartbeats[watch.node] = beat
                    on_change()
                    return
                if took < wait / 2:
                    # Answered, unchanged, before the wait could end: it ignores the query.
                    self._no_beat_wait.add(origin)
                    log.info("agent at %s answers heartbeats at once: they are polled", watch.url)
                    return
                newer, wait, timed = beat.time, DAEMON_WAIT_SECONDS, False
        except _Unreachable:
            return
        finally:
            if self._beat_watches.get(watch.node) is asyncio.current_task():
                del self._beat_watches[watch.node]

    def watching_heartbeats(self) -> set[str]:
        """The nodes with a held heartbeat read in flight (for tests)."""

        async def nodes() -> set[str]:
            return set(self._beat_watches)

        return self._call(nodes())

    def take_heartbeats(self, nodes: Iterable[str]) -> dict[str, Heartbeat]:
        """The heartbeats of ``nodes`` read after their held reads answered
        succeeded, since the last call; the others it kept are dropped."""
        with self._finished_lock:
            found, self._heartbeats = self._heartbeats, {}
        return {node: found[node] for node in nodes if node in found}

    def watching(self) -> set[str]:
        """The job ids with a held read in flight (for tests and metrics)."""

        async def ids() -> set[str]:
            return set(self._watches)

        return self._call(ids())

    def _watch(self, jobs: list[tuple[str, SendJob]], on_finished: Callable[[], None]) -> None:
        wanted = {job.job_id: (url, job) for url, job in jobs}
        for job_id in [j for j in self._watches if j not in wanted]:
            self._watches.pop(job_id).cancel()
        for url, job in wanted.values():
            self._watch_one(url, job, on_finished)

    def _watch_one(self, url: str, job: SendJob, on_finished: Callable[[], None]) -> None:
        if job.job_id in self._watches or len(self._watches) >= self.max_watches:
            return
        try:
            origin = self._http.origin(url)
        except _Unreachable:
            return  # the passes report it
        if origin not in self._no_wait:
            task = asyncio.ensure_future(self._held_read(origin, url, job, on_finished))
            self._watches[job.job_id] = task

    async def _held_read(
        self, origin: _Origin, url: str, job: SendJob, on_finished: Callable[[], None]
    ) -> None:
        """Held reads of one job until it is finished; ends quietly on any
        trouble, which the next pass's read reports."""
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()  # asked once: in Python 3.11 it is not free
        path = f"/v1/nodes/{job.node}/jobs/{job.job_id}?{wait_query(DAEMON_WAIT_SECONDS)}"
        try:
            while True:
                asked = loop.time()
                status, answer = await self._http.request(
                    url, "GET", path, timeout=DAEMON_WAIT_SECONDS + self.timeout
                )
                if status != 200:
                    return
                seen = _job_observation(job.job_id, answer)
                if seen.state in FINISHED_JOB_STATES:
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
                    with self._finished_lock:
                        self._finished[job.job_id] = seen
                        if beat is not None:
                            self._heartbeats[job.node] = beat
                    self._wake_gathered(seen.state == "failed", on_finished)
                    return
                if loop.time() - asked < DAEMON_WAIT_SECONDS / 2:
                    # Answered unfinished before the wait could end: it ignores ``wait``.
                    self._no_wait.add(origin)
                    log.info("agent at %s answers at once: its jobs are polled", url)
                    return
        except _Unreachable:
            return
        finally:
            self._news = True
            if self._watches.get(job.job_id) is me:
                del self._watches[job.job_id]

    def _wake_gathered(self, at_once: bool, on_finished: Callable[[], None]) -> None:
        """Start a pass now when asked to or when no held read is left, else
        once GATHER_SECONDS have passed without another finish, and at the
        latest GATHER_LIMIT times that since the first finish waiting."""
        if at_once or not (self._watches or self._posting):
            if self._gathering is not None:
                self._gathering.cancel()
                self._gathering = None
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
        self._on_gathered()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def shutdown() -> None:
            if self._gathering is not None:
                self._gathering.cancel()
            for task in [*self._watches.values(), *self._beat_watches.values()]:
                task.cancel()
            self._watches.clear()
            self._beat_watches.clear()
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

    async def _one_heartbeat(self, url: str, node: str) -> Heartbeat | None:
        try:
            status, answer = await self._http.request(url, "GET", f"/v1/nodes/{node}/heartbeat")
            return _heartbeat(node, answer) if status == 200 else None
        except (_Unreachable, AgentError, ValueError):
            return None  # the pass reads it again and reports what is wrong

    def _read_nodes(
        self,
        nodes: Sequence[tuple[str, str]],
        what: str,
        reader: Callable[[str, bytes], _T],
    ) -> dict[str, _T | None]:
        async def one(item: tuple[str, str]) -> tuple[str, _T | None]:
            url, node = item
            try:
                status, answer = await self._http.request(url, "GET", f"/v1/nodes/{node}/{what}")
                if status != 200:
                    raise _Unreachable(_error_text(status, answer))
                return node, reader(node, answer)
            except _Unreachable as exc:
                log.warning("%s of node %s at %s unusable: %s", what, node, url, exc)
                return node, None

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


def _heartbeat_reader(node: str, body: bytes) -> Heartbeat:
    return _heartbeat(node, body)


def _backups_reader(node: str, body: bytes) -> tuple[Backup, ...]:
    return _backups(body)


# --- one-shot reads for the command line ---------------------------------------


def fetch_backups(agent: str, node: str, timeout: float, pin: str | None = None) -> list[Backup]:
    """One node's backups, newest first, for ``reconciler backups``: one plain
    GET (reading needs no key), errors in words for a person. An https agent
    is accepted only with the certificate ``pin`` (``agentCertSha256``)."""
    import httpx  # only this one-shot read uses it; the daemon's client is asyncio

    url = f"{agent.rstrip('/')}/v1/nodes/{node}/backups"
    https = agent.startswith("https://")
    if https and pin is None:
        raise AgentError(
            f"the agent of {node} at {agent} is https:// without spec.agentCertSha256",
            hint="pin its certificate in the node file (reconciler keys tls prints the value)",
        )
    try:
        # A GET carries nothing secret; the answer counts only from the pinned
        # certificate, checked on the connection it came over.
        verify = client_context() if https else True
        with (
            httpx.Client(verify=verify, timeout=timeout) as client,
            client.stream("GET", url, headers={"User-Agent": "reconciler-cli"}) as answer,
        ):
            if https and pin is not None:
                _check_pin(answer, pin, node, agent)
            answer.read()
    except httpx.HTTPError as exc:
        raise AgentError(
            f"cannot reach the agent of {node} at {agent}: {exc}",
            hint="is the agent running and reachable from here?",
        ) from exc
    if answer.status_code != 200:
        raise AgentError(
            f"the agent of {node} at {agent} answered {answer.status_code}: {_answer_error_text(answer)}",
            hint="check that spec.agent of the node file points at this node's agent",
        )
    try:
        backups = list(parse_backup_list(answer.json()))
    except ValueError as exc:
        raise AgentError(
            f"the agent of {node} at {agent} sent a backup list we cannot read"
        ) from exc
    # Newest first, as the agent promises; sorting keeps that true for any agent.
    return sorted(backups, key=lambda b: b.created_at, reverse=True)


def _check_pin(answer: Any, pin: str, node: str, agent: str) -> None:
    stream = answer.extensions.get("network_stream")
    ssl_object = stream.get_extra_info("ssl_object") if stream is not None else None
    der = ssl_object.getpeercert(True) if ssl_object is not None else None
    try:
        problem = pin_problem(der, parse_pin(pin))
    except ValueError as exc:
        problem = f"spec.agentCertSha256 {exc}"
    if problem:
        raise AgentError(
            f"the agent of {node} at {agent} is not the pinned one: {problem}",
            hint="if the agent's certificate was replaced, update agentCertSha256 in its node file",
        )


def _answer_error_text(answer: Any) -> str:
    try:
        body: Any = answer.json()
    except ValueError:
        return answer.text[:200]
    if isinstance(body, dict) and "error" in body:
        return f"{body.get('error')}: {body.get('message', '')}"
    return str(body)[:200]
