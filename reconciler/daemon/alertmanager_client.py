"""Asks Alertmanager for the alerts of the rollouts' ``health.alerts``
(docs/health.md): API v2, ``GET URL/api/v2/alerts?active=true&silenced=false&inhibited=false&filter=M...``,
one request per distinct list of matchers, each answer within a deadline and
a size cap (``outside_http``), each answered as an ``AlertAnswer``.

Every failure is an answer, never an exception: a connection error, an
answer not whole within the deadline or over the cap, a 5xx or a body we
cannot use is ``error`` (no evidence, no new batch); matchers Alertmanager refuses (HTTP 400) are ``rejected``, with its
message, so status can name them.

Must not: decide anything (``engine.comparisons`` judges the alerts).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx

from reconciler.daemon import outside_http
from reconciler.daemon.outside_http import Answered, Ask, OutsideHttp, json_of
from reconciler.protocol.canary_observations import AlertAnswer, FiringAlert

DEFAULT_TIMEOUT = 5.0  # seconds for a whole answer, connect to last byte
DEFAULT_CONCURRENCY = 4


class AlertmanagerClient:
    def __init__(
        self,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        concurrency: int = DEFAULT_CONCURRENCY,
        max_bytes: int = outside_http.MAX_BODY_BYTES,
    ) -> None:
        self.timeout = timeout
        self.concurrency = concurrency
        self.max_bytes = max_bytes
        self.http = OutsideHttp()

    def ask_all(
        self, base_url: str, matchers: Iterable[tuple[str, ...]]
    ) -> dict[tuple[str, ...], AlertAnswer]:
        """Each distinct list of matchers' answer, all asked at once."""
        distinct = list(dict.fromkeys(matchers))
        if not distinct:
            return {}
        endpoint = base_url.rstrip("/") + "/api/v2/alerts"
        try:
            asks = [Ask(endpoint, str(httpx.URL(endpoint, params=_params(m)))) for m in distinct]
        except httpx.InvalidURL as exc:
            return {m: AlertAnswer(error=f"cannot reach {endpoint}: {exc}") for m in distinct}
        replies = self.http.ask_all(
            asks, timeout=self.timeout, concurrency=self.concurrency, max_bytes=self.max_bytes
        )
        return {m: _answer(endpoint, r) for m, r in zip(distinct, replies, strict=True)}


def _params(matchers: tuple[str, ...]) -> httpx.QueryParams:
    params = httpx.QueryParams({"active": "true", "silenced": "false", "inhibited": "false"})
    for matcher in matchers:
        params = params.add("filter", matcher)
    return params


def _answer(endpoint: str, reply: outside_http.Reply) -> AlertAnswer:
    if not isinstance(reply, Answered):
        return AlertAnswer(error=reply.reason)
    if reply.status == 400:
        return AlertAnswer(rejected=_message(reply.body))
    if reply.status != 200:
        return AlertAnswer(error=f"{endpoint} answered HTTP {reply.status}")
    try:
        return AlertAnswer(alerts=parse_alerts(json_of(reply.body)))
    except (ValueError, TypeError, KeyError, AttributeError):
        return AlertAnswer(error=f"{endpoint} answered a body that is not a list of alerts")


def _message(content: bytes) -> str:
    body = json_of(content)
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    if isinstance(body, str):
        return body
    return content.decode(errors="replace").strip()[:300] or "HTTP 400"


def parse_alerts(body: Any) -> tuple[FiringAlert, ...]:
    """API v2's list of gettable alerts, each with its labels and startsAt."""
    if not isinstance(body, list):
        raise TypeError("not a list")
    out = []
    for alert in body:
        labels = {str(k): str(v) for k, v in alert["labels"].items()}
        out.append(
            FiringAlert(
                alertname=labels.get("alertname", ""),
                labels=tuple(sorted(labels.items())),
                starts_at=str(alert.get("startsAt", "")),
            )
        )
    return tuple(sorted(out, key=lambda a: (a.starts_at, a.alertname, a.labels)))
