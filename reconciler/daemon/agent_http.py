"""The daemon's HTTP/1.1 client for talking to agents: requests written and
answers read by h11 (python-hyper's HTTP/1.1 state machine, the one httpx's
own stack is built on), on asyncio protocols, with the bounds an answer
from a peer we do not control must keep.

Why not httpx: its AsyncClient costs ~2 ms of CPU per request and a sync
Client ~0.5 ms (docs/performance.md), too much for 2,000 jobs/s on two
cores where each job is a POST and a GET. Streams and ``wait_for`` cost a
task and several buffers per request; a protocol and one timer do not.

    size        an answer, head and framing included, over MAX_ANSWER_BYTES
                is cut off as it arrives: an endless chunked body holds at
                most that much, and its connection is closed
    head        over MAX_HEAD_BYTES (h11's limit on an incomplete event)
    time        one deadline per request, connect included; bytes do not
                extend it, so an agent dribbling a byte a second is cut off
    stalled     a node whose answer did not come within its deadline is not
                waited for again until it answers: its requests fail at once
                while one probe at a time waits for it in the background, up
                to PROBE_SECONDS (docs/protocol.md). So a hanging agent costs
                each pass nothing, not a timeout per request, and is asked
                once at a time, not once a pass.
    idle        keep-alive connections pooled per origin, capped overall;
                a reused one found closed is retried once on a fresh one
                (safe: jobs are idempotent by id)

Must not know what the requests mean: the agent client reads the answers.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11

from reconciler.protocol.long_poll import DAEMON_WAIT_SECONDS
from reconciler.protocol.read_buffer import ReadBuffer
from reconciler.protocol.tls import client_context, pin_problem

log = logging.getLogger(__name__)

MAX_ANSWER_BYTES = 8 * 1024 * 1024  # bytes read off the wire for one answer
MAX_HEAD_BYTES = 64 * 1024
# How long a probe of a stalled node waits: as long as a held read, so a
# node that stays silent is asked a few times a minute, not once a pass.
PROBE_SECONDS = float(DAEMON_WAIT_SECONDS)
USER_AGENT = b"reconciler-daemon"

_END = h11.EndOfMessage()


class Unreachable(Exception):
    """No usable HTTP answer; the message says why."""


class PinMismatch(Unreachable):
    """An https agent whose certificate is not the pinned one."""


class _TimedOut(Unreachable):
    """No whole answer within the deadline."""


class _StaleConnection(Exception):
    """A reused keep-alive connection was closed before any answer: retry fresh."""


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int
    prefix: str  # path prefix of the base URL, without a trailing slash

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    @functools.cached_property
    def host_bytes(self) -> bytes:
        return self.host_header.encode("idna")

    @functools.cached_property
    def bare_request(self) -> h11.Request:
        """A request without a body, its headers validated once: h11 takes
        them as they are for every such request (events are values)."""
        headers = [(b"Host", self.host_bytes), (b"User-Agent", USER_AGENT)]
        return h11.Request(method="GET", target="/", headers=headers)


def parse_base(url: str) -> Origin:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Unreachable(f"agent address {url!r} is not an http(s) URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise Unreachable(f"agent address {url!r}: {exc}") from None
    return Origin(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


class _Connection(asyncio.BufferedProtocol):
    """One HTTP/1.1 connection, one request at a time; h11 reads the answer
    as its bytes arrive, and this class keeps the size bound."""

    def __init__(self, reads: ReadBuffer) -> None:
        self.reads = reads
        self.transport: asyncio.Transport | None = None
        self.wire = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self.status = 0
        self.body = bytearray()
        self.received = 0  # bytes of the current answer read off the wire
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
        if not self.received:
            waiter.set_exception(_StaleConnection(f"{exc}" if exc else "closed before answering"))
            return
        try:
            self.wire.receive_data(b"")  # a body that ends with the connection ends here
            self._read()
        except (h11.RemoteProtocolError, Unreachable):
            pass
        if not waiter.done():
            waiter.set_exception(Unreachable("connection closed in the middle of the answer"))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reads.view

    def buffer_updated(self, nbytes: int) -> None:
        data = self.reads.take(nbytes)
        waiter = self.waiter
        if waiter is None or waiter.done():
            self.close()  # bytes nobody asked for: this connection cannot be trusted
            return
        self.received += len(data)
        try:
            if self.received > MAX_ANSWER_BYTES:
                raise Unreachable(f"answer over {MAX_ANSWER_BYTES} bytes; cut off")
            self.wire.receive_data(data)
            self._read()
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == 431:  # h11's bound on an incomplete event
                reason = f"answer head or chunk line over {MAX_HEAD_BYTES} bytes; cut off"
            else:
                reason = f"not a valid HTTP answer: {exc}"
            waiter.set_exception(Unreachable(reason))
            self.close()
        except Unreachable as exc:
            waiter.set_exception(exc)
            self.close()

    def _read(self) -> None:
        wire = self.wire
        while True:
            event = wire.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            kind = type(event)
            if kind is h11.Response:
                self.status = event.status_code  # type: ignore[union-attr]
            elif kind is h11.Data:
                self.body += event.data  # type: ignore[union-attr]
            elif kind is h11.EndOfMessage:
                reusable = wire.our_state is h11.DONE and wire.their_state is h11.DONE
                if reusable:
                    wire.start_next_cycle()
                assert self.waiter is not None
                self.waiter.set_result((self.status, bytes(self.body), reusable))
                return
            elif kind is h11.ConnectionClosed:
                return
            # InformationalResponse (1xx): the real answer follows

    def exchange(
        self, request: h11.Request, body: bytes | None
    ) -> asyncio.Future[tuple[int, bytes, bool]]:
        """Write the request; the future is its answer: (status, body, reusable)."""
        assert self.transport is not None
        wire = self.wire
        data = wire.send(request) or b""
        if body:
            data += wire.send(h11.Data(data=body)) or b""
        data += wire.send(_END) or b""
        self.status, self.body, self.received = 0, bytearray(), 0
        waiter = self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class _Pool:
    """Idle keep-alive connections, per origin, capped overall (oldest go first)."""

    def __init__(self, limit: int) -> None:
        self._idle: dict[Origin, list[_Connection]] = {}
        self._order: OrderedDict[_Connection, Origin] = OrderedDict()
        self._limit = limit

    def take(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()  # newest first: least likely closed by the server
            del self._order[conn]
            if not conn.closed:
                return conn
        return None

    def give(self, origin: Origin, conn: _Connection) -> None:
        self._idle.setdefault(origin, []).append(conn)
        self._order[conn] = origin
        while len(self._order) > self._limit:
            old, old_origin = self._order.popitem(last=False)
            self._idle[old_origin].remove(old)
            old.close()

    def close_all(self) -> None:
        for conn in self._order:
            conn.close()
        self._order.clear()
        self._idle.clear()


@dataclass
class _Stall:
    """A node that did not answer in time: why, and its probe in flight."""

    reason: str
    probe: asyncio.Task[object] | None = None


class HttpClient:
    """HTTP/1.1 requests to agents: just what the agent protocol needs."""

    def __init__(self, timeout: float, idle_limit: int) -> None:
        self.timeout = timeout
        self.pool = _Pool(idle_limit)
        self._reads = ReadBuffer()  # for every connection of this client, on its one loop
        self.opened = 0  # connections opened so far (soft: for tests and benches)
        self._origins: dict[str, Origin] = {}
        self._ssl: ssl.SSLContext | None = None
        # https agents: (host, port) -> SHA-256 of the one certificate accepted
        self.pins: dict[tuple[str, int], bytes] = {}
        # (origin, node) -> why it is not waited for; one agent serves many
        # nodes (the simulated fleet all), so one silent node stalls only itself
        self.stalled: dict[tuple[Origin, str], _Stall] = {}

    def is_stalled(self, origin: Origin, node: str) -> bool:
        return (origin, node) in self.stalled

    def origin(self, base_url: str) -> Origin:
        origin = self._origins.get(base_url)
        if origin is None:
            origin = self._origins[base_url] = parse_base(base_url)
        return origin

    async def request(
        self,
        base_url: str,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        node: str = "",
        timeout: float | None = None,
        content_type: bytes = b"application/json",
    ) -> tuple[int, bytes]:
        """(status, body) of one request about ``node``; Unreachable when no
        usable answer came within ``timeout`` (the client's by default)."""
        origin = self.origin(base_url)
        limit = timeout or self.timeout
        stall = self.stalled.get((origin, node))
        if stall is not None:
            if stall.probe is None:
                wait = max(limit, PROBE_SECONDS)
                probe = self._probe(origin, node, method, path, body, wait, content_type)
                stall.probe = asyncio.ensure_future(probe)
            raise Unreachable(f"{stall.reason}; not waited for until it answers")
        try:
            return await self._request(origin, method, path, body, limit, content_type)
        except _TimedOut as exc:
            self.stalled[(origin, node)] = _Stall(str(exc))
            log.warning("agent at %s (node %s) stalled: %s", base_url, node or "-", exc)
            raise Unreachable(str(exc)) from None

    async def _probe(
        self,
        origin: Origin,
        node: str,
        method: str,
        path: str,
        body: bytes | None,
        limit: float,
        content_type: bytes,
    ) -> object:
        """Ask a stalled node once more, waiting up to ``limit``: any end but
        another timeout ends the stall, answered or not (a refused
        connection is quick to find again)."""
        key = (origin, node)
        try:
            await self._request(origin, method, path, body, limit, content_type)
        except _TimedOut:
            stall = self.stalled.get(key)
            if stall is not None:
                stall.probe = None  # the next request probes again
            return None
        except Unreachable:
            pass
        self.stalled.pop(key, None)
        return None

    async def _request(
        self,
        origin: Origin,
        method: str,
        path: str,
        body: bytes | None,
        limit: float,
        content_type: bytes,
    ) -> tuple[int, bytes]:
        # Bytes, and only the headers an agent reads: h11 validates each one.
        target = origin.prefix + path
        try:
            if body is None:
                headers = origin.bare_request.headers
                request = h11.Request(method=method, target=target, headers=headers)
            else:
                length = b"%d" % len(body)
                request = h11.Request(
                    method=method,
                    target=target,
                    headers=[
                        (b"Host", origin.host_bytes),
                        (b"User-Agent", USER_AGENT),
                        (b"Content-Type", content_type),
                        (b"Content-Length", length),
                    ],
                )
        except h11.LocalProtocolError as exc:
            raise Unreachable(f"cannot ask for {path!r}: {exc}") from None
        deadline = asyncio.get_running_loop().time() + limit
        conn = self.pool.take(origin)
        if conn is not None and conn.pin != self.pins.get((origin.host, origin.port)):
            conn.close()  # checked against a pin that has changed since
            conn = None
        if conn is not None:
            try:
                return await self._send(origin, conn, request, body, deadline, limit)
            except _StaleConnection:
                pass  # the agent closed an idle keep-alive connection: retry once, fresh
        conn = await self._connect(origin, deadline, limit)
        try:
            return await self._send(origin, conn, request, body, deadline, limit)
        except _StaleConnection as exc:
            raise Unreachable(f"connection closed by the agent: {exc}") from None

    async def _connect(self, origin: Origin, deadline: float, limit: float) -> _Connection:
        loop = asyncio.get_running_loop()
        context = None
        pin = None
        if origin.scheme == "https":
            pin = self.pins.get((origin.host, origin.port))
            if pin is None:
                # A job must never go to a peer whose certificate nobody pinned.
                raise Unreachable(
                    f"https agent {origin.host}:{origin.port} has no pinned certificate "
                    "(spec.agentCertSha256); nothing sent"
                )
            if self._ssl is None:
                self._ssl = client_context()
            context = self._ssl
        try:
            transport, conn = await asyncio.wait_for(
                loop.create_connection(
                    functools.partial(_Connection, self._reads),
                    origin.host,
                    origin.port,
                    ssl=context,
                ),
                max(deadline - loop.time(), 0.001),
            )
        except TimeoutError:
            raise _TimedOut(
                f"cannot connect to {origin.host}:{origin.port}: no answer within {limit:g}s"
            ) from None
        except (OSError, ssl.SSLError) as exc:
            raise Unreachable(f"cannot connect to {origin.host}:{origin.port}: {exc}") from None
        self.opened += 1
        if pin is not None:
            ssl_object = transport.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(True) if ssl_object is not None else None
            problem = pin_problem(der, pin)
            if problem:
                conn.close()
                raise PinMismatch(f"TLS {origin.host}:{origin.port}: {problem}; nothing sent")
            conn.pin = pin
        return conn

    async def _send(
        self,
        origin: Origin,
        conn: _Connection,
        request: h11.Request,
        body: bytes | None,
        deadline: float,
        limit: float,
    ) -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        # A timer instead of wait_for: wait_for costs a task per request.
        timer = loop.call_at(deadline, _time_out, conn, limit)
        done = False
        try:
            status, answer, reusable = await conn.exchange(request, body)
            done = True
        except h11.LocalProtocolError as exc:
            raise Unreachable(f"cannot send the request: {exc}") from None
        finally:
            timer.cancel()
            if not done:
                conn.close()
        if reusable and not conn.closed:
            self.pool.give(origin, conn)
        else:
            conn.close()
        return status, answer

    def close(self) -> None:
        for stall in self.stalled.values():
            if stall.probe is not None:
                stall.probe.cancel()
        self.stalled.clear()
        self.pool.close_all()


def _time_out(conn: _Connection, timeout: float) -> None:
    if conn.waiter is not None and not conn.waiter.done():
        conn.waiter.set_exception(_TimedOut(f"no answer within {timeout:g}s"))
    conn.close()
