"""A small HTTP/1.1 server on asyncio, for the node agent and the simulated
fleet: JSON in and out, keep-alive, Content-Length bodies only.

Why not ``http.server``: a thread per connection and its line-by-line
parsing cap a simulated fleet at a few hundred requests per second; this
parses each request with a few ``bytes`` operations and answers in the
same event-loop callback (``bench/dispatch.py``).

A handler takes a ``Request`` and returns a ``Response`` (answered at once)
or an awaitable of one (answered when it completes; cancelled if the client
goes away). ``Response.drop`` closes the connection without answering, as
a crashed or overloaded peer would.

Must not know anything about jobs or nodes: routing is the handler's.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 1024 * 1024
IDLE_TIMEOUT = 120.0  # seconds a keep-alive connection may sit unused


class Request:
    __slots__ = ("body", "method", "path")

    def __init__(self, method: str, path: str, body: bytes) -> None:
        self.method = method
        self.path = path
        self.body = body


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

_REASONS = {s.value: s.phrase for s in HTTPStatus}


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # built once


def json_response(status: int, data: Any) -> Response:
    return Response(status, _ENCODER.encode(data).encode("utf-8"))


def error_response(status: int, code: str, message: str) -> Response:
    """The protocol's error shape: ``{"error": CODE, "message": TEXT}``."""
    return json_response(status, {"error": code, "message": message})


class _Connection(asyncio.Protocol):
    __slots__ = ("buffer", "busy", "last_active", "server", "task", "transport")

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.buffer = b""
        self.busy = False
        self.task: asyncio.Future[Response] | None = None
        self.transport: asyncio.Transport | None = None
        self.last_active = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self.task is not None:
            self.task.cancel()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer = self.buffer + data if self.buffer else data
        self.last_active = time.monotonic()
        if not self.busy:
            self._process()

    def _process(self) -> None:
        while self.transport is not None and not self.busy:
            buffer = self.buffer
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    self._fail(431, "request headers too large")
                return
            head = buffer[:end].decode("latin-1")
            lines = head.split("\r\n")
            parts = lines[0].split(" ")
            if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                self._fail(400, "not an HTTP/1.x request")
                return
            method, target, version = parts
            length = 0
            keep_alive = version == "HTTP/1.1"
            expect_continue = False
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    try:
                        length = int(value)
                    except ValueError:
                        self._fail(400, "bad Content-Length")
                        return
                elif name == "connection":
                    token = value.strip().lower()
                    keep_alive = token == "keep-alive" or (keep_alive and token != "close")
                elif name == "transfer-encoding":
                    self._fail(501, "chunked request bodies are not supported; send Content-Length")
                    return
                elif name == "expect" and value.strip().lower() == "100-continue":
                    expect_continue = True
            if length < 0 or length > MAX_BODY_BYTES:
                self._fail(413, f"request body over {MAX_BODY_BYTES} bytes")
                return
            start = end + 4
            if len(buffer) - start < length:
                if expect_continue and len(buffer) == start:
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                return
            body = buffer[start : start + length]
            self.buffer = buffer[start + length :]
            path = target.split("?", 1)[0]
            try:
                result = self.server.handler(Request(method, path, body))
            except Exception as exc:  # a handler bug answers 500, the server lives on
                self.server.log_error(exc)
                result = error_response(500, "internal", "the server failed on this request")
            if isinstance(result, Response):
                self._answer(result, keep_alive)
            else:
                self.busy = True
                task = asyncio.ensure_future(result)
                self.task = task
                task.add_done_callback(functools.partial(self._finished, keep_alive=keep_alive))

    def _finished(self, task: asyncio.Future[Response], keep_alive: bool) -> None:
        self.task = None
        self.busy = False
        if task.cancelled() or self.transport is None:
            return
        exc = task.exception()
        if exc is not None:
            self.server.log_error(exc)
            response = error_response(500, "internal", "the server failed on this request")
        else:
            response = task.result()
        self._answer(response, keep_alive)
        self._process()

    def _answer(self, response: Response, keep_alive: bool) -> None:
        transport = self.transport
        if transport is None:
            return
        if response.drop:
            transport.abort()
            return
        close = response.close or not keep_alive
        reason = _REASONS.get(response.status, "Unknown")
        transport.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (
                response.status,
                reason.encode("latin-1"),
                len(response.body),
                b"Connection: close\r\n" if close else b"",
                response.body,
            )
        )
        self.last_active = time.monotonic()
        if close:
            transport.close()
            self.transport = None

    def _fail(self, status: int, message: str) -> None:
        self._answer(Response(status, _error_body("bad_request", message), close=True), False)


def _error_body(code: str, message: str) -> bytes:
    return json.dumps({"error": code, "message": message}).encode("utf-8")


class HttpServer:
    """Serve ``handler`` on ``host:port`` (port 0: the OS picks one)."""

    def __init__(
        self,
        handler: Handler,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        on_error: Callable[[BaseException], None] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.handler = handler
        self.tls = tls  # HTTPS when set
        self.host = host
        self.port = port
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._on_error = on_error

    def log_error(self, exc: BaseException) -> None:
        if self._on_error is not None:
            self._on_error(exc)

    async def start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self),
            self.host,
            self.port,
            backlog=2048,
            reuse_address=True,
            ssl=self.tls,
        )
        sockname = self._server.sockets[0].getsockname()
        self.host, self.port = sockname[0], sockname[1]
        self._sweeper = asyncio.ensure_future(self._sweep())
        return self.host, self.port

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(IDLE_TIMEOUT / 4)
            cutoff = time.monotonic() - IDLE_TIMEOUT
            for conn in list(self.connections):
                if not conn.busy and conn.last_active < cutoff and conn.transport is not None:
                    conn.transport.close()

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
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)
