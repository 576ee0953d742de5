"""Asks Prometheus the range queries of the rollouts' comparisons
(docs/health.md): ``GET URL/api/v1/query_range?query=...&start=...&end=...&step=...``,
many at once with bounded concurrency and a timeout; identical queries
(same text, window and step) in one round are asked once.

A judging pass asks thousands (three per node of a batch and of its
baseline), so over ``http`` a round goes through the daemon's own h11
client (``agent_http``) on one event loop: ``concurrency`` keep-alive
connections, each reused for the whole round, at a fraction of httpx's CPU
per request. A round in which one query times out asks no more, as
Prometheus is then not answering (the rest are errors at once).
``https`` goes through httpx, which checks the certificate against the
system's trust store (the h11 client only knows pinned agent certificates).

Every failure is an answer, never an exception: a connection error, a
timeout, an HTTP error or a body we cannot use is a ``RangeAnswer`` with
``error`` (no evidence).

Must not: decide anything (``canary_verdicts`` judges the samples).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote_plus, urlsplit

import httpx

from reconciler.daemon.agent_http import HttpClient, Unreachable

DEFAULT_CONCURRENCY = 16  # Prometheus is the wait: it evaluates queries on all its cores
DEFAULT_TIMEOUT = 5.0  # seconds per query


@dataclass(frozen=True)
class RangeQuery:
    query: str
    start: datetime
    end: datetime
    step: int  # seconds


@dataclass(frozen=True)
class RangeAnswer:
    """Each series' samples, ``(unix time, value)`` in time order; or why none."""

    series: tuple[tuple[tuple[float, float], ...], ...] = ()
    error: str = ""

    def values(self) -> list[float]:
        """Every sample of every series, pooled."""
        return [v for one in self.series for _, v in one]

    def by_time(self) -> dict[float, float]:
        """The sum over the series at each step (a count over its labels)."""
        summed: dict[float, float] = {}
        for one in self.series:
            for t, v in one:
                summed[t] = summed.get(t, 0.0) + v
        return summed


class RangeQueries:
    def __init__(
        self, *, concurrency: int = DEFAULT_CONCURRENCY, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self.concurrency = concurrency
        self.timeout = timeout
        self._client: httpx.Client | None = None

    def ask_all(
        self, base_url: str, queries: Iterable[RangeQuery]
    ) -> dict[RangeQuery, RangeAnswer]:
        """Each distinct query's answer."""
        distinct = list(dict.fromkeys(queries))
        if not distinct:
            return {}
        why = _url_problem(base_url)
        if why:
            return {q: RangeAnswer(error=why) for q in distinct}
        if base_url.startswith("https:"):
            return self._ask_all_httpx(base_url, distinct)
        answers = asyncio.run(self._ask_all_h11(base_url, distinct))
        return dict(zip(distinct, answers, strict=True))

    async def _ask_all_h11(
        self, base_url: str, distinct: Sequence[RangeQuery]
    ) -> list[RangeAnswer]:
        # A client for this round only: its connections belong to this loop.
        client = HttpClient(self.timeout, self.concurrency)
        answers: list[RangeAnswer] = [RangeAnswer()] * len(distinct)
        todo: Iterator[tuple[int, RangeQuery]] = iter(enumerate(distinct))

        async def worker() -> None:
            for i, query in todo:
                answers[i] = await self._ask_h11(client, base_url, query)

        workers = min(self.concurrency, len(distinct))
        try:
            await asyncio.gather(*(worker() for _ in range(workers)))
        finally:
            client.close()
        return answers

    async def _ask_h11(self, client: HttpClient, base_url: str, query: RangeQuery) -> RangeAnswer:
        endpoint = base_url.rstrip("/") + "/api/v1/query_range"
        path = "/api/v1/query_range?" + _query_string(query)
        try:
            status, body = await client.request(base_url.rstrip("/"), "GET", path)
        except Unreachable as exc:
            return RangeAnswer(error=f"cannot reach {endpoint}: {exc}")
        return _answer(endpoint, status, body)

    def _ask_all_httpx(
        self, base_url: str, distinct: Sequence[RangeQuery]
    ) -> dict[RangeQuery, RangeAnswer]:
        if self._client is None:
            limits = httpx.Limits(max_connections=self.concurrency)
            self._client = httpx.Client(timeout=self.timeout, limits=limits)
        endpoint = base_url.rstrip("/") + "/api/v1/query_range"
        # Threads for this round only: nothing is left running between passes.
        workers = min(self.concurrency, len(distinct))
        with ThreadPoolExecutor(workers, thread_name_prefix="query-range") as pool:
            answers = list(pool.map(lambda q: self.ask(endpoint, q), distinct))
        return dict(zip(distinct, answers, strict=True))

    def ask(self, endpoint: str, query: RangeQuery) -> RangeAnswer:
        """One query through httpx (https)."""
        assert self._client is not None
        try:
            response = self._client.get(endpoint, params=_params(query))
        except httpx.TimeoutException:
            return RangeAnswer(error=f"no answer from {endpoint} within {self.timeout:g}s")
        except httpx.HTTPError as exc:
            return RangeAnswer(error=f"cannot reach {endpoint}: {exc}")
        return _answer(endpoint, response.status_code, response.content)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _url_problem(url: str) -> str:
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 (raises on a port that is not one)
    except ValueError as exc:
        return f"settings.spec.prometheus.url {url!r}: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"settings.spec.prometheus.url {url!r} is not an http(s) URL"
    return ""


def _params(query: RangeQuery) -> dict[str, str]:
    return {
        "query": query.query,
        "start": f"{query.start.timestamp():.3f}",
        "end": f"{query.end.timestamp():.3f}",
        "step": str(query.step),
    }


def _query_string(query: RangeQuery) -> str:
    # The same as urlencode(_params(query)), quoting only the query's text.
    return (
        f"query={quote_plus(query.query)}&start={query.start.timestamp():.3f}"
        f"&end={query.end.timestamp():.3f}&step={query.step}"
    )


def _answer(endpoint: str, status: int, content: bytes) -> RangeAnswer:
    try:
        body: Any = json.loads(content)
    except ValueError:  # not JSON, or not UTF-8
        body = None
    if status != 200 or not isinstance(body, dict):
        why = _error_text(body) or f"HTTP {status}"
        return RangeAnswer(error=f"{endpoint} answered {why}")
    return parse_matrix(body)


def _error_text(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        kind = body.get("errorType")
        return f"{kind}: {body['error']}" if isinstance(kind, str) else str(body["error"])
    return ""


def parse_matrix(body: dict[str, Any]) -> RangeAnswer:
    """A successful ``/api/v1/query_range`` body as series of samples;
    samples that are not numbers (NaN, as a quantile of nothing gives) are
    left out."""
    data = body.get("data")
    if body.get("status") != "success" or not isinstance(data, dict):
        return RangeAnswer(error=_error_text(body) or "an answer without data")
    if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        return RangeAnswer(error=f"a {data.get('resultType')} result: expected a matrix")
    series = []
    try:
        for one in data["result"]:
            points = ((float(t), float(v)) for t, v in one["values"])
            series.append(tuple(p for p in points if math.isfinite(p[1])))
    except (KeyError, TypeError, ValueError, AttributeError):
        return RangeAnswer(error="a result whose samples are not numbers")
    return RangeAnswer(series=tuple(series))
