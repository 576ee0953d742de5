"""A real webhook receiver on 127.0.0.1 for notification tests: an HTTP
server in a thread that records every request (headers and raw body) and
can be told to answer 500 for the next N requests, to answer a 4xx, to hang
until released, or to refuse connections for a while (it stops listening
on its port, which it keeps: nobody else can take it meanwhile).

    with Receiver() as hook:
        hook.fail_next(3)             # three 500s, then 200
        ...
        hook.wait_for(4)              # four requests arrived
        hook.requests[0].delivery     # X-Reconciler-Delivery
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.kit.ports import HeldPort


@dataclass(frozen=True)
class Request:
    path: str
    headers: dict[str, str]
    body: bytes
    answered: int

    @property
    def delivery(self) -> str:
        return self.headers.get("x-reconciler-delivery", "")

    @property
    def event(self) -> str:
        return self.headers.get("x-reconciler-event", "")

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._failures = 0
        self._status = 200
        self._hang = threading.Event()  # set: requests hang until released
        self._released = threading.Event()
        self.hanging = 0  # requests waiting in a hang now
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._held = HeldPort()
        self.port = self._held.port
        self._start()

    # -- behaviour -----------------------------------------------------------

    def fail_next(self, count: int, status: int = 500) -> None:
        with self._lock:
            self._failures, self._status = count, status

    def answer(self, status: int) -> None:
        """Answer every request with ``status`` from now on."""
        with self._lock:
            self._failures, self._status = 1 << 30, status

    def hang(self) -> None:
        self._released.clear()
        self._hang.set()

    def release(self) -> None:
        self._hang.clear()
        self._released.set()

    def refuse(self) -> None:
        """Stop listening: connections are refused until ``accept``."""
        self._stop()

    def accept(self) -> None:
        self._start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    # -- reading -------------------------------------------------------------

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Request]:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                got = list(self.requests)
            if len(got) >= count:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"{count} requests expected, got {len(got)}: {got}")
            time.sleep(0.02)

    def events(self) -> list[tuple[str, str]]:
        """(event, delivery id) of every request answered 2xx."""
        with self._lock:
            return [(r.event, r.delivery) for r in self.requests if r.answered < 300]

    # -- the server ----------------------------------------------------------

    def _start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                if receiver._hang.is_set():
                    with receiver._lock:
                        receiver.hanging += 1
                    receiver._released.wait(60)
                    with receiver._lock:
                        receiver.hanging -= 1
                with receiver._lock:
                    status = 200
                    if receiver._failures > 0:
                        receiver._failures -= 1
                        status = receiver._status
                    receiver.requests.append(
                        Request(
                            self.path,
                            {k.lower(): v for k, v in self.headers.items()},
                            body,
                            status,
                        )
                    )
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler, bind_and_activate=False)
        server.socket.close()  # it serves the held socket instead
        server.socket = self._held.listen()
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def _stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()  # serve_forever returns; the socket stays ours
            self._held.refuse()
            self._server = None

    def close(self) -> None:
        self.release()
        self._stop()
        self._held.close()

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
