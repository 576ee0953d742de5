"""The server's own reading of plain requests against h11's: what
``simple_head`` takes, h11 reads the same way; what the server answers is
byte for byte what it answers with h11 reading every request, over real
sockets, for plain requests, requests that are not, and mixes of both on
one connection."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.node.http_server import (
    MAX_BODY_BYTES,
    Request,
    Response,
    _head,
    json_response,
    simple_head,
    simple_response_head,
)
from tests.kit.agents import Served

# -- the head reader against h11's ------------------------------------------------

REQUEST_LINES = st.one_of(
    st.builds(
        lambda method, target, version: method + b" " + target + b" " + version,
        st.sampled_from([b"GET", b"POST", b"HEAD", b"PUT", b"get", b"G\x00T"]),
        st.one_of(
            st.sampled_from([b"/v1/nodes/n1/heartbeat", b"/v1/x?wait=20", b"*", b"/a b"]),
            st.binary(min_size=1, max_size=12),
        ),
        st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2", b"http/1.1", b"HTTP/1.1 "]),
    ),
    st.binary(max_size=30),
)
FIELDS = st.one_of(
    st.sampled_from(
        [
            b"Host: a",
            b"Host:a",
            b"Host: 127.0.0.1:8080",
            b"host:  a  ",
            b"Host:",
            b"Content-Length: 2",
            b"content-length:0",
            b"Content-Length: 02",
            b"Content-Length: 1_0",
            b"Content-Length: +2",
            b"Content-Length: %d" % (MAX_BODY_BYTES + 1),
            b"Content-Length: 99999999999",
            b"Transfer-Encoding: chunked",
            b"Connection: close",
            b"Connection: keep-alive",
            b"Expect: 100-continue",
            b"Upgrade: h2c",
            b"Accept: application/json",
            b"User-Agent: reconciler-daemon",
            b"X-Pad: a\tb",
            b" folded: line",
            b"Bad Name: x",
            b"X-Latin: \xe9",
            b"X-Nul: a\x00b",
            b": empty name",
        ]
    ),
    st.builds(
        lambda name, value: name + b":" + value,
        st.binary(min_size=1, max_size=8),
        st.binary(max_size=12),
    ),
)


def h11_reading(head: bytes) -> tuple[bytes, bytes, int] | None:
    """What h11 makes of ``head``: (method, target, Content-Length or 0), or None on an error."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
    try:
        conn.receive_data(head + b"\r\n\r\n")
        event = conn.next_event()
    except h11.RemoteProtocolError:
        return None
    if not isinstance(event, h11.Request):
        return None
    lengths = [int(v) for n, v in event.headers if n == b"content-length"]
    return event.method, event.target, lengths[0] if lengths else 0


@settings(max_examples=1500, deadline=None)
@given(line=REQUEST_LINES, fields=st.lists(FIELDS, max_size=6))
def test_what_the_simple_reader_takes_h11_reads_the_same_way(
    line: bytes, fields: list[bytes]
) -> None:
    head = b"\r\n".join([line, *fields])
    simple = simple_head(head)
    if simple is not None:
        assert simple == h11_reading(head)


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v1/nodes/n1/heartbeat HTTP/1.1\r\nHost: a\r\nAccept: application/json",
        b"POST /v1/nodes/n1/jobs HTTP/1.1\r\nHost: 127.0.0.1:9\r\nContent-Length: 512",
        b"GET /v1/nodes/n1/jobs/j?wait=20 HTTP/1.1\r\nHost: a\r\nUser-Agent: reconciler-daemon",
    ],
)
def test_the_daemons_requests_are_plain(head: bytes) -> None:
    assert simple_head(head) is not None
    assert simple_head(head) == h11_reading(head)


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1",  # no Host
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b",
        b"GET / HTTP/1.0\r\nHost: a",
        b"HEAD / HTTP/1.1\r\nHost: a",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nContent-Length: 2",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked",
        b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2",
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: %d" % (MAX_BODY_BYTES + 1),
    ],
)
def test_what_h11_must_decide_is_left_to_h11(head: bytes) -> None:
    assert simple_head(head) is None


@pytest.mark.parametrize("status", [200, 202, 400, 404, 409, 421, 422, 500, 503, 599])
@pytest.mark.parametrize("close", [False, True])
def test_a_plain_answers_head_is_the_one_h11_writes(status: int, close: bool) -> None:
    for length in (0, 7, 1234):
        conn = h11.Connection(h11.SERVER)
        conn.receive_data(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        conn.next_event()
        conn.next_event()
        assert simple_response_head(status, length, close) == conn.send(
            _head(status, length, close)
        )


# -- the whole server, both ways ---------------------------------------------------


async def _later(request: Request) -> Response:
    await asyncio.sleep(0.01)
    return json_response(202, {"later": request.path, "body": len(request.body)})


def handler(request: Request) -> Response | asyncio.Future[Response]:
    if request.path == "/later":
        return asyncio.ensure_future(_later(request))
    if request.path == "/close":
        return Response(200, b"{}", close=True)
    if request.path == "/drop":
        return Response(0, drop=True)
    return json_response(
        200,
        {
            "method": request.method,
            "path": request.path,
            "query": request.query,
            "body": request.body.decode("latin-1"),
        },
    )


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Served, Served]]:
    options = {"request_timeout": 0.5}
    simple = Served(handler, server_options={**options, "simple_requests": True})
    plain = Served(handler, server_options={**options, "simple_requests": False})
    try:
        yield simple, plain
    finally:
        simple.close()
        plain.close()


def exchange(served: Served, pieces: list[bytes]) -> bytes:
    """Send ``pieces`` one by one on one connection, read until it closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", served.server.port), timeout=5) as sock:
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(0.02)
        sock.settimeout(1.5)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return received


GET = b"GET /v1/nodes/n1/heartbeat?newerThan=x HTTP/1.1\r\nHost: a\r\n\r\n"
BODY = json.dumps({"payload": {"jobId": "apply-1"}}).encode()
POST = b"POST /v1/nodes/n1/jobs HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)

CASES = {
    "get": [GET],
    "post": [POST],
    "pipelined": [GET + POST + GET],
    "split-head-and-body": [POST[:10], POST[10:50], POST[50:]],
    "held-then-more": [b"GET /later HTTP/1.1\r\nHost: a\r\n\r\n" + GET, POST],
    "answer-and-close": [b"GET /close HTTP/1.1\r\nHost: a\r\n\r\n" + GET],
    "drop": [b"GET /drop HTTP/1.1\r\nHost: a\r\n\r\n"],
    "client-closes": [GET + b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n" + GET],
    "http-1.0": [b"GET /x HTTP/1.0\r\n\r\n"],
    "plain-then-chunked": [
        GET
        + b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    ],
    "bad-length": [b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1_0\r\n\r\n{}"],
    "too-large": [
        b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n{" % (MAX_BODY_BYTES + 1)
    ],
    "huge-head": [b"GET /x HTTP/1.1\r\nHost: a\r\nX-Pad: " + b"a" * 70_000 + b"\r\n\r\n"],
    "no-host": [b"GET /x HTTP/1.1\r\n\r\n"],
    "garbage": [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"],
    "incomplete-body-times-out": [b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 50\r\n\r\n{"],
    "expect-continue": [
        b"POST /x HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
        b"{}",
    ],
    "leading-blank-line": [b"\r\n" + GET],
}


@pytest.mark.parametrize("pieces", list(CASES.values()), ids=list(CASES))
def test_the_server_answers_byte_for_byte_as_with_h11_reading_everything(
    servers: tuple[Served, Served], pieces: list[bytes]
) -> None:
    simple, plain = servers
    answer = exchange(simple, pieces)
    assert answer == exchange(plain, pieces)
    assert answer or pieces == CASES["drop"]
