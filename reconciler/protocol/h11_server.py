"""The HTTP/1.1 server core of the node agent (``node.http_server``) and of
the daemon's read API (``daemon.web_server``): asyncio protocols, with the
wire format from h11 (python-hyper's HTTP/1.1 state machine, the one
httpx's own stack is built on). Each server gives its numbers (``Limits``),
the look of its refusals (``Refusals``) and one handler, a route table
(``http_routes``); this module keeps every connection's life:

    connections     at most ``max_connections`` at once; at the cap, the
                    connection that has waited longest for a whole request
                    (idle, or its request still incomplete) is closed to
                    make room, else the new one is closed at once: a flood
                    of one-byte connections gives way to real clients
    head + body     must arrive within ``request_timeout`` of their first
                    byte; bytes do not extend it (a slowloris gets 408)
    idle            a keep-alive connection with no request for
                    ``idle_timeout`` is closed
    size            a head over ``max_head_bytes``: 431; what else a server
                    refuses before the body (``Refusals.admit``); a body is
                    kept, or read and dropped, up to ``max_body_bytes``, and
                    past that answered at once and the connection closed
    memory          one request at a time per connection: reading pauses
                    while a request is handled or while answers wait in the
                    write buffer above ``write_high_water``, so a client
                    that pipelines and never reads holds bounded memory
    event streams   (``StreamLimits``) at most ``max_streams``, and
                    ``max_streams_per_client`` from one address: a new one
                    closes that client's oldest at its share, or with every
                    slot taken the oldest of the client holding most; a
                    stream whose unsent bytes pass ``buffer``, or whose
                    oldest unsent byte waited ``stall`` seconds (kernel queue
                    included), is dropped; a comment line every
                    ``keepalive`` seconds finds a vanished reader

A handler takes a ``Request`` and returns a ``Response`` (answered at
once), a ``Stream`` (an event stream, fed by ``Server.broadcast``) or an
awaitable of a ``Response`` (a long poll: answered when it completes,
cancelled if the client goes away). ``Response.drop`` closes the
connection without answering, as a crashed or overloaded peer would. A
HEAD request is answered with the head of what its handler returns.

Every request goes through h11, the same for every client: what the daemon
sends and what an attacker sends are parsed by one parser.

Must not: route, or know what a path means; that is the handler's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import functools
import json
import socket
import ssl
import struct
import termios
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from http import HTTPStatus

import h11

from reconciler.protocol.read_buffer import ReadBuffer

REASONS = {s.value: s.phrase.encode("latin-1") for s in HTTPStatus}
JSON_HEADERS: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
_END = h11.EndOfMessage()


class Request:
    """One request as a handler sees it: ``path`` and ``query`` (the text
    after ``?``, undecoded; "" when none) apart, ``headers`` by lower-case
    name, ``peer`` the client's address."""

    __slots__ = ("_headers", "_raw_headers", "body", "method", "path", "peer", "query")

    def __init__(
        self,
        method: str,
        path: str,
        body: bytes,
        query: str = "",
        *,
        headers: Mapping[str, str] | None = None,
        raw_headers: Iterable[tuple[bytes, bytes]] = (),
        peer: str = "",
    ) -> None:
        self.method = method
        self.path = path
        self.body = body
        self.query = query
        self.peer = peer
        self._headers = headers
        self._raw_headers = raw_headers

    @property
    def headers(self) -> Mapping[str, str]:
        # Decoded when first asked: most agent requests never are.
        if self._headers is None:
            self._headers = {
                name.decode("latin-1"): value.decode("latin-1") for name, value in self._raw_headers
            }
        return self._headers


class Response:
    """An answer: ``Content-Length`` is added, and ``Connection: close``
    when ``close``; ``drop`` closes without answering."""

    __slots__ = ("body", "close", "drop", "headers", "status")

    def __init__(
        self,
        status: int,
        body: bytes = b"",
        headers: tuple[tuple[str, str], ...] = JSON_HEADERS,
        *,
        close: bool = False,
        drop: bool = False,
    ) -> None:
        self.status = status
        self.body = body
        self.headers = headers
        self.close = close
        self.drop = drop


@dataclasses.dataclass(frozen=True)
class Stream:
    """Answer with an event stream: these headers and opening bytes, then
    every frame broadcast from now on."""

    headers: tuple[tuple[str, str], ...]
    opening: bytes


Answer = Response | Stream | Awaitable[Response]
Handler = Callable[[Request], Answer]


@dataclasses.dataclass(frozen=True)
class Limits:
    max_head_bytes: int
    max_connections: int
    request_timeout: float  # seconds from a request's first byte to its last
    idle_timeout: float  # seconds a keep-alive connection may sit unused
    sweep_interval: float  # seconds between checks of the deadlines
    backlog: int
    max_body_bytes: int = 1024 * 1024
    keep_bodies: bool = True  # False: bodies are read and dropped
    send_continue: bool = True  # answer ``Expect: 100-continue``
    write_high_water: int = 256 * 1024  # bytes of unsent answers before reading pauses


@dataclasses.dataclass(frozen=True)
class StreamLimits:
    max_streams: int
    max_streams_per_client: int
    buffer: int  # bytes unsent on a stream before it is dropped
    stall: float  # seconds a stream's oldest unsent byte may wait
    keepalive: float  # seconds between comment lines


def _admit_all(head: h11.Request) -> tuple[int, str] | None:
    return None


def _described(exc: h11.RemoteProtocolError) -> str:
    return str(exc) or "not a valid HTTP/1.1 request"


@dataclasses.dataclass(frozen=True)
class Refusals:
    """How a server refuses: the headers of a closing refusal (its body is
    ``{"error": "bad_request", "message": ...}``), the answer when a
    handler fails, what it refuses from a head alone (status and message,
    or None), and the words for a request h11 cannot parse."""

    headers: tuple[tuple[str, str], ...]
    failure: Response
    admit: Callable[[h11.Request], tuple[int, str] | None] = _admit_all
    describe: Callable[[h11.RemoteProtocolError], str] = _described


@functools.lru_cache(maxsize=1024)
def _head(
    status: int, headers: tuple[tuple[str, str], ...], length: int, close: bool
) -> h11.Response:
    """A response head; h11 events are values, so each distinct head is
    built (and its headers validated) once, not once per answer."""
    fields = [*headers, ("Content-Length", str(length))]
    if close:
        fields.append(("Connection", "close"))
    return _response_head(status, fields)


def _response_head(
    status: int, headers: list[tuple[bytes, bytes]] | list[tuple[str, str]]
) -> h11.Response:
    """An answer's head with the standard reason phrase (``200 OK``): h11
    writes an empty one unless given it."""
    return h11.Response(status_code=status, headers=headers, reason=REASONS.get(status, b""))


def _head_size(headers: Iterable[tuple[bytes, bytes]]) -> int:
    """A parsed head's size as sent, near enough: h11 bounds only a head
    still incomplete, and one read can hold a whole large one."""
    return sum(len(name) + len(value) + 4 for name, value in headers)


def _closing_refusal(status: int, body: bytes, headers: Iterable[tuple[str, str]]) -> bytes:
    """An error answer written past h11, then the connection closes: after
    a framing error h11 sends nothing more, and nothing that follows on
    the connection can be trusted."""
    reason = REASONS.get(status, b"Error")
    fields = "".join(f"{name}: {value}\r\n" for name, value in headers).encode("latin-1")
    return b"HTTP/1.1 %d %s\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (
        status,
        reason,
        fields,
        len(body),
        body,
    )


def shown_address(host: str, port: int) -> str:
    """``HOST:PORT``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _kernel_unsent(transport: asyncio.Transport) -> int:
    """Bytes in the socket's send queue, not yet taken by the peer (Linux's
    SIOCOUTQ); 0 where that cannot be asked."""
    sock = transport.get_extra_info("socket")
    try:
        answer = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (AttributeError, OSError, ValueError):
        return 0
    return int(struct.unpack("i", answer)[0])


class Connection(asyncio.BufferedProtocol):
    """One client connection: h11 parses, this class keeps the limits."""

    __slots__ = (
        "body",
        "body_read",
        "busy",
        "conn",
        "deadline",
        "head",
        "limits",
        "next_keepalive",
        "paused_for_writes",
        "peer",
        "reading_paused",
        "server",
        "started",
        "stream_started",
        "streaming",
        "task",
        "transport",
        "unsent",
        "waiting_since",
        "written",
    )

    def __init__(self, server: Server) -> None:
        self.server = server
        self.limits = server.limits
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_head_bytes)
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Future[Response] | None = None
        self.peer = ""
        # When the current wait ends, and when it began (clock time); checked
        # by the server's sweep, which costs less per request than a timer.
        self.deadline = 0.0
        self.waiting_since = 0.0
        self.reading_paused = False
        self.paused_for_writes = False
        self.head: h11.Request | None = None
        self.body: list[bytes] = []
        self.body_read = 0
        self.busy = False  # a request is being handled
        self.started = False  # bytes of the current request have arrived
        self.streaming = False  # answering with an event stream
        self.stream_started = 0.0
        self.next_keepalive = 0.0
        # an event stream's bytes written so far, and (total after a write,
        # when) for each write not known to have left yet
        self.written = 0
        self.unsent: deque[tuple[int, float]] = deque()

    # -- asyncio callbacks --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        server = self.server
        if len(server.connections) >= server.max_connections and not server.evict_idle():
            transport.abort()  # over the cap, with every connection busy
            return
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if isinstance(peer, tuple) else ""
        server.connections.add(self)
        transport.set_write_buffer_limits(high=self.limits.write_high_water)
        self._wait_for(self.limits.idle_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.server.streams.discard(self)
        if self.task is not None:
            self.task.cancel()
        self.transport = None

    def pause_writing(self) -> None:
        # The client does not read its answers: stop reading its requests.
        if not self.streaming:
            self.paused_for_writes = True
            self._pause_reading()

    def resume_writing(self) -> None:
        self.paused_for_writes = False
        if not self.busy and not self.streaming:
            self._resume_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.server.reads.view

    def buffer_updated(self, nbytes: int) -> None:
        data = self.server.reads.take(nbytes)
        if self.streaming:
            return  # nothing more is read from a stream's client
        if not self.started:
            # The first byte of a request starts its deadline; later bytes do not move it.
            self.started = True
            self._wait_for(self.limits.request_timeout)
        try:
            self.conn.receive_data(data)
        except h11.RemoteProtocolError as exc:
            self._fail(exc)
            return
        self._process()

    def eof_received(self) -> bool | None:
        return None  # the client is gone: close our side too

    def _pause_reading(self) -> None:
        if self.transport is not None and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.transport is not None and self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()

    # -- requests -----------------------------------------------------------------

    def _process(self) -> None:
        while self.transport is not None and not self.busy and not self.streaming:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                self._fail(exc)
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                if (
                    event is h11.NEED_DATA
                    and len(self.conn.trailing_data[0]) > self.limits.max_head_bytes
                ):
                    self._refuse(431, "request headers too large")
                return
            if isinstance(event, h11.Request):
                if not self._admit(event):
                    return
                self.head, self.body, self.body_read = event, [], 0
            elif isinstance(event, h11.Data) and self.head is not None:
                self.body_read += len(event.data)
                if self.limits.keep_bodies:
                    self.body.append(event.data)
                if self.body_read > self.limits.max_body_bytes:
                    self._handle()  # too much to read: answer now, then close
                    self._close()
                    return
            elif isinstance(event, h11.EndOfMessage) and self.head is not None:
                self._handle()
                if not self.started:
                    return  # answered, and nothing of a next request has come yet
            elif isinstance(event, h11.ConnectionClosed):
                self._close()
                return

    def _admit(self, head: h11.Request) -> bool:
        """Refuse, before any body is read, what this server never accepts."""
        if _head_size(head.headers) > self.limits.max_head_bytes:
            self._refuse(431, "request headers too large")
            return False
        refused = self.server.refusals.admit(head)
        if refused is not None:
            self._refuse(*refused)
            return False
        if (
            self.limits.send_continue
            and self.conn.they_are_waiting_for_100_continue
            and self.transport is not None
        ):
            self.transport.write(self.conn.send(_CONTINUE) or b"")
        return True

    def _handle(self) -> None:
        head = self.head
        assert head is not None
        self.head = None
        body = b"".join(self.body)
        self.body = []
        self.busy = True  # the whole request is in: its deadline no longer applies
        path, _, query = head.target.partition(b"?")
        request = Request(
            head.method.decode("ascii", "replace"),
            path.decode("latin-1"),
            body,
            query.decode("latin-1"),
            raw_headers=head.headers,
            peer=self.peer,
        )
        head_only = head.method == b"HEAD"
        try:
            result = self.server.handler(request)
        except Exception as exc:  # a handler bug answers 500, the server lives on
            self.server.log_error(exc)
            result = self.server.refusals.failure
        if isinstance(result, Response):
            self._answer(result, head_only)
        elif isinstance(result, Stream):
            self._start_stream(result)
        else:
            # One request at a time: pipelined ones wait in the socket meanwhile.
            self._pause_reading()
            task = asyncio.ensure_future(result)
            self.task = task
            task.add_done_callback(functools.partial(self._finished, head_only=head_only))

    def _finished(self, task: asyncio.Future[Response], *, head_only: bool) -> None:
        self.task = None
        if task.cancelled() or self.transport is None:
            return
        exc = task.exception()
        if exc is not None:
            self.server.log_error(exc)
            response = self.server.refusals.failure
        else:
            response = task.result()
        self._answer(response, head_only)
        self._process()  # requests that arrived meanwhile

    def _answer(self, response: Response, head_only: bool) -> None:
        transport = self.transport
        if transport is None:
            return
        if response.drop:
            transport.abort()
            return
        try:
            head = _head(response.status, response.headers, len(response.body), response.close)
            data = self.conn.send(head) or b""
            if not head_only:
                data += self.conn.send(h11.Data(data=response.body)) or b""
            data += self.conn.send(_END) or b""
        except h11.LocalProtocolError:
            self._close()
            return
        transport.write(data)
        self._next_cycle()

    def _next_cycle(self) -> None:
        """Ready the connection for its next request, or close it."""
        self.busy = False
        conn = self.conn
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is not h11.DONE:
            self._close()
            return
        try:
            conn.start_next_cycle()
        except h11.LocalProtocolError:
            self._close()
            return
        # Bytes of the next request already here: its deadline starts now.
        self.started = bool(conn.trailing_data[0])
        self._wait_for(self.limits.request_timeout if self.started else self.limits.idle_timeout)
        if self.reading_paused and not self.paused_for_writes:
            self._resume_reading()

    # -- event streams ------------------------------------------------------------

    def _start_stream(self, stream: Stream) -> None:
        transport = self.transport
        if transport is None:
            return
        server = self.server
        server.make_room_for_stream(self.peer)
        try:
            data = self.conn.send(_response_head(200, list(stream.headers))) or b""
            data += self.conn.send(h11.Data(data=stream.opening)) or b""
        except h11.LocalProtocolError:
            self._close()
            return
        self.busy = False
        self.streaming = True
        self._pause_reading()
        self.stream_started = server.clock()
        self._write_stream(transport, data)
        server.streams.add(self)
        self.next_keepalive = self.stream_started + server.stream_limits.keepalive

    def send_event(self, frame: bytes) -> None:
        """Write one frame; a reader that lets ``buffer`` bytes pile up is dropped."""
        transport = self.transport
        if transport is None:
            return
        if transport.get_write_buffer_size() + len(frame) > self.server.stream_limits.buffer:
            self.server.dropped += 1
            transport.abort()
            return
        try:
            self._write_stream(transport, self.conn.send(h11.Data(data=frame)) or b"")
        except h11.LocalProtocolError:
            self._close()

    def _write_stream(self, transport: asyncio.Transport, data: bytes) -> None:
        transport.write(data)
        self.written += len(data)
        self.unsent.append((self.written, self.server.clock()))

    def stalled(self, now: float) -> bool:
        """Has a byte written to this stream waited unsent longer than
        ``stall``? Bytes in the kernel's send queue count as unsent: a
        reader that stopped reading shuts its window, and they stay there."""
        transport = self.transport
        if transport is None:
            return False
        left = self.written - transport.get_write_buffer_size() - _kernel_unsent(transport)
        unsent = self.unsent
        while unsent and unsent[0][0] <= left:
            unsent.popleft()
        return bool(unsent) and now - unsent[0][1] > self.server.stream_limits.stall

    # -- endings and deadlines ----------------------------------------------------

    def _fail(self, exc: h11.RemoteProtocolError) -> None:
        self._refuse(exc.error_status_hint, self.server.refusals.describe(exc))

    def _refuse(self, status: int, message: str) -> None:
        """Answer an error and close: after a framing error nothing that
        follows on this connection can be trusted."""
        transport = self.transport
        if transport is None:
            return
        body = json.dumps({"error": "bad_request", "message": message}).encode("utf-8")
        transport.write(_closing_refusal(status, body, self.server.refusals.headers))
        self._close()

    def _close(self, *, abort: bool = False) -> None:
        transport = self.transport
        if transport is not None:
            self.transport = None
            self.server.connections.discard(self)
            self.server.streams.discard(self)
            if abort:
                transport.abort()  # what is unsent will never be read
            else:
                transport.close()

    def tick(self, now: float) -> None:
        """Deadlines: a request not complete, an idle connection; on an
        event stream, a stalled reader or a keepalive due."""
        if self.streaming:
            if self.stalled(now):
                self.server.dropped += 1
                self._close(abort=True)
            elif now >= self.next_keepalive:
                self.next_keepalive = now + self.server.stream_limits.keepalive
                self.send_event(b": keepalive\n\n")
            return
        if self.busy or now < self.deadline:
            return  # a busy one waits on its handler; the client waits for the answer
        if self.started:
            self._refuse(408, "request not complete in time")
        else:
            self._close()

    def _wait_for(self, seconds: float) -> None:
        now = self.server.clock()
        self.deadline = now + seconds
        self.waiting_since = now


_CONTINUE = h11.InformationalResponse(status_code=100, headers=[], reason=REASONS[100])


class Server:
    """Serves ``handler`` within ``limits``, on the running event loop,
    from ``start`` to ``close``; event streams only with ``stream_limits``."""

    def __init__(
        self,
        handler: Handler,
        limits: Limits,
        refusals: Refusals,
        *,
        stream_limits: StreamLimits | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.handler = handler
        self.limits = limits
        self.refusals = refusals
        self.stream_limits = stream_limits or StreamLimits(0, 0, 0, 0.0, 0.0)
        self.tls = tls  # HTTPS when set
        self.connections: set[Connection] = set()
        self.streams: set[Connection] = set()
        self.dropped = 0  # event streams dropped for not reading
        self.evicted = 0  # event streams closed to make room for a newer one
        self.reads = ReadBuffer()  # for every connection, all on the loop that serves
        self.clock = time.monotonic  # the clock of deadlines
        self._on_error = on_error
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def max_connections(self) -> int:
        return self.limits.max_connections

    @max_connections.setter
    def max_connections(self, value: int) -> None:
        """A new cap, for connections from now on."""
        self.limits = dataclasses.replace(self.limits, max_connections=value)

    def log_error(self, exc: BaseException) -> None:
        if self._on_error is not None:
            self._on_error(exc)

    async def start(
        self, host: str | None = None, port: int = 0, *, sock: socket.socket | None = None
    ) -> tuple[str, int]:
        """Listen on ``host:port`` (port 0: the system picks one), or on
        ``sock``, a bound socket; the address served. OSError when it cannot."""
        loop = asyncio.get_running_loop()
        backlog = self.limits.backlog
        if sock is not None:
            self._server = await loop.create_server(
                self._connection, sock=sock, backlog=backlog, ssl=self.tls
            )
        else:
            self._server = await loop.create_server(
                self._connection, host, port, backlog=backlog, reuse_address=True, ssl=self.tls
            )
        self._sweeper = asyncio.ensure_future(self._sweep())
        sockname = self._server.sockets[0].getsockname()
        return sockname[0], sockname[1]

    def _connection(self) -> Connection:
        return Connection(self)

    async def _sweep(self) -> None:
        """End the waits that are over: several times a second, so a deadline
        is kept to within ``sweep_interval``."""
        while True:
            await asyncio.sleep(self.limits.sweep_interval)
            now = self.clock()
            for conn in [c for c in self.connections if c.deadline <= now or c.streaming]:
                conn.tick(now)

    def stop(self) -> None:
        """Stop listening and close every connection, at once."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
            for conn in list(self.connections):
                conn._close()

    async def close(self) -> None:
        """``stop``, then wait for the listening socket to close."""
        self.stop()
        if self._server is not None:
            await self._server.wait_closed()

    def evict_idle(self) -> bool:
        """Close the connection that has waited longest for a whole request
        (idle, or its request still incomplete) to make room; False if
        every connection is busy or streaming. A client that sends its
        request at once is never the longest waiting, whatever slow ones send."""
        waiting = [c for c in self.connections if not c.busy and not c.streaming]
        if not waiting:
            return False
        min(waiting, key=lambda c: c.waiting_since)._close()
        return True

    def make_room_for_stream(self, peer: str) -> None:
        """Close one stream when a new one from ``peer`` would pass a cap:
        ``peer``'s oldest when it holds its share, else, with every slot
        taken, the oldest of the client that holds the most. A client that
        opens streams and never reads them holds its share at most, and a
        new reader always gets in."""
        limits = self.stream_limits
        mine = [c for c in self.streams if c.peer == peer]
        if len(mine) >= limits.max_streams_per_client:
            candidates = mine
        elif len(self.streams) >= limits.max_streams:
            held = Counter(c.peer for c in self.streams)
            most = max(held.values())
            candidates = [c for c in self.streams if held[c.peer] == most]
        else:
            return
        self.evicted += 1
        min(candidates, key=lambda c: c.stream_started)._close()

    def broadcast(self, frames: Iterable[bytes]) -> None:
        """Write ``frames`` to every event stream."""
        frames = list(frames)
        for conn in list(self.streams):
            for frame in frames:
                conn.send_event(frame)


__all__ = [
    "Answer",
    "Handler",
    "Limits",
    "Refusals",
    "Request",
    "Response",
    "Server",
    "Stream",
    "StreamLimits",
    "shown_address",
]
