"""What the two h11 servers do alike, the node agent's
(``node.http_server``) and the daemon's read API (``daemon.web_server``):
an answer's head with its reason phrase, the size of a request head, a
whole answer and a closing refusal as bytes, the step to a connection's next request, an address as shown.

Each server keeps its own limits, routing and connections; this module
only turns h11 events into bytes and back.

Must not: own a socket or a connection, route, or decide a limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from http import HTTPStatus

import h11

REASONS = {s.value: s.phrase.encode("latin-1") for s in HTTPStatus}
_END = h11.EndOfMessage()


def response_head(
    status: int, headers: list[tuple[bytes, bytes]] | list[tuple[str, str]]
) -> h11.Response:
    """An answer's head with the standard reason phrase (``200 OK``): h11
    writes an empty one unless given it."""
    return h11.Response(status_code=status, headers=headers, reason=REASONS.get(status, b""))


def continue_head() -> h11.InformationalResponse:
    """``100 Continue``, with its reason phrase."""
    return h11.InformationalResponse(status_code=100, headers=[], reason=REASONS[100])


def head_size(headers: Iterable[tuple[bytes, bytes]]) -> int:
    """A parsed head's size as sent, near enough: h11 bounds only a head
    still incomplete, and one read can hold a whole large one."""
    return sum(len(name) + len(value) + 4 for name, value in headers)


def whole_answer(conn: h11.Connection, head: h11.Response, body: bytes) -> bytes | None:
    """``head``, ``body`` and the end of the message as bytes to write;
    None when h11 refuses to send them (the connection must close)."""
    try:
        data = conn.send(head) or b""
        data += conn.send(h11.Data(data=body)) or b""
        data += conn.send(_END) or b""
    except h11.LocalProtocolError:
        return None
    return data


def closing_refusal(status: int, body: bytes, headers: Sequence[tuple[str, str]]) -> bytes:
    """An error answer written past h11, then the connection closes: after
    a framing error h11 sends nothing more, and nothing that follows on
    the connection can be trusted."""
    reason = REASONS.get(status, b"Error")
    fields = "".join(f"{name}: {value}\r\n" for name, value in headers).encode("latin-1")
    return b"HTTP/1.1 %d %s\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (
        status,
        reason,
        fields,
        len(body),
        body,
    )


def next_request(conn: h11.Connection) -> bool | None:
    """Ready ``conn`` for its next request after an answer: None when the
    connection must close instead, else whether bytes of the next request
    have already arrived (its deadline starts now)."""
    if conn.our_state is h11.MUST_CLOSE or conn.their_state is not h11.DONE:
        return None
    try:
        conn.start_next_cycle()
    except h11.LocalProtocolError:
        return None
    return bool(conn.trailing_data[0])


def shown_address(host: str, port: int) -> str:
    """``HOST:PORT``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
