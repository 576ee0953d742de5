"""Requests to the servers outside the fleet that the daemon asks
(Prometheus and Alertmanager in the pass, notification receivers in their
own threads), each answer bounded in time and in size, so that a slow or
endless answer costs at most one deadline and one cap of memory, never a
wait without end or a growing heap.

    time      one deadline per request, from connecting to the body's last
              byte; bytes do not extend it (httpx's own timeouts are per
              read, so a server sending a byte a second never trips them)
    size      the body is read as it arrives and cut off past ``max_bytes``,
              the connection closed: an endless body holds at most that much
    round     the requests of one round go at once, at most ``concurrency``
              in flight; once one has run out of time, those not yet sent
              are not sent: the server is not answering this round
    encoding  bodies are asked for as they are (``identity``); a compressed
              one is refused, as inflating it could outgrow any cap

Every failure is a ``NoAnswer`` naming the endpoint and why; the callers
turn it into their own "no evidence" answer. ``json_of`` reads a body
whatever it holds.

Must not: know what the requests mean, or keep a connection past its
round (the client and its connections belong to the round's event loop).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

MAX_BODY_BYTES = 8 * 1024 * 1024  # bytes of one answer's body kept
CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True)
class Ask:
    """One request: ``endpoint`` names it in messages (no query string: a
    PromQL query can be long; for a receiver, its name: its URL may hold a
    secret), ``url`` is what is asked."""

    endpoint: str
    url: str
    method: str = "GET"
    content: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Answered:
    status: int
    body: bytes


@dataclass(frozen=True)
class NoAnswer:
    reason: str  # says the endpoint
    timed_out: bool = False


Reply = Answered | NoAnswer


class _CutOff(Exception):
    """An answer we stop reading; the message says why."""


class OutsideHttp:
    """Asks servers outside the fleet, round by round. It keeps only the
    TLS context between rounds: building one reads the CA bundle, which
    costs more than a round of small requests."""

    def __init__(self) -> None:
        self._tls: ssl.SSLContext | None = None

    def ask_all(
        self,
        asks: Sequence[Ask],
        *,
        timeout: float,
        concurrency: int,
        max_bytes: int = MAX_BODY_BYTES,
    ) -> list[Reply]:
        """Each request's reply, in order; within about ``timeout`` per
        request in flight, whatever the servers do. Called from a thread
        that runs no event loop of its own (the pass's, a receiver's)."""
        if not asks:
            return []
        if self._tls is None:
            # httpx's own default: the system's authorities, or SSL_CERT_FILE.
            self._tls = httpx.create_ssl_context()
        return asyncio.run(_ask_all(asks, self._tls, timeout, max(1, concurrency), max_bytes))


async def _ask_all(
    asks: Sequence[Ask], tls: ssl.SSLContext, timeout: float, concurrency: int, max_bytes: int
) -> list[Reply]:
    replies: list[Reply] = [NoAnswer("not asked")] * len(asks)
    todo = iter(enumerate(asks))
    stalled: list[str] = []  # why this round asks no more
    headers = {"Accept-Encoding": "identity", "User-Agent": "reconciler-daemon"}
    limits = httpx.Limits(max_connections=concurrency)

    async with httpx.AsyncClient(
        verify=tls, timeout=timeout, limits=limits, headers=headers, follow_redirects=False
    ) as client:

        async def worker() -> None:
            for i, ask in todo:
                if stalled:
                    replies[i] = NoAnswer(f"not asked: {stalled[0]} in this round")
                    continue
                reply = replies[i] = await _ask(client, ask, timeout, max_bytes)
                if isinstance(reply, NoAnswer) and reply.timed_out:
                    stalled.append(f"{ask.endpoint} did not answer within {timeout:g}s")

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(asks)))))
    return replies


async def _ask(client: httpx.AsyncClient, ask: Ask, timeout: float, max_bytes: int) -> Reply:
    try:
        request = client.build_request(
            ask.method, ask.url, content=ask.content, headers=list(ask.headers)
        )
        async with asyncio.timeout(timeout):
            response = await client.send(request, stream=True)
            try:
                body = await _read_capped(response, max_bytes)
            finally:
                await response.aclose()
    except (TimeoutError, httpx.TimeoutException):  # httpx's: per read, within the deadline
        return NoAnswer(f"no whole answer from {ask.endpoint} within {timeout:g}s", True)
    except _CutOff as exc:
        return NoAnswer(f"{ask.endpoint} answered {exc}; cut off")
    except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as exc:  # ValueError: IDNA
        return NoAnswer(f"cannot reach {ask.endpoint}: {str(exc) or type(exc).__name__}")
    return Answered(response.status_code, body)


async def _read_capped(response: httpx.Response, max_bytes: int) -> bytes:
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise _CutOff(f"a {encoding}-encoded body it was not asked for")
    declared = response.headers.get("Content-Length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > max_bytes:
        raise _CutOff(f"a body of {declared} bytes, over {max_bytes}")
    body = bytearray()
    async for chunk in response.aiter_raw(CHUNK_BYTES):
        body += chunk
        if len(body) > max_bytes:
            raise _CutOff(f"a body over {max_bytes} bytes")
    return bytes(body)


def json_of(body: bytes) -> Any:
    """The body as JSON, or None when it is not: not UTF-8, not JSON, or
    nested deeper than the parser recurses (a few kilobytes of ``[``)."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None
