"""Stand-ins for a hostile or broken server outside the fleet (where the
daemon expects Prometheus or Alertmanager), on 127.0.0.1, port 0: a real
Prometheus or Alertmanager cannot be made to answer this way, so these
stand in for the faults only.

    DripServer      answers every request with a 200 head at once, then a
                    JSON body one byte every ``interval`` seconds, never
                    ending; after ``give_up`` seconds it ends the connection
                    itself and counts that in ``gave_up`` (a client that
                    waited that long would have waited for ever)
    NestedServer    answers a 200 head and a body of ``[`` nested deeper
                    than any JSON parser recurses
    EndlessServer   answers a 200 head, then a body as fast as the client
                    reads it, until the client hangs up or ``limit`` bytes
                    were sent on the connection; ``sent`` counts the body
                    bytes the kernel took, over all connections

Both count in ``hung_up`` the connections the client closed first.

    with DripServer() as drip:
        ... ask drip.url ...
        assert drip.gave_up == 0 and drip.hung_up >= 1
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"


class _StandIn:
    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.requests = 0
        self.hung_up = 0
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="stand-in").start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self._connections.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    return
                head += data
            with self._lock:
                self.requests += 1
            conn.sendall(HEAD)
            self.answer(conn)
        except OSError:  # the client closed the connection first
            with self._lock:
                self.hung_up += 1
        finally:
            conn.close()

    def answer(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.stopping.set()
        self.listener.close()
        with self._lock:
            for conn in self._connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> _StandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DripServer(_StandIn):
    def __init__(self, interval: float = 1.0, give_up: float = 30.0) -> None:
        super().__init__()
        self.interval = interval
        self.give_up = give_up
        self.gave_up = 0

    def answer(self, conn: socket.socket) -> None:
        ends = time.monotonic() + self.give_up
        conn.sendall(b"[")
        while time.monotonic() < ends:
            if self.stopping.wait(self.interval):
                return
            conn.sendall(b" ")
        with self._lock:
            self.gave_up += 1

    def __enter__(self) -> DripServer:
        return self


class EndlessServer(_StandIn):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.sent = 0

    def answer(self, conn: socket.socket) -> None:
        chunk, sent = b"[" + b" " * 65535, 0
        while sent < self.limit and not self.stopping.is_set():
            conn.sendall(chunk)
            sent += len(chunk)
            chunk = b" " * 65536  # an array that never closes
            with self._lock:
                self.sent += len(chunk)

    def __enter__(self) -> EndlessServer:
        return self


class NestedServer(_StandIn):
    """Answers ``depth`` opening brackets: valid JSON's start, nested deeper
    than Python's parser goes, well under any size cap."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.depth = depth

    def answer(self, conn: socket.socket) -> None:
        conn.sendall(b"[" * self.depth)
