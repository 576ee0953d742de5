"""Asks Alertmanager for the alerts of the rollouts' ``health.alerts``
(docs/health.md): API v2, ``GET URL/api/v2/alerts?active=true&silenced=false&inhibited=false&filter=M...``,
one request per distinct list of matchers, each answered as an ``AlertAnswer``.

Every failure is an answer, never an exception: a connection error, a
timeout, a 5xx or a body we cannot use is ``error`` (no evidence, no new
batch); matchers Alertmanager refuses (HTTP 400) are ``rejected``, with its
message, so status can name them.

Must not: decide anything (``engine.comparisons`` judges the alerts).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx

from reconciler.protocol.canary_observations import AlertAnswer, FiringAlert

DEFAULT_TIMEOUT = 5.0  # seconds


class AlertmanagerClient:
    def __init__(self, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        self._client: httpx.Client | None = None

    def ask_all(
        self, base_url: str, matchers: Iterable[tuple[str, ...]]
    ) -> dict[tuple[str, ...], AlertAnswer]:
        """Each distinct list of matchers' answer."""
        return {m: self.ask(base_url, m) for m in dict.fromkeys(matchers)}

    def ask(self, base_url: str, matchers: tuple[str, ...]) -> AlertAnswer:
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout)
        endpoint = base_url.rstrip("/") + "/api/v2/alerts"
        params = httpx.QueryParams({"active": "true", "silenced": "false", "inhibited": "false"})
        for matcher in matchers:
            params = params.add("filter", matcher)
        try:
            response = self._client.get(endpoint, params=params)
        except httpx.TimeoutException:
            return AlertAnswer(error=f"no answer from {endpoint} within {self.timeout:g}s")
        except httpx.HTTPError as exc:
            return AlertAnswer(error=f"cannot reach {endpoint}: {exc}")
        if response.status_code == 400:
            return AlertAnswer(rejected=_message(response))
        if response.status_code != 200:
            return AlertAnswer(error=f"{endpoint} answered HTTP {response.status_code}")
        try:
            return AlertAnswer(alerts=parse_alerts(response.json()))
        except (ValueError, TypeError, KeyError, AttributeError):
            return AlertAnswer(error=f"{endpoint} answered a body that is not a list of alerts")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _message(response: httpx.Response) -> str:
    try:
        body: Any = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    if isinstance(body, str):
        return body
    return response.text.strip()[:300] or "HTTP 400"


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
