"""Asks Prometheus the rollouts' ``prometheus`` checks (docs/health.md): instant queries, ``GET URL/api/v1/query?query=...``, many at once with
bounded concurrency and a timeout, each answered as a ``MetricAnswer``.

Every failure is an answer, never an exception: a connection error, a
timeout, a 5xx or a body we cannot use is ``error`` (no evidence); a query
Prometheus refuses (HTTP 400 or 422, ``bad_data``) is ``rejected`` as well,
so status can name it. Identical queries in one round are asked once.

Must not: decide anything (``engine.health_evidence`` judges the answers).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from reconciler.protocol.observations import MetricAnswer

DEFAULT_CONCURRENCY = 8
DEFAULT_TIMEOUT = 5.0  # seconds per query


class PrometheusClient:
    def __init__(
        self, *, concurrency: int = DEFAULT_CONCURRENCY, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self.concurrency = concurrency
        self.timeout = timeout
        self._client: httpx.Client | None = None

    def query_all(self, base_url: str, queries: Iterable[str]) -> dict[str, MetricAnswer]:
        """Each distinct query's answer, by query text."""
        distinct = list(dict.fromkeys(queries))
        if not distinct:
            return {}
        if self._client is None:
            limits = httpx.Limits(max_connections=self.concurrency)
            self._client = httpx.Client(timeout=self.timeout, limits=limits)
        endpoint = base_url.rstrip("/") + "/api/v1/query"
        if len(distinct) == 1:
            return {distinct[0]: self.query(endpoint, distinct[0])}
        # Threads for this round only: nothing is left running between passes.
        workers = min(self.concurrency, len(distinct))
        with ThreadPoolExecutor(workers, thread_name_prefix="prometheus") as pool:
            answers = list(pool.map(lambda q: self.query(endpoint, q), distinct))
        return dict(zip(distinct, answers, strict=True))

    def query(self, endpoint: str, query: str) -> MetricAnswer:
        assert self._client is not None
        try:
            response = self._client.get(endpoint, params={"query": query})
        except httpx.TimeoutException:
            return MetricAnswer(error=f"no answer from {endpoint} within {self.timeout:g}s")
        except httpx.HTTPError as exc:
            return MetricAnswer(error=f"cannot reach {endpoint}: {exc}")
        try:
            body: Any = response.json()
        except (ValueError, json.JSONDecodeError):
            body = None
        if response.status_code in (400, 422):
            why = error_text(body) or response.text[:200]
            return MetricAnswer(error=why, rejected=True)
        if response.status_code != 200 or not isinstance(body, dict):
            why = error_text(body) or f"HTTP {response.status_code}"
            return MetricAnswer(error=f"{endpoint} answered {why}")
        return parse_result(body)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def error_text(body: Any) -> str:
    """Prometheus's own words for an error answer (``errorType: error``), or ""."""
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        kind = body.get("errorType")
        return f"{kind}: {body['error']}" if isinstance(kind, str) else str(body["error"])
    return ""


def _labels(metric: Any) -> str:
    if not isinstance(metric, dict) or not metric:
        return ""
    pairs = ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
    return f"{metric.get('__name__', '')}{{{pairs}}}"


def parse_result(body: dict[str, Any]) -> MetricAnswer:
    """A successful ``/api/v1/query`` body as samples: a vector's samples
    or a scalar; anything else is no evidence, saying why."""
    data = body.get("data")
    if body.get("status") != "success" or not isinstance(data, dict):
        return MetricAnswer(error=error_text(body) or "an answer without data")
    kind, result = data.get("resultType"), data.get("result")
    try:
        if kind == "vector" and isinstance(result, list):
            return MetricAnswer(
                samples=tuple((_labels(s.get("metric")), float(s["value"][1])) for s in result)
            )
        if kind == "scalar" and isinstance(result, list):
            return MetricAnswer(samples=(("", float(result[1])),))
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return MetricAnswer(error="a result whose samples are not numbers")
    return MetricAnswer(error=f"a {kind} result: the query must give an instant vector")
