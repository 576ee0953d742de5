"""The read API's server with real sockets (docs/web.md): an event stream
whose reader stops reading is dropped once its unsent bytes pass the bound,
while a reader that keeps up gets every event; a view published never
waits for either; and a flood of one-byte connections at the cap gives
way to clients that send their requests."""

from __future__ import annotations

import contextlib
import socket
from collections import Counter

import httpx

from reconciler.daemon.web_routes import Routes
from reconciler.daemon.web_server import WebServer
from reconciler.spec.rollout_status import RolloutStatus
from reconciler.text.web_answers import StatusView
from tests.kit.waiting import wait_for

NAMES = [f"rollout-{i:03d}-" + "x" * 50 for i in range(300)]  # long names: big events


def _view(round_: int) -> StatusView:
    statuses = {n: RolloutStatus(name=n, phase="running", message=f"round {round_}") for n in NAMES}
    return StatusView(f"{round_:040x}", statuses, None)


def test_a_stalled_event_stream_is_dropped_and_publishing_never_waits() -> None:
    server = WebServer(Routes(), "127.0.0.1", 0, stream_buffer=64 * 1024)
    host, port = server.start()
    stalled = socket.socket()
    try:
        server.publish(_view(0))
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect((host, port))
        stalled.sendall(b"GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        wait_for(lambda: server.call(lambda: len(server.streams)) == 1, what="the stream open")

        for round_ in range(1, 2000):
            server.publish(_view(round_))
            if round_ % 20 == 0 and server.call(lambda: server.dropped):
                break

        assert server.call(lambda: server.dropped) == 1
        assert server.call(lambda: len(server.streams)) == 0
        # Still serving, and publish only ever queued (no figure is asserted
        # about how fast: that it returned at all with the reader stalled).
        assert httpx.get(f"http://{host}:{port}/api/v1/rollouts", timeout=10).status_code == 200
    finally:
        stalled.close()
        server.close()


def test_a_reader_that_keeps_up_gets_every_commit_event() -> None:
    server = WebServer(Routes(), "127.0.0.1", 0)
    host, port = server.start()
    try:
        server.publish(_view(0))
        seen: list[str] = []
        with httpx.stream("GET", f"http://{host}:{port}/api/v1/events", timeout=30) as stream:
            wait_for(lambda: server.call(lambda: len(server.streams)) == 1, what="the stream")
            for round_ in range(1, 6):
                server.publish(_view(round_))
            for line in stream.iter_lines():
                if line == "event: commit":
                    seen.append(line)
                if len(seen) == 5:
                    break
        assert len(seen) == 5
    finally:
        server.close()


def test_a_head_that_never_ends_gets_408_and_one_too_large_431() -> None:
    server = WebServer(Routes(), "127.0.0.1", 0, request_timeout=1.0)
    host, port = server.start()
    try:
        with socket.create_connection((host, port), timeout=30) as slow:
            slow.sendall(
                b"GET /api/v1/rollouts HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            )  # never the blank line
            assert slow.recv(4096).startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        with socket.create_connection((host, port), timeout=30) as big:
            big.sendall(
                b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n"
            )
            answer = b""
            while chunk := big.recv(4096):
                answer += chunk
            assert answer.split(b"\r\n", 1)[0] == b"HTTP/1.1 431 Request Header Fields Too Large"
            assert b'"error": "bad_request"' in answer
    finally:
        server.close()


def _one_byte(host: str, port: int) -> socket.socket | None:
    """A connection that sent the first byte of a request and nothing more."""
    try:
        sock = socket.create_connection((host, port), timeout=5)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        sock.sendall(b"G")
    return sock


def test_one_byte_connections_at_the_cap_give_way_to_whole_requests() -> None:
    server = WebServer(Routes(), "127.0.0.1", 0, max_connections=32)
    host, port = server.start()
    slow: list[socket.socket] = []
    answered = 0
    try:
        server.publish(_view(0))
        slow += filter(None, (_one_byte(host, port) for _ in range(32)))
        wait_for(lambda: server.call(lambda: len(server.connections)) == 32, what="the cap full")
        for _ in range(10):
            # The flood goes on between requests.
            slow += filter(None, (_one_byte(host, port) for _ in range(8)))
            reply = httpx.get(f"http://{host}:{port}/api/v1/rollouts", timeout=10)
            answered += reply.status_code == 200
        assert server.call(lambda: len(server.connections)) <= 32
    finally:
        for sock in slow:
            sock.close()
        server.close()
    assert answered == 10


def _first_line(host: str, port: int, request: bytes) -> bytes:
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n" not in answer and (chunk := sock.recv(4096)):
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


def test_every_answer_s_status_line_carries_its_reason_phrase() -> None:
    server = WebServer(Routes(), "127.0.0.1", 0)
    host, port = server.start()
    try:
        server.publish(_view(0))
        ask = b"%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        assert _first_line(host, port, ask % (b"GET", b"/api/v1/rollouts")) == b"HTTP/1.1 200 OK"
        assert _first_line(host, port, ask % (b"GET", b"/nowhere")) == b"HTTP/1.1 404 Not Found"
        assert _first_line(host, port, ask % (b"POST", b"/api/v1/rollouts")) == (
            b"HTTP/1.1 405 Method Not Allowed"
        )
        assert _first_line(host, port, ask % (b"GET", b"/api/v1/events")) == b"HTTP/1.1 200 OK"
    finally:
        server.close()


def _stream(
    host: str, port: int, *, source: str = "127.0.0.1", small: bool = False
) -> socket.socket:
    """An event stream asked for and never read."""
    sock = socket.socket()
    if small:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.bind((source, 0))
    sock.connect((host, port))
    sock.sendall(
        b"GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer t\r\n\r\n"
    )
    return sock


def test_a_stream_whose_bytes_wait_unsent_too_long_is_dropped_below_the_byte_bound() -> None:
    # 40 views of about 18 KB each stay far below the 1 MiB bound on unsent bytes
    server = WebServer(Routes(), "127.0.0.1", 0, stream_stall=1.0)
    host, port = server.start()
    stalled = None
    try:
        server.publish(_view(0))
        stalled = _stream(host, port, small=True)
        wait_for(lambda: server.call(lambda: len(server.streams)) == 1, what="the stream open")

        for round_ in range(1, 41):
            server.publish(_view(round_))

        wait_for(
            lambda: server.call(lambda: server.dropped) == 1, what="the stalled stream dropped"
        )
        assert server.call(lambda: len(server.streams)) == 0
    finally:
        if stalled is not None:
            stalled.close()
        server.close()


def test_streams_that_are_never_read_cannot_lock_a_new_reader_out() -> None:
    server = WebServer(Routes(), "127.0.0.1", 0)  # 128 streams, 32 from one address
    host, port = server.start()
    flood: list[socket.socket] = []
    try:
        server.publish(_view(0))
        for _ in range(server.max_streams):
            flood.append(_stream(host, port))
        wait_for(
            lambda: server.call(lambda: server.evicted) == server.max_streams - 32,
            what="the flood held to its share",
        )
        assert server.call(lambda: len(server.streams)) == 32

        with httpx.stream("GET", f"http://{host}:{port}/api/v1/events", timeout=30) as page:
            assert page.status_code == 200
            server.publish(_view(1))
            assert any(line == "event: commit" for line in page.iter_lines())
    finally:
        for sock in flood:
            sock.close()
        server.close()


def test_one_client_address_holds_its_share_and_a_new_address_gets_in() -> None:
    server = WebServer(Routes(token="t"), "127.0.0.1", 0, max_streams=8, max_streams_per_client=4)
    host, port = server.start()
    opened: list[socket.socket] = []

    def per_client() -> dict[str, int]:
        return server.call(lambda: dict(Counter(c.peer for c in server.streams)))

    try:
        server.publish(_view(0))
        opened += [_stream(host, port, source="127.0.0.2") for _ in range(5)]
        wait_for(lambda: server.call(lambda: server.evicted) == 1, what="its own oldest closed")
        opened += [_stream(host, port, source="127.0.0.1") for _ in range(4)]
        wait_for(lambda: per_client() == {"127.0.0.2": 4, "127.0.0.1": 4}, what="both shares")

        opened.append(_stream(host, port, source="127.0.0.3"))

        wait_for(lambda: per_client().get("127.0.0.3") == 1, what="the new address served")
        assert sum(per_client().values()) == 8
    finally:
        for sock in opened:
            sock.close()
        server.close()
