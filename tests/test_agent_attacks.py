"""The agent against what anyone who reaches its port can send (the limits
of docs/protocol.md's HTTP layer): each case on a real port, raw
bytes from a plain socket. The agent answers with the right 4xx or closes
the connection, within bounded time and memory, keeps serving, and writes
nothing into its state directory."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.node.http_server import MAX_BODY_BYTES
from reconciler.protocol.signing import SigningKey, canonical_json
from tests.kit.agents import AgentThread
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key

REQUEST_TIMEOUT = 1.0


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return make_key(tmp_path / "keys" / "reconciler").signing


@pytest.fixture
def agent(tmp_path: Path, key: SigningKey) -> Iterator[AgentThread]:
    served = AgentThread(
        tmp_path / "state",
        [key],
        server_options={"request_timeout": REQUEST_TIMEOUT, "max_connections": 64},
    )
    try:
        yield served
    finally:
        served.close()


def connect(agent: AgentThread) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", agent.server.port), timeout=5)
    return sock


def exchange(agent: AgentThread, data: bytes, wait: float = 5) -> bytes:
    """Send raw bytes, read until the agent closes (or ``wait`` passes)."""
    with connect(agent) as sock:
        sock.settimeout(wait)
        sock.sendall(data)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            pass
        except ConnectionResetError:
            pass
        return received


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def post_head(length: int | str, extra: bytes = b"") -> bytes:
    return (
        b"POST /v1/nodes/node-a/jobs HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {length}\r\n".encode()
        + extra
        + b"\r\n"
    )


def still_serving_and_clean(agent: AgentThread) -> None:
    status, beat = agent.get("heartbeat")
    assert status == 200 and beat["node"] == "node-a"
    assert list(agent.state.jobs.iterdir()) == []  # nothing written


def test_a_body_over_the_size_cap_is_refused_before_it_is_read(agent: AgentThread) -> None:
    answer = exchange(agent, post_head(MAX_BODY_BYTES + 1) + b"{")
    assert status_of(answer) == 413
    still_serving_and_clean(agent)


def test_a_content_length_shorter_than_the_body_cannot_smuggle_a_request(
    agent: AgentThread, key: SigningKey
) -> None:
    body = canonical_json(envelope(job(mode="dry_run"), key))
    answer = exchange(agent, post_head(10) + body)
    first, _, rest = answer.partition(b"\r\n\r\n")
    assert status_of(first) == 400 and b"invalid_job" in rest
    # The remainder is not a request: refused (or cut off by the deadline), then closed.
    assert b"HTTP/1.1 400" in rest or b"HTTP/1.1 408" in rest
    still_serving_and_clean(agent)


def test_a_content_length_longer_than_the_body_times_out(agent: AgentThread) -> None:
    started = time.monotonic()
    answer = exchange(agent, post_head(500) + b'{"payload": ', wait=REQUEST_TIMEOUT * 5)
    assert status_of(answer) == 408
    assert time.monotonic() - started < REQUEST_TIMEOUT * 4
    still_serving_and_clean(agent)


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (post_head(2, b"Content-Length: 3\r\n"), 400),  # duplicates that disagree
        (post_head("1_0"), 400),  # not digits
        (post_head("+2"), 400),
        (
            b"POST /v1/nodes/node-a/jobs HTTP/1.1\r\nHost: a\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            411,
        ),
        (
            b"GET /v1/nodes/node-a/heartbeat HTTP/1.1\r\nHost: a\r\nX-Pad: "
            + b"a" * 70_000
            + b"\r\n\r\n",
            431,
        ),
        (b"GET /v1/nodes/\xff\xfe/heartbeat HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ],
    ids=[
        "duplicate-length",
        "underscore-length",
        "plus-length",
        "chunked",
        "huge-head",
        "non-utf8",
    ],
)
def test_framing_the_agent_does_not_accept_is_refused_and_the_connection_closed(
    agent: AgentThread, head: bytes, expected: int
) -> None:
    answer = exchange(agent, head + b"{}")
    assert status_of(answer) == expected, answer[:200]
    assert b"Connection: close" in answer
    still_serving_and_clean(agent)


def test_dot_dot_in_a_path_reaches_nothing(agent: AgentThread) -> None:
    for path in (b"/v1/nodes/node-a/../../etc/passwd", b"/v1/nodes/../jobs", b"/../state"):
        answer = exchange(
            agent, b"GET " + path + b" HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        )
        assert status_of(answer) == 404, answer
    still_serving_and_clean(agent)


def test_json_nested_very_deep_is_an_invalid_job_not_a_crash(agent: AgentThread) -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    answer = exchange(agent, post_head(len(body), b"Connection: close\r\n") + body)
    assert status_of(answer) == 400
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"] == "invalid_job"
    still_serving_and_clean(agent)


def test_pipelined_requests_are_answered_in_order(agent: AgentThread) -> None:
    one = b"GET /v1/nodes/node-a/heartbeat HTTP/1.1\r\nHost: a\r\n\r\n"
    answer = exchange(
        agent, one * 50 + b"GET /nope HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    )
    assert answer.count(b"HTTP/1.1 200 OK") == 50
    assert answer.rstrip().endswith(b"}") and answer.count(b"HTTP/1.1 404") == 1


def test_a_client_that_pipelines_and_never_reads_is_stopped_not_buffered(
    agent: AgentThread,
) -> None:
    one = b"GET /v1/nodes/node-a/heartbeat HTTP/1.1\r\nHost: a\r\n\r\n"
    chunk = one * 1000
    sent = 0
    with connect(agent) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(REQUEST_TIMEOUT / 2)  # blocked before the deadline closes it
        with pytest.raises(TimeoutError):
            while sent < 200 * 1024 * 1024:  # far more than the agent may hold
                sock.sendall(chunk)
                sent += len(chunk)
        buffered = agent.call(
            lambda: max(
                c.transport.get_write_buffer_size()
                for c in agent.server.connections
                if c.transport is not None
            )
        )
    assert sent < 50 * 1024 * 1024  # the agent stopped reading long before
    assert buffered < 4 * 1024 * 1024
    still_serving_and_clean(agent)


def test_a_thousand_idle_connections_do_not_lock_out_the_daemon(agent: AgentThread) -> None:
    idle = [connect(agent) for _ in range(1000)]
    try:
        time.sleep(0.2)
        count = agent.call(lambda: len(agent.server.connections))
        assert count <= 64  # the cap; idle ones gave way
        still_serving_and_clean(agent)
    finally:
        for sock in idle:
            sock.close()


def test_a_slowloris_is_cut_off_by_the_deadline_that_bytes_do_not_extend(
    agent: AgentThread,
) -> None:
    slow = [connect(agent) for _ in range(200)]
    stop = threading.Event()

    def trickle() -> None:
        for sock in slow:
            with contextlib.suppress(OSError):
                sock.sendall(b"GET /v1/nodes/node-a/heartbeat HTTP/1.1\r\nX-a: ")
        while not stop.wait(0.1):
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.sendall(b"a")

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        time.sleep(REQUEST_TIMEOUT * 2.5)
        still_serving_and_clean(agent)
        open_slow = agent.call(lambda: sum(1 for c in agent.server.connections if c.started))
        assert open_slow == 0
    finally:
        stop.set()
        thread.join()
        for sock in slow:
            sock.close()


def test_replayed_posts_racing_on_one_job_id_execute_it_once(
    agent: AgentThread, key: SigningKey
) -> None:
    body = canonical_json(envelope(job(mode="dry_run"), key))
    answers: list[int] = []

    def post() -> None:
        status, _ = agent.post(body)
        answers.append(status)

    threads = [threading.Thread(target=post) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    agent.wait_finished("apply-0001")
    assert sorted(answers) == [200] * 19 + [202]
    assert [p.name for p in agent.state.jobs.iterdir()] == ["apply-0001.json"]


def test_a_head_request_gets_a_head_alone_and_the_connection_is_kept(
    agent: AgentThread,
) -> None:
    head = b"HEAD /v1/nodes/node-a/heartbeat HTTP/1.1\r\nHost: a\r\n\r\n"
    get = b"GET /v1/nodes/node-a/heartbeat HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"

    answer = exchange(agent, head + get)

    first, _, rest = answer.partition(b"\r\n\r\n")
    assert status_of(first) == 404
    assert status_of(rest) == 200  # the next answer follows the head, no body between
    still_serving_and_clean(agent)
