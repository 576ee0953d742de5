"""A stand-in file server for answers a real one does not give: a ``Range``
answered with a ``Content-Range`` that starts elsewhere, a 416 for a range
that exists, a body cut off before its ``Content-Length``, 5xx that pass,
a body sent one byte at a time for ever (nginx's ``limit_rate`` counts the
headers too, so it sends nothing for minutes instead). Each request is
answered by ``answer(number, range_start)`` (number from 1; range_start
None without ``Range``), which returns what to write, raw: bytes, or
pieces written one after the other.

    with HostileServer(lambda n, start: cut_200(data, len(data) // 2)) as server:
        url = server.url("model.gguf")
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

Answer = Callable[[int, int | None], bytes | Iterable[bytes]]


def head(status: str, **fields: object) -> bytes:
    lines = [f"HTTP/1.1 {status}", "Connection: close"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in fields.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def cut_200(data: bytes, sent: int) -> bytes:
    """A 200 that declares all of ``data`` and breaks off after ``sent`` bytes."""
    return head("200 OK", Content_Length=len(data)) + data[:sent]


def range_416(size: int) -> bytes:
    return head("416 Range Not Satisfiable", Content_Range=f"bytes */{size}", Content_Length=0)


def wrong_range(data: bytes, start: int) -> bytes:
    """A 206 whose ``Content-Range`` starts at ``start``, whatever was asked."""
    rest = data[start:]
    return (
        head(
            "206 Partial Content",
            Content_Range=f"bytes {start}-{len(data) - 1}/{len(data)}",
            Content_Length=len(rest),
        )
        + rest
    )


def drip(size: int, every: float = 0.2) -> Iterator[bytes]:
    """A 200 declaring ``size`` bytes that sends one byte each ``every`` seconds."""
    yield head("200 OK", Content_Length=size)
    for _ in range(size):
        yield b"x"
        time.sleep(every)


def whole(data: bytes) -> bytes:
    return head("200 OK", Content_Length=len(data)) + data


def unavailable() -> bytes:
    return head("503 Service Unavailable", Content_Length=0)


class HostileServer:
    """Answers on 127.0.0.1 with ``answer``; ``requests`` counts them."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests = 0
        self._lock = threading.Lock()
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(64)
        self.port: int = self.socket.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(connection,), daemon=True).start()

    def _one(self, connection: socket.socket) -> None:
        with connection:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = connection.recv(4096)
                if not chunk:
                    return
                request += chunk
            start = None
            for line in request.decode("latin-1").split("\r\n"):
                if line.lower().startswith("range: bytes="):
                    start = int(line.split("=", 1)[1].split("-", 1)[0])
            with self._lock:
                self.requests += 1
                number = self.requests
            answer = self.answer(number, start)
            try:
                for piece in [answer] if isinstance(answer, bytes) else answer:
                    connection.sendall(piece)
            except OSError:
                pass

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.socket.close()

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
