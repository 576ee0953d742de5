"""Asks Prometheus the rollouts' ``prometheus`` checks (docs/health.md): instant queries, ``GET URL/api/v1/query?query=...``, many at once with
bounded concurrency, each answer within a deadline and a size cap
(``outside_http``), each answered as a ``MetricAnswer``.

Every failure is an answer, never an exception: a connection error, an
answer not whole within the deadline or over the cap, a 5xx or a body we
cannot use is ``error`` (no evidence); a query Prometheus refuses (HTTP 400 or 422, ``bad_data``) is ``rejected`` as well,
so status can name it. Identical queries in one round are asked once.

Must not: decide anything (``engine.health_evidence`` judges the answers).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx

from reconciler.daemon import outside_http
from reconciler.daemon.outside_http import Answered, Ask, OutsideHttp, json_of
from reconciler.protocol.observations import MetricAnswer

DEFAULT_CONCURRENCY = 8
DEFAULT_TIMEOUT = 5.0  # seconds for a whole answer, connect to last byte


class PrometheusClient:
    def __init__(
        self,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        timeout: float = DEFAULT_TIMEOUT,
        max_bytes: int = outside_http.MAX_BODY_BYTES,
    ) -> None:
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.http = OutsideHttp()

    def query_all(self, base_url: str, queries: Iterable[str]) -> dict[str, MetricAnswer]:
        """Each distinct query's answer, by query text."""
        distinct = list(dict.fromkeys(queries))
        if not distinct:
            return {}
        endpoint = base_url.rstrip("/") + "/api/v1/query"
        try:
            asks = [Ask(endpoint, str(httpx.URL(endpoint, params={"query": q}))) for q in distinct]
        except httpx.InvalidURL as exc:
            return {q: MetricAnswer(error=f"cannot reach {endpoint}: {exc}") for q in distinct}
        replies = self.http.ask_all(
            asks, timeout=self.timeout, concurrency=self.concurrency, max_bytes=self.max_bytes
        )
        return {q: _answer(endpoint, r) for q, r in zip(distinct, replies, strict=True)}


def _answer(endpoint: str, reply: outside_http.Reply) -> MetricAnswer:
    if not isinstance(reply, Answered):
        return MetricAnswer(error=reply.reason)
    body = json_of(reply.body)
    if reply.status in (400, 422):
        why = error_text(body) or reply.body[:200].decode(errors="replace")
        return MetricAnswer(error=why, rejected=True)
    if reply.status != 200 or not isinstance(body, dict):
        why = error_text(body) or f"HTTP {reply.status}"
        return MetricAnswer(error=f"{endpoint} answered {why}")
    return parse_result(body)


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
