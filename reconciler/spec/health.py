"""A rollout's health checks and soak (docs/health.md), as values, and
their plain-data forms: the record kept in status (``frozen.health``) and
the agent checks a signed job carries (``checks`` in the payload).

``http`` and ``tcp`` checks are probed by the agent on the node;
``prometheus`` checks are asked by the daemon. ``{node}`` in a URL, a host
or a query stands for the node's name and is replaced per node.

Pure: no IO, no clock.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.spec import compare as compare_rules
from reconciler.spec.compare import Alerts, Comparison
from reconciler.spec.durations import format_duration, parse_duration

DEFAULT_SOAK = 0  # seconds
DEFAULT_FAILURE_THRESHOLD = 3
DEFAULT_INTERVAL = 10  # seconds
DEFAULT_HTTP_TIMEOUT = 5  # seconds
DEFAULT_TCP_TIMEOUT = 2  # seconds
DEFAULT_EXPECT_STATUS = 200

AGENT_KINDS = ("http", "tcp")
CHECK_KINDS = (*AGENT_KINDS, "prometheus")
NODE_PLACEHOLDER = "{node}"
LOCAL_HOST_RULE = (
    "a loopback address (127.0.0.1, ::1, localhost) or {node}, the node itself as the agent sees it"
)


@dataclass(frozen=True)
class HttpProbe:
    url: str
    expect_status: int = DEFAULT_EXPECT_STATUS
    body_contains: str = ""
    timeout: int = DEFAULT_HTTP_TIMEOUT  # seconds


@dataclass(frozen=True)
class TcpProbe:
    host: str
    port: int
    timeout: int = DEFAULT_TCP_TIMEOUT  # seconds


@dataclass(frozen=True)
class PrometheusQuery:
    query: str
    max: float | None = None
    min: float | None = None

    def holds(self, value: float) -> bool:
        """Whether one sample is within the bounds."""
        if value != value:  # NaN is never within bounds
            return False
        return (self.max is None or value <= self.max) and (self.min is None or value >= self.min)

    def bounds(self) -> str:
        parts = [f"min {self.min:g}" if self.min is not None else ""]
        parts.append(f"max {self.max:g}" if self.max is not None else "")
        return ", ".join(p for p in parts if p)


@dataclass(frozen=True)
class HealthCheck:
    """One named check; exactly one of ``http``, ``tcp``, ``prometheus``."""

    name: str
    http: HttpProbe | None = None
    tcp: TcpProbe | None = None
    prometheus: PrometheusQuery | None = None

    @property
    def kind(self) -> str:
        if self.http is not None:
            return "http"
        if self.tcp is not None:
            return "tcp"
        return "prometheus"

    @property
    def by_agent(self) -> bool:
        return self.kind in AGENT_KINDS

    def describe(self) -> str:
        """One line for people (plan, status)."""
        if self.http is not None:
            extra = (
                f", body contains {self.http.body_contains!r}" if self.http.body_contains else ""
            )
            return f"{self.name}: http {self.http.url} expects {self.http.expect_status}{extra}"
        if self.tcp is not None:
            return f"{self.name}: tcp {self.tcp.host}:{self.tcp.port}"
        assert self.prometheus is not None
        return f"{self.name}: prometheus {self.prometheus.query} ({self.prometheus.bounds()})"


@dataclass(frozen=True)
class Health:
    soak: int = DEFAULT_SOAK  # seconds
    failure_threshold: int = DEFAULT_FAILURE_THRESHOLD
    interval: int = DEFAULT_INTERVAL  # seconds
    checks: tuple[HealthCheck, ...] = ()
    compare: tuple[Comparison, ...] = ()  # against the node's own fleet
    alerts: Alerts | None = None

    @property
    def agent_checks(self) -> tuple[HealthCheck, ...]:
        return tuple(c for c in self.checks if c.by_agent)

    @property
    def prometheus_checks(self) -> tuple[HealthCheck, ...]:
        return tuple(c for c in self.checks if c.prometheus is not None)

    def describe(self) -> str:
        return (
            f"soak {format_duration(self.soak)}, {len(self.checks)} check(s) every "
            f"{format_duration(self.interval)}, failing after {self.failure_threshold} "
            "consecutive failures"
        )


def for_node(text: str, node: str) -> str:
    return text.replace(NODE_PLACEHOLDER, node)


# -- the rules of one document's health block ---------------------------------

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.", NODE_PLACEHOLDER})


def is_local_host(host: str) -> bool:
    """A loopback address, ``localhost`` or the ``{node}`` placeholder."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# scheme://host[:port][/path...]; the host may be [IPv6]. No urllib: the
# engine imports this module and must not import I/O libraries.
_HTTP_URL = re.compile(
    r"^([A-Za-z][A-Za-z0-9+.-]*)://(\[[^\]/]+\]|[^/:?#\s\[\]@]*)(?::([0-9]*))?([/?#]\S*)?$"
)


def http_url_problem(url: str) -> str:
    """Empty when ``url`` is one an agent may probe; else what to fix."""
    match = _HTTP_URL.match(url)
    if match is None or match.group(1).lower() not in ("http", "https"):
        return f"must be an http:// or https:// URL, got {url!r}"
    host, port = match.group(2), match.group(3)
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        return f"has no valid port: {url!r}"
    if not host:
        return f"has no host: {url!r}"
    if not is_local_host(host):
        return (
            f"an agent probes only its own node: the host {host!r} must be {LOCAL_HOST_RULE}; "
            "for another service, ask it through a prometheus check"
        )
    return ""


def duplicate_names(checks: list[Any]) -> list[tuple[int, str]]:
    """(index, name) of each check whose name an earlier check has."""
    seen: set[str] = set()
    found = []
    for index, check in enumerate(checks):
        name = check.get("name") if isinstance(check, dict) else None
        if isinstance(name, str):
            if name in seen:
                found.append((index, name))
            seen.add(name)
    return found


# -- plain data ----------------------------------------------------------------


def from_document(value: Mapping[str, Any]) -> Health:
    """``spec.health`` of a rollout document the schema and ``documents``
    have checked (durations parse, names unique)."""
    checks = []
    for item in value.get("checks", ()):
        http, tcp, prom = item.get("http"), item.get("tcp"), item.get("prometheus")
        checks.append(
            HealthCheck(
                name=item["name"],
                http=None
                if http is None
                else HttpProbe(
                    url=http["url"],
                    expect_status=http.get("expectStatus", DEFAULT_EXPECT_STATUS),
                    body_contains=http.get("bodyContains", ""),
                    timeout=_seconds(http.get("timeout"), DEFAULT_HTTP_TIMEOUT),
                ),
                tcp=None
                if tcp is None
                else TcpProbe(
                    host=tcp["host"],
                    port=tcp["port"],
                    timeout=_seconds(tcp.get("timeout"), DEFAULT_TCP_TIMEOUT),
                ),
                prometheus=None
                if prom is None
                else PrometheusQuery(
                    query=prom["query"],
                    max=None if prom.get("max") is None else float(prom["max"]),
                    min=None if prom.get("min") is None else float(prom["min"]),
                ),
            )
        )
    soak = value.get("soak")
    return Health(
        soak=parse_soak(soak) if isinstance(soak, str) else DEFAULT_SOAK,
        failure_threshold=value.get("failureThreshold", DEFAULT_FAILURE_THRESHOLD),
        interval=_seconds(value.get("interval"), DEFAULT_INTERVAL),
        checks=tuple(checks),
        compare=compare_rules.from_document(value.get("compare")),
        alerts=compare_rules.alerts_from_document(value.get("alerts")),
    )


_ZERO = re.compile(r"^(?:0+[smh])+$")


def parse_soak(text: str) -> int:
    """A soak may be zero (the default): only the checks' first success then."""
    return 0 if _ZERO.match(text) else parse_duration(text)


def _seconds(text: Any, default: int) -> int:
    return parse_duration(text) if isinstance(text, str) else default


def to_document(health: Health) -> dict[str, Any]:
    """The document form, every default written out (the status record)."""
    checks: list[dict[str, Any]] = []
    for c in health.checks:
        item: dict[str, Any] = {"name": c.name}
        if c.http is not None:
            item["http"] = {
                "url": c.http.url,
                "expectStatus": c.http.expect_status,
                "bodyContains": c.http.body_contains,
                "timeout": format_duration(c.http.timeout),
            }
        elif c.tcp is not None:
            item["tcp"] = {
                "host": c.tcp.host,
                "port": c.tcp.port,
                "timeout": format_duration(c.tcp.timeout),
            }
        else:
            assert c.prometheus is not None
            prom: dict[str, Any] = {"query": c.prometheus.query}
            if c.prometheus.max is not None:
                prom["max"] = c.prometheus.max
            if c.prometheus.min is not None:
                prom["min"] = c.prometheus.min
            item["prometheus"] = prom
        checks.append(item)
    out: dict[str, Any] = {
        "soak": format_duration(health.soak),
        "failureThreshold": health.failure_threshold,
        "interval": format_duration(health.interval),
        "checks": checks,
    }
    # Written only when declared, so version 2's records stay as they were.
    if health.compare:
        out["compare"] = compare_rules.to_document(health.compare)
    if health.alerts is not None:
        out["alerts"] = compare_rules.alerts_to_document(health.alerts)
    return out


def to_payload(health: Health, node: str) -> list[dict[str, Any]]:
    """The agent checks a live apply job carries, ``{node}`` replaced:
    ``[{name, intervalSeconds, http: {url, expectStatus, bodyContains,
    timeoutSeconds}} | {..., tcp: {host, port, timeoutSeconds}}]``."""
    out: list[dict[str, Any]] = []
    for c in health.agent_checks:
        item: dict[str, Any] = {"name": c.name, "intervalSeconds": health.interval}
        if c.http is not None:
            item["http"] = {
                "url": for_node(c.http.url, node),
                "expectStatus": c.http.expect_status,
                "bodyContains": c.http.body_contains,
                "timeoutSeconds": c.http.timeout,
            }
        else:
            assert c.tcp is not None
            item["tcp"] = {
                "host": for_node(c.tcp.host, node),
                "port": c.tcp.port,
                "timeoutSeconds": c.tcp.timeout,
            }
        out.append(item)
    return out
