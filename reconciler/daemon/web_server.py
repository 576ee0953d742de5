"""The HTTP/1.1 server of ``run --http`` (docs/web.md): the server core
(``protocol.h11_server``) in a thread of its own, with the read API's
limits, answering from the route table in ``web_routes``.

The daemon's pass never waits for it: ``publish`` hands a view over with
``call_soon_threadsafe`` and returns; the answers and events are made in
this server's thread. Its limits, so that no client can hold the daemon:

    connections  at most ``max_connections`` at once; at the cap the
                 connection that has waited longest for a whole request
                 gives way; with only event streams open the new one is
                 closed at once
    requests     a head within ``request_timeout`` of its first byte, at
                 most MAX_HEAD_BYTES; GET and HEAD with a body get 413 (this
                 server only reads), any other method's body is read and
                 dropped up to MAX_DROPPED_BODY and answered 405
    idle         ``idle_timeout`` without a request closes a connection
    streams      at most ``max_streams``, ``max_streams_per_client`` from
                 one address; one whose unsent bytes pass ``stream_buffer``
                 or whose oldest unsent byte waited ``stream_stall`` seconds
                 is dropped; a comment line every ``keepalive`` seconds

Must not: read Git, or decide anything; routing and access are ``web_routes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

import h11

from reconciler.daemon.web_routes import READ_METHODS, Routes
from reconciler.protocol.h11_server import (
    Limits,
    Refusals,
    Server,
    StreamLimits,
    shown_address,
)
from reconciler.text.web_answers import StatusView

MAX_HEAD_BYTES = 16 * 1024
MAX_CONNECTIONS = 256
MAX_DROPPED_BODY = 1024 * 1024  # bytes of a refused method's body read and dropped
REQUEST_TIMEOUT = 10.0  # seconds from a request's first byte to its last
IDLE_TIMEOUT = 60.0  # seconds a keep-alive connection may sit unused
STREAM_BUFFER = 1024 * 1024  # bytes unsent on an event stream before it is dropped
STREAM_STALL = 30.0  # seconds an event stream's oldest unsent byte may wait
KEEPALIVE = 15.0  # seconds between comment lines on an event stream
SWEEP_INTERVAL = 0.5  # seconds between checks of the deadlines
BACKLOG = 128
_READ_METHODS = frozenset(m.encode() for m in READ_METHODS)


def _admit(head: h11.Request) -> tuple[int, str] | None:
    """A read with a body is refused before the body; any other method is
    answered 405 by the routes once its body has arrived."""
    length = dict(head.headers).get(b"content-length", b"0")
    bodied = length != b"0" or any(n == b"transfer-encoding" for n, _ in head.headers)
    if bodied and head.method in _READ_METHODS:
        return 413, "this server only reads: requests have no body"
    return None


def _refusals() -> Refusals:
    failure = Routes.error(500, "internal", "the server failed on this request")
    return Refusals(headers=failure.headers, failure=failure, admit=_admit)


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
        limits = Limits(
            max_head_bytes=MAX_HEAD_BYTES,
            max_connections=max_connections,
            request_timeout=request_timeout,
            idle_timeout=idle_timeout,
            sweep_interval=SWEEP_INTERVAL,
            backlog=BACKLOG,
            max_body_bytes=MAX_DROPPED_BODY,
            keep_bodies=False,
            send_continue=False,
        )
        streams = StreamLimits(
            max_streams, max_streams_per_client, stream_buffer, stream_stall, keepalive
        )
        self.server = Server(
            routes.answer, limits, _refusals(), stream_limits=streams, on_error=on_error
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # What the server holds, for tests: read them in its thread (``call``).

    @property
    def connections(self) -> set[Any]:
        return self.server.connections

    @property
    def streams(self) -> set[Any]:
        return self.server.streams

    @property
    def dropped(self) -> int:
        """Event streams dropped for not reading."""
        return self.server.dropped

    @property
    def evicted(self) -> int:
        """Event streams closed to make room for a newer one."""
        return self.server.evicted

    @property
    def max_streams(self) -> int:
        return self.server.stream_limits.max_streams

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
                await self.server.start(sock=sock)
                ready.set()
                await asyncio.Event().wait()  # until ``close`` cancels it

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
            self.server.broadcast(self.routes.events(view))
            self.routes.take(view)
        except Exception as exc:
            self.server.log_error(exc)

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
            self.server.stop()
            for task in asyncio.all_tasks(loop):
                task.cancel()

        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(stop)
        thread.join(5.0)
        if not thread.is_alive():
            loop.close()
        self._loop = None


__all__ = ["WebServer"]
