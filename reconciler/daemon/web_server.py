"""The HTTP/1.1 server of ``run --http`` (docs/web.md): asyncio protocols in
a thread of their own, with the wire format from h11, the library the
agent's server and httpx are built on. It answers GET requests from what
``web_routes`` says, and keeps the event streams.

The daemon's pass never waits for it: ``publish`` hands a view over with
``call_soon_threadsafe`` and returns; the answers and events are made in
this server's thread. Its limits, so that no client can hold the daemon:

    connections  at most ``max_connections`` at once (descriptors stay
                 well under the process's limit); at the cap the
                 connection that has waited longest for a whole request
                 (idle, or its request still incomplete) is closed to make
                 room, so slow clients cannot lock out others; with only
                 event streams open the new one is closed at once
    requests     a head must arrive within ``request_timeout`` of its first
                 byte, and over ``MAX_HEAD_BYTES`` is refused; bodies are
                 refused (this server only reads)
    idle         a keep-alive connection with no request for
                 ``idle_timeout`` is closed
    writes       reading pauses while answers wait in the write buffer;
                 an event stream whose unsent bytes pass
                 ``stream_buffer``, or whose oldest unsent byte waited
                 ``stream_stall`` seconds (in our buffer or the kernel's),
                 is dropped, and every stream gets a comment line every
                 ``keepalive`` seconds, so a stalled or vanished reader is
                 found even when nothing happens
    streams      at most ``max_streams``, and ``max_streams_per_client``
                 from one client address; a new stream closes that
                 client's oldest at its share, or with every slot taken
                 the oldest of the client holding most, so streams that
                 are never read cannot lock the page out

Must not: read Git, or decide anything; routing and access are ``web_routes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import termios
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import h11

from reconciler.daemon.web_routes import Reply, Routes, Stream
from reconciler.protocol.h11_serving import (
    closing_refusal,
    head_size,
    next_request,
    response_head,
    shown_address,
    whole_answer,
)
from reconciler.text.web_answers import StatusView

MAX_HEAD_BYTES = 16 * 1024
MAX_CONNECTIONS = 256
MAX_DROPPED_BODY = 1024 * 1024  # bytes of a refused method's body read and dropped
READ_METHODS = (b"GET", b"HEAD")
REQUEST_TIMEOUT = 10.0  # seconds from a request's first byte to its last
IDLE_TIMEOUT = 60.0  # seconds a keep-alive connection may sit unused
WRITE_HIGH_WATER = 256 * 1024  # bytes unsent before reading pauses
STREAM_BUFFER = 1024 * 1024  # bytes unsent on an event stream before it is dropped
STREAM_STALL = 30.0  # seconds an event stream's oldest unsent byte may wait
KEEPALIVE = 15.0  # seconds between comment lines on an event stream
SWEEP_INTERVAL = 0.5  # seconds between checks of the deadlines
BACKLOG = 128


class _Connection(asyncio.Protocol):
    """One client: h11 parses, this class keeps the limits."""

    def __init__(self, server: WebServer) -> None:
        self.server = server
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.deadline = 0.0
        self.waiting_since = 0.0  # when it last began waiting for a request
        self.started = False  # bytes of a request have arrived
        self.streaming = False  # answering with an event stream
        self.next_keepalive = 0.0
        self.stream_started = 0.0
        # an event stream's bytes written so far, and (total after a write,
        # when) for each write not known to have left yet
        self.written = 0
        self.unsent: deque[tuple[int, float]] = deque()
        self.request: h11.Request | None = None  # read, answered at its end
        self.body_left = 0  # bytes of a refused request's body still to drop

    # -- asyncio callbacks ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        server = self.server
        if len(server.connections) >= server.max_connections and not server.evict_idle():
            transport.abort()
            return
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if isinstance(peer, tuple) else ""
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        server.connections.add(self)
        self._wait(server.idle_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.server.streams.discard(self)
        self.transport = None

    def pause_writing(self) -> None:
        if self.transport is not None and not self.streaming:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.streaming:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.streaming:
            return  # nothing more is read from a stream's client
        if not self.started:
            self.started = True  # a request's first byte starts its deadline
            self._wait(self.server.request_timeout)
        try:
            self.conn.receive_data(data)
        except h11.RemoteProtocolError as exc:
            self._refuse(exc.error_status_hint, str(exc) or "not a valid HTTP/1.1 request")
            return
        self._process()

    def eof_received(self) -> bool | None:
        return None

    # -- requests ---------------------------------------------------------------

    def _process(self) -> None:
        while self.transport is not None and not self.streaming:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                self._refuse(exc.error_status_hint, str(exc) or "not a valid HTTP/1.1 request")
                return
            if event is h11.NEED_DATA:
                if len(self.conn.trailing_data[0]) > MAX_HEAD_BYTES:
                    self._refuse(431, "request headers too large")
                return
            if event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                # h11 bounds a head that arrives in pieces; one read can hold a whole large one.
                if head_size(event.headers) > MAX_HEAD_BYTES:
                    self._refuse(431, "request headers too large")
                    return
                length = dict(event.headers).get(b"content-length", b"0")
                bodied = length != b"0" or any(n == b"transfer-encoding" for n, _ in event.headers)
                if bodied and event.method in READ_METHODS:
                    self._refuse(413, "this server only reads: requests have no body")
                    return
                # Any other method is answered 405 whatever its body, once
                # the body (read and dropped, up to a bound) has arrived.
                self.request, self.body_left = event, MAX_DROPPED_BODY
            elif isinstance(event, h11.Data) and self.request is not None:
                self.body_left -= len(event.data)
                if self.body_left < 0:  # too much to drop: answer now, then close
                    request, self.request = self.request, None
                    self._answer(request)
                    self._close()
                    return
            elif isinstance(event, h11.EndOfMessage) and self.request is not None:
                request, self.request = self.request, None
                self._answer(request)
            elif isinstance(event, h11.ConnectionClosed):
                self._close()
                return

    def _answer(self, request: h11.Request) -> None:
        try:
            reply = self.server.routes.handle(
                request.method.decode("ascii", "replace"),
                request.target.decode("latin-1"),
                {
                    name.decode("latin-1"): value.decode("latin-1")
                    for name, value in request.headers
                },
                self.peer,
            )
        except Exception as exc:  # a defect answers 500; the server lives on
            self.server.log_error(exc)
            reply = Routes.error(500, "internal", "the server failed on this request")
        if isinstance(reply, Stream):
            self._start_stream(reply)
        else:
            self._send_reply(reply, head_only=request.method == b"HEAD")

    def _send_reply(self, reply: Reply, *, head_only: bool = False) -> None:
        transport = self.transport
        if transport is None:
            return
        headers = [*reply.headers, ("Content-Length", str(len(reply.body)))]
        try:
            head = response_head(reply.status, headers)
        except h11.LocalProtocolError:
            self._close()
            return
        data = whole_answer(self.conn, head, b"" if head_only else reply.body)
        if data is None:
            self._close()
            return
        transport.write(data)
        self._next_cycle()

    def _next_cycle(self) -> None:
        started = next_request(self.conn)
        if started is None:
            self._close()
            return
        self.started = started
        server = self.server
        self._wait(server.request_timeout if self.started else server.idle_timeout)
        if self.started:
            self._process()

    # -- event streams ------------------------------------------------------------

    def _start_stream(self, stream: Stream) -> None:
        transport = self.transport
        if transport is None:
            return
        server = self.server
        server.make_room_for_stream(self.peer)
        try:
            data = self.conn.send(response_head(200, list(stream.headers)))
            data = (data or b"") + (self.conn.send(h11.Data(data=stream.opening)) or b"")
        except h11.LocalProtocolError:
            self._close()
            return
        self.streaming = True
        transport.pause_reading()
        self.stream_started = server.clock()
        self._write_stream(transport, data)
        server.streams.add(self)
        self.next_keepalive = self.stream_started + server.keepalive

    def send_event(self, frame: bytes) -> None:
        """Write one event; a reader that lets ``stream_buffer`` bytes pile up is dropped."""
        transport = self.transport
        if transport is None:
            return
        if transport.get_write_buffer_size() + len(frame) > self.server.stream_buffer:
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
        ``stream_stall``? Bytes in the kernel's send queue count as unsent:
        a reader that stopped reading shuts its window, and they stay there."""
        transport = self.transport
        if transport is None:
            return False
        left = self.written - transport.get_write_buffer_size() - kernel_unsent(transport)
        unsent = self.unsent
        while unsent and unsent[0][0] <= left:
            unsent.popleft()
        return bool(unsent) and now - unsent[0][1] > self.server.stream_stall

    # -- endings ------------------------------------------------------------------

    def _refuse(self, status: int, message: str) -> None:
        """Answer an error and close: after a framing error nothing more on
        this connection can be trusted."""
        reply = Routes.error(status, "bad_request", message)
        transport = self.transport
        if transport is None:
            return
        transport.write(closing_refusal(status, reply.body, reply.headers))
        self._close()

    def _abort(self) -> None:
        """Drop at once: what is unsent will never be read."""
        transport = self.transport
        if transport is not None:
            self.transport = None
            self.server.connections.discard(self)
            self.server.streams.discard(self)
            transport.abort()

    def _close(self) -> None:
        transport = self.transport
        if transport is not None:
            self.transport = None
            self.server.connections.discard(self)
            self.server.streams.discard(self)
            transport.close()

    def tick(self, now: float) -> None:
        """Deadlines: a request not complete, an idle connection, a keepalive due."""
        if self.streaming:
            if self.stalled(now):
                self.server.dropped += 1
                self._abort()
                return
            if now >= self.next_keepalive:
                self.next_keepalive = now + self.server.keepalive
                self.send_event(b": keepalive\n\n")
            return
        if now < self.deadline:
            return
        if self.started:
            self._refuse(408, "request not complete in time")
        else:
            self._close()

    def _wait(self, seconds: float) -> None:
        now = self.server.clock()
        self.deadline = now + seconds
        self.waiting_since = now

    @property
    def idle(self) -> bool:
        return not self.started and not self.streaming


class WebServer:
    """Serves ``routes`` on ``host:port`` (port 0: the system picks one) in
    a thread of its own, from ``start`` to ``close``."""

    def __init__(
        self,
        routes: Routes,
        host: str,
        port: int,
        *,
        on_error: Callable[[BaseException], None] | None = None,
        max_connections: int = MAX_CONNECTIONS,
        max_streams: int = MAX_CONNECTIONS // 2,
        max_streams_per_client: int = MAX_CONNECTIONS // 8,
        request_timeout: float = REQUEST_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
        stream_buffer: int = STREAM_BUFFER,
        stream_stall: float = STREAM_STALL,
        keepalive: float = KEEPALIVE,
    ) -> None:
        self.routes = routes
        self.host, self.port = host, port
        self.max_connections = max_connections
        self.max_streams = max_streams
        self.max_streams_per_client = max_streams_per_client
        self.request_timeout = request_timeout
        self.idle_timeout = idle_timeout
        self.stream_buffer = stream_buffer
        self.stream_stall = stream_stall
        self.keepalive = keepalive
        self.connections: set[_Connection] = set()
        self.streams: set[_Connection] = set()
        self.dropped = 0  # event streams dropped for not reading
        self.evicted = 0  # event streams closed to make room for a newer one
        self.clock = time.monotonic
        self._on_error = on_error
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None

    def log_error(self, exc: BaseException) -> None:
        if self._on_error is not None:
            self._on_error(exc)

    def evict_idle(self) -> bool:
        """Close the connection that has waited longest for a whole request
        (idle, or its request still incomplete) to make room; False if every
        connection is an event stream. A client that sends its request at
        once is never the longest waiting, whatever slow ones send."""
        waiting = [c for c in self.connections if not c.streaming]
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
        mine = [c for c in self.streams if c.peer == peer]
        if len(mine) >= self.max_streams_per_client:
            candidates = mine
        elif len(self.streams) >= self.max_streams:
            held = Counter(c.peer for c in self.streams)
            most = max(held.values())
            candidates = [c for c in self.streams if held[c.peer] == most]
        else:
            return
        self.evicted += 1
        min(candidates, key=lambda c: c.stream_started)._close()

    # -- the thread ---------------------------------------------------------------

    def start(self) -> tuple[str, int]:
        """Bind now (so a bad address fails at start-up), then serve in a thread."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
            sock.listen(BACKLOG)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self.host, self.port = sock.getsockname()[:2]
        loop = self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)

            async def serve() -> None:
                self._server = await loop.create_server(
                    lambda: _Connection(self), sock=sock, backlog=BACKLOG
                )
                ready.set()
                while True:
                    await asyncio.sleep(SWEEP_INTERVAL)
                    now = self.clock()
                    for conn in list(self.connections):
                        conn.tick(now)

            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(serve())

        self._thread = threading.Thread(target=run, name="web-server", daemon=True)
        self._thread.start()
        ready.wait(10.0)
        return self.host, self.port

    @property
    def address(self) -> str:
        return shown_address(self.host, self.port)

    def publish(self, view: StatusView) -> None:
        """Hand over a view; returns at once (the answers are made in the server's thread)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closing meanwhile
                loop.call_soon_threadsafe(self._apply, view)

    def _apply(self, view: StatusView) -> None:
        """Events first, then the answers: the events are queued on the
        streams at once, and a request they prompt is read only after this
        returns, so it is answered from the new view."""
        try:
            frames = self.routes.events(view)
            for conn in list(self.streams):
                for frame in frames:
                    conn.send_event(frame)
            self.routes.take(view)
        except Exception as exc:
            self.log_error(exc)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` in the server's thread and return what it returns (for tests)."""
        loop = self._loop
        assert loop is not None

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), loop).result(10.0)

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return

        def stop() -> None:
            if self._server is not None:
                self._server.close()
            for conn in list(self.connections):
                conn._close()
            for task in asyncio.all_tasks(loop):
                task.cancel()

        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(stop)
        thread.join(5.0)
        if not thread.is_alive():
            loop.close()
        self._loop = None


def kernel_unsent(transport: asyncio.Transport) -> int:
    """Bytes in the socket's send queue, not yet taken by the peer (Linux's
    SIOCOUTQ); 0 where that cannot be asked."""
    sock = transport.get_extra_info("socket")
    try:
        answer = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (AttributeError, OSError, ValueError):
        return 0
    return int(struct.unpack("i", answer)[0])


__all__ = ["WebServer"]
