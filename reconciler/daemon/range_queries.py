"""Asks Prometheus the range queries of the rollouts' comparisons
(docs/health.md): ``GET URL/api/v1/query_range?query=...&start=...&end=...&step=...``,
many at once with bounded concurrency and a timeout; identical queries
(same text, window and step) in one round are asked once.

Every failure is an answer, never an exception: a connection error, a
timeout, an HTTP error or a body we cannot use is a ``RangeAnswer`` with
``error`` (no evidence).

Must not: decide anything (``canary_verdicts`` judges the samples).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

DEFAULT_CONCURRENCY = 8
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
        if self._client is None:
            limits = httpx.Limits(max_connections=self.concurrency)
            self._client = httpx.Client(timeout=self.timeout, limits=limits)
        endpoint = base_url.rstrip("/") + "/api/v1/query_range"
        if len(distinct) == 1:
            return {distinct[0]: self.ask(endpoint, distinct[0])}
        # Threads for this round only: nothing is left running between passes.
        workers = min(self.concurrency, len(distinct))
        with ThreadPoolExecutor(workers, thread_name_prefix="query-range") as pool:
            answers = list(pool.map(lambda q: self.ask(endpoint, q), distinct))
        return dict(zip(distinct, answers, strict=True))

    def ask(self, endpoint: str, query: RangeQuery) -> RangeAnswer:
        assert self._client is not None
        params = {
            "query": query.query,
            "start": f"{query.start.timestamp():.3f}",
            "end": f"{query.end.timestamp():.3f}",
            "step": str(query.step),
        }
        try:
            response = self._client.get(endpoint, params=params)
        except httpx.TimeoutException:
            return RangeAnswer(error=f"no answer from {endpoint} within {self.timeout:g}s")
        except httpx.HTTPError as exc:
            return RangeAnswer(error=f"cannot reach {endpoint}: {exc}")
        try:
            body: Any = response.json()
        except (ValueError, json.JSONDecodeError):
            body = None
        if response.status_code != 200 or not isinstance(body, dict):
            why = _error_text(body) or f"HTTP {response.status_code}"
            return RangeAnswer(error=f"{endpoint} answered {why}")
        return parse_matrix(body)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


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
