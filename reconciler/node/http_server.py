"""The HTTP/1.1 server of the node agent and the simulated fleet: the
server core (``protocol.h11_server``) with the agent's limits. JSON in and
out, keep-alive, Content-Length bodies only.

Why not ``http.server`` or a framework: a thread per connection caps a
simulated fleet at a few hundred requests per second, and the agent must
hold its ground against whoever can reach its port. Its limits:

    connections     at most ``max_connections`` (MAX_CONNECTIONS) at once;
                    at the cap the connection that has waited longest for a
                    whole request gives way
    head + body     within ``request_timeout`` of their first byte (408)
    idle            ``idle_timeout`` without a request closes a connection
    size            head over MAX_HEAD_BYTES: 431; body over MAX_BODY_BYTES:
                    413; chunked bodies: 411, and the connection closes

A handler takes a ``Request`` and returns a ``Response`` or an awaitable of
one (a long poll); the agent's handler is its route table (``agent``).

Must not know anything about jobs or nodes: routing is the handler's.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
from collections.abc import Callable
from typing import Any

import h11

from reconciler.protocol.h11_server import (
    JSON_HEADERS,
    Handler,
    Limits,
    Refusals,
    Request,
    Response,
    Server,
    shown_address,
)
from reconciler.spec.errors import ReconcilerError

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 1024 * 1024
MAX_CONNECTIONS = 512  # well under the usual 1,024 descriptors, so accept never fails
REQUEST_TIMEOUT = 10.0  # seconds from a request's first byte to its last
IDLE_TIMEOUT = 120.0  # seconds a keep-alive connection may sit unused
BACKLOG = 256
SWEEP_INTERVAL = 0.25  # seconds between checks of the deadlines

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # built once


def json_response(status: int, data: Any) -> Response:
    return Response(status, _ENCODER.encode(data).encode("utf-8"))


def error_response(status: int, code: str, message: str) -> Response:
    """The protocol's error shape: ``{"error": CODE, "message": TEXT}``."""
    return json_response(status, {"error": code, "message": message})


def _admit(head: h11.Request) -> tuple[int, str] | None:
    """What the agent refuses before reading a body."""
    length = None
    for name, value in head.headers:
        if name == b"transfer-encoding":
            return 411, "chunked request bodies are not supported; send Content-Length"
        if name == b"content-length":
            length = int(value)  # h11 checked it is digits and the only value
    if length is not None and length > MAX_BODY_BYTES:
        return 413, f"request body over {MAX_BODY_BYTES} bytes"
    return None


def _described(exc: h11.RemoteProtocolError) -> str:
    if exc.error_status_hint == 400 and "Content-Length" in str(exc):
        return f"bad Content-Length: {exc}"
    return str(exc) or "not a valid HTTP/1.1 request"


REFUSALS = Refusals(
    headers=JSON_HEADERS,
    failure=error_response(500, "internal", "the server failed on this request"),
    admit=_admit,
    describe=_described,
)


class HttpServer(Server):
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
        limits = Limits(
            max_head_bytes=MAX_HEAD_BYTES,
            max_connections=max_connections,
            request_timeout=request_timeout,
            idle_timeout=idle_timeout,
            sweep_interval=SWEEP_INTERVAL,
            backlog=backlog,
            max_body_bytes=MAX_BODY_BYTES,
        )
        super().__init__(handler, limits, REFUSALS, on_error=on_error, tls=tls)
        self.sock = sock
        self.host = host
        self.port = port

    async def start(  # type: ignore[override]
        self,
    ) -> tuple[str, int]:
        try:
            self.host, self.port = await super().start(self.host, self.port, sock=self.sock)
        except OSError as exc:
            if self.sock is not None:
                raise
            raise ReconcilerError(
                f"cannot listen on {shown_address(self.host, self.port)}: "
                f"{os.strerror(exc.errno) if exc.errno else exc}",
                hint="stop what holds that port, or pass another --listen",
            ) from None
        return self.host, self.port

    @property
    def address(self) -> str:
        return shown_address(self.host, self.port)


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


__all__ = [
    "MAX_BODY_BYTES",
    "MAX_CONNECTIONS",
    "Handler",
    "HttpServer",
    "Request",
    "Response",
    "error_response",
    "json_response",
    "parse_listen",
]
