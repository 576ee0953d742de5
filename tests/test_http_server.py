"""The agent's HTTP server reads every request with h11, so a request head
whose lines end in a bare LF (which h11 accepts) is answered as its CRLF
twin is, whatever the request and whichever server (a real agent, the
simulated fleet): never left to time out. Raw bytes from a plain socket;
the answer is read with h11 up to its end, no timing involved."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import h11
import pytest

from reconciler.node.http_server import Request, Response, json_response
from reconciler.protocol.signing import SigningKey, canonical_json
from tests.kit.agents import AgentThread, FleetThread, Served
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key

REQUEST_TIMEOUT = 30.0  # far longer than any answer here takes: a 408 would mean a wait ran out


def echo(request: Request) -> Response:
    return json_response(
        200,
        {
            "method": request.method,
            "path": request.path,
            "query": request.query,
            "body": request.body.decode("latin-1"),
        },
    )


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return make_key(tmp_path / "keys" / "reconciler").signing


@pytest.fixture
def echoing() -> Iterator[Served]:
    served = Served(echo, server_options={"request_timeout": REQUEST_TIMEOUT})
    yield served
    served.close()


def bare_lf(head: bytes) -> bytes:
    return head.replace(b"\r\n", b"\n")


def request_head(method: str, path: str, body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: a\r\nAccept: application/json\r\n"
    if method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n"


def answers(port: int, data: bytes, count: int) -> list[tuple[int, bytes]]:
    """Send ``data`` on one connection and read ``count`` answers to their end."""
    conn = h11.Connection(h11.CLIENT)
    found: list[tuple[int, bytes]] = []
    with socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT * 2) as sock:
        sock.sendall(data)
        while len(found) < count:
            # h11's client side reads an answer only to a request it sent: the
            # requests went out as raw bytes, so it is told of one per answer.
            conn.send(h11.Request(method="GET", target="/", headers=[("Host", "a")]))
            conn.send(h11.EndOfMessage())
            status, body = 0, b""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(sock.recv(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    found.append((status, body))
                    break
                else:
                    return found  # closed
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                break
            conn.start_next_cycle()
    return found


BODY = canonical_json({"payload": {"jobId": "apply-1"}})
REQUESTS = {
    "get": request_head("GET", "/v1/nodes/n1/heartbeat?newerThan=x"),
    "post": request_head("POST", "/v1/nodes/n1/jobs", BODY) + BODY,
    "held": request_head("GET", "/v1/nodes/n1/jobs/j?wait=20s"),
}


@pytest.mark.parametrize("name", list(REQUESTS))
def test_a_bare_lf_head_is_answered_as_its_crlf_twin(echoing: Served, name: str) -> None:
    crlf = REQUESTS[name]
    head, sep, body = crlf.partition(b"\r\n\r\n")

    with_crlf = answers(echoing.server.port, crlf, 1)
    with_lf = answers(echoing.server.port, bare_lf(head + sep) + body, 1)

    assert with_lf == with_crlf
    assert with_lf[0][0] == 200


def test_bare_lf_and_crlf_heads_pipelined_on_one_connection_are_answered_in_order(
    echoing: Served,
) -> None:
    plain = REQUESTS["get"]
    lf = bare_lf(plain).replace(b"heartbeat", b"backups")

    got = answers(echoing.server.port, plain + lf + plain, 3)

    assert [status for status, _ in got] == [200, 200, 200]
    assert [json.loads(body)["path"] for _, body in got] == [
        "/v1/nodes/n1/heartbeat",
        "/v1/nodes/n1/backups",
        "/v1/nodes/n1/heartbeat",
    ]


def test_a_real_agent_takes_a_job_and_answers_reads_over_bare_lf_heads(
    tmp_path: Path, key: SigningKey
) -> None:
    agent = AgentThread(
        tmp_path / "state", [key], server_options={"request_timeout": REQUEST_TIMEOUT}
    )
    try:
        posted = canonical_json(envelope(job("apply-lf"), key))
        post = bare_lf(request_head("POST", "/v1/nodes/node-a/jobs", posted)) + posted
        [(accepted, record)] = answers(agent.server.port, post, 1)
        agent.wait_finished("apply-lf")
        read = bare_lf(request_head("GET", "/v1/nodes/node-a/jobs/apply-lf"))
        beat = bare_lf(request_head("GET", "/v1/nodes/node-a/heartbeat"))
        [(read_status, read_body), (beat_status, beat_body)] = answers(
            agent.server.port, read + beat, 2
        )
    finally:
        agent.close()

    assert accepted == 202 and json.loads(record)["jobId"] == "apply-lf"
    assert read_status == 200 and json.loads(read_body)["state"] == "succeeded"
    assert beat_status == 200 and json.loads(beat_body)["node"] == "node-a"


def test_the_simulated_fleet_answers_bare_lf_heads_as_crlf_ones(
    tmp_path: Path, key: SigningKey
) -> None:
    fleet = FleetThread(tmp_path / "sim", [key], names=["n1"])
    try:
        crlf = request_head("GET", "/v1/nodes/n1/jobs/unknown")
        got = answers(fleet.server.port, crlf + bare_lf(crlf), 2)
        beat = answers(fleet.server.port, bare_lf(request_head("GET", "/v1/nodes/n1/heartbeat")), 1)
    finally:
        fleet.close()

    assert got[0] == got[1] and got[0][0] == 404
    assert beat[0][0] == 200 and json.loads(beat[0][1])["node"] == "n1"


def test_the_agent_s_status_lines_carry_their_reason_phrases(echoing: Served) -> None:
    port = echoing.server.port
    with socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT * 2) as sock:
        sock.sendall(
            b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
            b"Content-Length: 2\r\nExpect: 100-continue\r\n\r\n"
        )
        interim = sock.recv(4096)
        sock.sendall(b"{}")
        answer = b""
        while b"\r\n" not in answer and (chunk := sock.recv(4096)):
            answer += chunk

    assert interim.split(b"\r\n", 1)[0] == b"HTTP/1.1 100 Continue"
    assert answer.split(b"\r\n", 1)[0] == b"HTTP/1.1 200 OK"


def exchange(sock: socket.socket, conn: h11.Connection, method: str) -> tuple[int, bytes]:
    """One request on a kept-alive connection, read with h11 to the answer's end."""
    request = h11.Request(method=method, target="/v1/nodes/n1/heartbeat", headers=[("Host", "a")])
    sock.sendall((conn.send(request) or b"") + (conn.send(h11.EndOfMessage()) or b""))
    status, body = 0, b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            conn.start_next_cycle()
            return status, body
        else:
            raise AssertionError(f"no answer to {method}: {event!r}")


def test_a_head_request_is_answered_with_the_head_alone_on_a_kept_connection(
    echoing: Served,
) -> None:
    conn = h11.Connection(h11.CLIENT)
    with socket.create_connection(
        ("127.0.0.1", echoing.server.port), timeout=REQUEST_TIMEOUT * 2
    ) as sock:
        head = exchange(sock, conn, "HEAD")
        status, body = exchange(sock, conn, "GET")

    assert head == (200, b"")
    assert status == 200 and json.loads(body)["method"] == "GET"
