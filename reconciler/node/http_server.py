"""The HTTP/1.1 server of the node agent and the simulated fleet, on asyncio
protocols, with the wire format from h11 (python-hyper's HTTP/1.1 state
machine, the one httpx's own stack is built on): JSON in and out,
keep-alive, Content-Length bodies only.

Why not ``http.server`` or a framework: a thread per connection caps a
simulated fleet at a few hundred requests per second, and the agent must
hold its ground against whoever can reach its port. h11 parses and
validates (duplicate or malformed ``Content-Length``, header size, request
line); this module adds the limits an exposed server needs:

    connections     at most ``max_connections`` at once; at the cap, the
                    connection that has waited longest for its next request
                    (idle, or with a request still incomplete) is closed to
                    make room, else the new one is closed at once: a flood of
                    one-byte connections gives way to the daemon's own
    head + body     must arrive within ``request_timeout`` of their first
                    byte; bytes do not extend it (a slowloris is cut off)
    idle            a keep-alive connection with no request for
                    ``idle_timeout`` is closed
    size            head over MAX_HEAD_BYTES: 431; body over MAX_BODY_BYTES:
                    413; chunked bodies: 411, and the connection closes
    memory          one request at a time per connection: reading pauses
                    while a request is handled or while the answers wait in
                    the write buffer above its high-water mark, so a client
                    that pipelines and never reads holds bounded memory

A handler takes a ``Request`` and returns a ``Response`` (answered at once)
or an awaitable of one (answered when it completes; cancelled if the client
goes away). ``Response.drop`` closes the connection without answering, as
a crashed or overloaded peer would.

Every request goes through h11, the same for every client: there is no
reading of our own beside it, so what the daemon sends and what an attacker
sends are parsed by one parser, and answered the same way.

Must not know anything about jobs or nodes: routing is the handler's.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any

import h11

from reconciler.protocol.h11_serving import (
    closing_refusal,
    continue_head,
    head_size,
    next_request,
    response_head,
    shown_address,
    whole_answer,
)
from reconciler.protocol.read_buffer import ReadBuffer
from reconciler.spec.errors import ReconcilerError

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 1024 * 1024
MAX_CONNECTIONS = 512  # well under the usual 1,024 descriptors, so accept never fails
REQUEST_TIMEOUT = 10.0  # seconds from a request's first byte to its last
IDLE_TIMEOUT = 120.0  # seconds a keep-alive connection may sit unused
WRITE_HIGH_WATER = 256 * 1024  # bytes of unsent answers before reading pauses
BACKLOG = 256
SWEEP_INTERVAL = 0.25  # seconds between checks of the deadlines


class Request:
    __slots__ = ("body", "method", "path", "query")

    def __init__(self, method: str, path: str, body: bytes, query: str = "") -> None:
        self.method = method
        self.path = path
        self.body = body
        self.query = query  # the text after ``?``, undecoded; "" when none


class Response:
    __slots__ = ("body", "close", "drop", "status")

    def __init__(
        self, status: int, body: bytes = b"", *, close: bool = False, drop: bool = False
    ) -> None:
        self.status = status
        self.body = body
        self.close = close
        self.drop = drop


Handler = Callable[[Request], "Response | Awaitable[Response]"]


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # built once


def json_response(status: int, data: Any) -> Response:
    return Response(status, _ENCODER.encode(data).encode("utf-8"))


def error_response(status: int, code: str, message: str) -> Response:
    """The protocol's error shape: ``{"error": CODE, "message": TEXT}``."""
    return json_response(status, {"error": code, "message": message})


@functools.lru_cache(maxsize=1024)
def _head(status: int, length: int, close: bool) -> h11.Response:
    """A response head; h11 events are values, so each distinct head is
    built (and its headers validated) once, not once per answer."""
    headers = [(b"Content-Type", b"application/json"), (b"Content-Length", b"%d" % length)]
    if close:
        headers.append((b"Connection", b"close"))
    return response_head(status, headers)


class _Connection(asyncio.BufferedProtocol):
    """One client connection: h11 parses, this class enforces the limits."""

    __slots__ = (
        "body",
        "busy",
        "conn",
        "deadline",
        "head",
        "paused_for_writes",
        "reading_paused",
        "server",
        "started",
        "task",
        "transport",
        "waiting_since",
    )

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Future[Response] | None = None
        # When the current wait ends (loop time); checked by the server's sweep,
        # which costs less per request than a timer handle.
        self.deadline = 0.0
        self.reading_paused = False
        self.head: h11.Request | None = None
        self.body: list[bytes] = []
        self.busy = False  # a request is being handled
        self.started = False  # bytes of the current request have arrived
        self.paused_for_writes = False
        # When the current wait for a request (or its rest) began: at the
        # cap, the longest waiting gives way first.
        self.waiting_since = 0.0

    # -- asyncio callbacks --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        server = self.server
        if len(server.connections) >= server.max_connections and not server.evict_idle():
            transport.abort()  # over the cap, with every connection busy
            self.transport = None
            return
        server.connections.add(self)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self._wait_for(server.idle_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self.task is not None:
            self.task.cancel()
        self.transport = None

    def pause_writing(self) -> None:
        # The client does not read its answers: stop reading its requests.
        self.paused_for_writes = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self.paused_for_writes = False
        if not self.busy:
            self._resume_reading()

    def _pause_reading(self) -> None:
        if self.transport is not None and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.transport is not None and self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.server.reads.view

    def buffer_updated(self, nbytes: int) -> None:
        data = self.server.reads.take(nbytes)
        if not self.started:
            # The first byte of a request starts its deadline; later bytes do not move it.
            self.started = True
            self._wait_for(self.server.request_timeout)
        try:
            self.conn.receive_data(data)
        except h11.RemoteProtocolError as exc:
            self._fail(exc)
            return
        self._process()

    def eof_received(self) -> bool | None:
        return None  # the client is gone: close our side too

    # -- requests -----------------------------------------------------------------

    def _process(self) -> None:
        while self.transport is not None and not self.busy:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                self._fail(exc)
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                if event is h11.NEED_DATA and len(self.conn.trailing_data[0]) > MAX_HEAD_BYTES:
                    self._refuse(431, "request headers too large")
                return
            if isinstance(event, h11.Request):
                if not self._admit(event):
                    return
                self.head = event
                self.body = []
            elif isinstance(event, h11.Data):
                self.body.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._handle()
                if not self.started:
                    return  # answered, and nothing of a next request has come yet
            elif isinstance(event, h11.ConnectionClosed):
                self._close()
                return

    def _admit(self, head: h11.Request) -> bool:
        """Refuse, before any body is read, what this server never accepts."""
        if head_size(head.headers) > MAX_HEAD_BYTES:
            self._refuse(431, "request headers too large")
            return False
        length = None
        for name, value in head.headers:
            if name == b"transfer-encoding":
                self._refuse(411, "chunked request bodies are not supported; send Content-Length")
                return False
            if name == b"content-length":
                length = int(value)  # h11 checked it is digits and the only value
        if length is not None and length > MAX_BODY_BYTES:
            self._refuse(413, f"request body over {MAX_BODY_BYTES} bytes")
            return False
        if self.conn.they_are_waiting_for_100_continue and self.transport is not None:
            self.transport.write(self.conn.send(continue_head()) or b"")
        return True

    def _handle(self) -> None:
        head = self.head
        assert head is not None
        body = b"".join(self.body)
        self.body = []
        self._dispatch(head.method, head.target, body)

    def _dispatch(self, method: bytes, target: bytes, body: bytes) -> None:
        self.busy = True  # the whole request is in: its deadline no longer applies
        path, _, query = target.partition(b"?")
        request = Request(
            method.decode("ascii", "replace"),
            path.decode("latin-1"),
            body,
            query.decode("latin-1"),
        )
        try:
            result = self.server.handler(request)
        except Exception as exc:  # a handler bug answers 500, the server lives on
            self.server.log_error(exc)
            result = error_response(500, "internal", "the server failed on this request")
        if isinstance(result, Response):
            self._answer(result)
        else:
            # One request at a time: pipelined ones wait in the socket meanwhile.
            self._pause_reading()
            task = asyncio.ensure_future(result)
            self.task = task
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Future[Response]) -> None:
        self.task = None
        if task.cancelled() or self.transport is None:
            return
        exc = task.exception()
        if exc is not None:
            self.server.log_error(exc)
            response = error_response(500, "internal", "the server failed on this request")
        else:
            response = task.result()
        self._answer(response)
        self._process()  # requests that arrived meanwhile

    def _answer(self, response: Response) -> None:
        transport = self.transport
        if transport is None:
            return
        if response.drop:
            transport.abort()
            return
        head = _head(response.status, len(response.body), response.close)
        data = whole_answer(self.conn, head, response.body)
        if data is None:
            self._close()
            return
        transport.write(data)
        self._next_cycle()

    def _next_cycle(self) -> None:
        self.busy = False
        self.head = None
        started = next_request(self.conn)
        if started is None:
            self._close()
            return
        self.started = started
        self._wait_for(self.server.request_timeout if self.started else self.server.idle_timeout)
        if self.reading_paused and not self.paused_for_writes:
            self._resume_reading()

    # -- endings --------------------------------------------------------------------

    def _fail(self, exc: h11.RemoteProtocolError) -> None:
        status = exc.error_status_hint
        if status == 400 and "Content-Length" in str(exc):
            message = f"bad Content-Length: {exc}"
        else:
            message = str(exc) or "not a valid HTTP/1.1 request"
        self._refuse(status, message)

    def _refuse(self, status: int, message: str) -> None:
        """Answer an error and close: after a framing error nothing that
        follows on this connection can be trusted."""
        transport = self.transport
        if transport is None:
            return
        body = json.dumps({"error": "bad_request", "message": message}).encode("utf-8")
        transport.write(closing_refusal(status, body, [("Content-Type", "application/json")]))
        self._close()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
            self.server.connections.discard(self)

    def time_out(self) -> None:
        if self.busy:
            return  # the handler's own time; the client waits for the answer
        if self.started:
            self._refuse(408, "request not complete in time")
        else:
            self._close()

    def _wait_for(self, seconds: float) -> None:
        now = self.server.loop_time()
        self.deadline = now + seconds
        self.waiting_since = now

    @property
    def idle(self) -> bool:
        return not self.busy and not self.started


class HttpServer:
    """Serve ``handler`` on ``host:port`` (port 0: the OS picks one), or on
    ``sock``, a bound socket handed over (``node.activation``)."""

    def __init__(
        self,
        handler: Handler,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        on_error: Callable[[BaseException], None] | None = None,
        tls: ssl.SSLContext | None = None,
        max_connections: int = MAX_CONNECTIONS,
        request_timeout: float = REQUEST_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
        backlog: int = BACKLOG,
        sock: socket.socket | None = None,
    ) -> None:
        self.handler = handler
        self.sock = sock
        self.host = host
        self.port = port
        self.tls = tls  # HTTPS when set
        self.max_connections = max_connections
        self.backlog = backlog
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        self.connections: set[_Connection] = set()
        self.reads = ReadBuffer()  # for every connection, all on the loop that serves
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._on_error = on_error
        self.loop_time = time.monotonic  # the clock of deadlines

    async def _sweep(self) -> None:
        """End the waits that are over: several times a second, so a deadline
        is kept to within SWEEP_INTERVAL."""
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            now = self.loop_time()
            for conn in [c for c in self.connections if c.deadline <= now]:
                conn.time_out()

    def log_error(self, exc: BaseException) -> None:
        if self._on_error is not None:
            self._on_error(exc)

    def evict_idle(self) -> bool:
        """Close the connection that has waited longest for a whole request
        (idle, or its request still incomplete) to make room; False if
        every connection is busy. A connection that sends its request at
        once is never the longest waiting, whatever a slow one sends."""
        waiting = [c for c in self.connections if not c.busy]
        if not waiting:
            return False
        min(waiting, key=lambda c: c.waiting_since)._close()
        return True

    async def start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        connection = functools.partial(_Connection, self)
        if self.sock is not None:
            self._server = await loop.create_server(
                connection, sock=self.sock, backlog=self.backlog, ssl=self.tls
            )
        else:
            try:
                self._server = await loop.create_server(
                    connection,
                    self.host,
                    self.port,
                    backlog=self.backlog,
                    reuse_address=True,
                    ssl=self.tls,
                )
            except OSError as exc:
                raise ReconcilerError(
                    f"cannot listen on {shown_address(self.host, self.port)}: "
                    f"{os.strerror(exc.errno) if exc.errno else exc}",
                    hint="stop what holds that port, or pass another --listen",
                ) from None
        sockname = self._server.sockets[0].getsockname()
        self.host, self.port = sockname[0], sockname[1]
        self._sweeper = asyncio.ensure_future(self._sweep())
        return self.host, self.port

    @property
    def address(self) -> str:
        return shown_address(self.host, self.port)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
            for conn in list(self.connections):
                if conn.transport is not None:
                    conn.transport.close()
            await self._server.wait_closed()


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port); ValueError otherwise."""
    host, sep, port = text.rpartition(":")
    if (
        not sep
        or not host
        or not (port.isascii() and port.isdigit())
        or not 0 <= int(port) <= 65535
    ):
        raise ValueError(f"listen address must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)
