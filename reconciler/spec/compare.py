"""A rollout's comparisons against its own fleet and its alert matchers
(``health.compare`` and ``health.alerts``, docs/health.md), as values, and
their document forms: the record kept in status (``frozen.health``).

A ``query`` comparison judges a quantity (its samples' medians); an
``errors``/``total`` comparison judges a rate (errors over total). ``{node}``
in a query stands for the node's name, as in the health checks.

Pure: no IO, no clock, no statistics (those are judged elsewhere).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_WORSE = "higher"
DEFAULT_MIN_SAMPLES = 10
LEAST_SAMPLES = 3
DEFAULT_NODE_LABEL = "node"
ALERTS_CHECK = "alerts"  # the check a node fails under when an alert names it

_PERCENT = re.compile(r"^([0-9]+(?:\.[0-9]+)?)%$")
PERCENT_RULE = "must be a percentage such as 10% or 0.5%"


@dataclass(frozen=True)
class Comparison:
    """One comparison; exactly one of ``query`` or ``errors`` (with ``total``)."""

    name: str
    tolerance: float  # a fraction: 0.1 for 10%
    query: str = ""
    errors: str = ""
    total: str = ""
    worse: str = DEFAULT_WORSE  # higher | lower: which way is a regression
    min_samples: int = DEFAULT_MIN_SAMPLES  # per side
    baseline: tuple[tuple[str, str], ...] | None = None  # a selector; None: the default

    @property
    def kind(self) -> str:
        return "query" if self.query else "errors"

    def describe(self) -> str:
        """One line for people (plan, status)."""
        tolerance = format_percent(self.tolerance)
        if self.query:
            what = f"median {self.worse} is worse, tolerance {tolerance}"
            return f"{self.name}: compare {self.query} ({what})"
        return f"{self.name}: compare rate {self.errors} / {self.total} (tolerance {tolerance})"


@dataclass(frozen=True)
class Alerts:
    matchers: tuple[str, ...]
    node_label: str = DEFAULT_NODE_LABEL


def parse_percent(text: Any) -> float | None:
    """``10%`` as 0.1; None when ``text`` is not a percentage."""
    match = _PERCENT.match(text) if isinstance(text, str) else None
    return float(match.group(1)) / 100 if match else None


def format_percent(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def problems(compare: Any, check_names: set[str]) -> list[tuple[list[str | int], str]]:
    """(field path under ``health.compare``, message) for each rule the
    schema cannot say: a tolerance that is a percentage above 0, ``errors``
    and ``total`` together, names unique across checks and comparisons."""
    found: list[tuple[list[str | int], str]] = []
    if not isinstance(compare, list):
        return found
    seen = set(check_names) | {ALERTS_CHECK}
    for index, item in enumerate(compare):
        if not isinstance(item, dict):
            continue
        name = item.get("name")
        if isinstance(name, str):
            if name in seen:
                found.append(
                    (
                        [index, "name"],
                        f"name {json.dumps(name)} is already used by a check, a comparison or the "
                        f"alerts check: give each comparison its own name",
                    )
                )
            seen.add(name)
        if "tolerance" in item:
            tolerance = parse_percent(item["tolerance"])
            if tolerance is None:
                found.append(
                    ([index, "tolerance"], f"{PERCENT_RULE}; got {_shown(item['tolerance'])}")
                )
            elif tolerance <= 0:
                found.append(
                    (
                        [index, "tolerance"],
                        "must be more than 0%: a tolerance of 0 fails a node for any "
                        "difference at all",
                    )
                )
        if "errors" in item and "total" not in item:
            found.append(
                (
                    [index, "errors"],
                    "errors needs total: the query of all requests the error rate is taken of",
                )
            )
        if "total" in item and "errors" not in item:
            found.append(([index, "total"], "total goes with errors: add errors, or remove total"))
    return found


def _shown(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value)


def from_document(value: Any) -> tuple[Comparison, ...]:
    """``health.compare`` of a document the schema and ``problems`` passed."""
    out = []
    for item in value or ():
        selector = (item.get("baseline") or {}).get("selector")
        out.append(
            Comparison(
                name=item["name"],
                tolerance=parse_percent(item["tolerance"]) or 0.0,
                query=item.get("query", ""),
                errors=item.get("errors", ""),
                total=item.get("total", ""),
                worse=item.get("worse", DEFAULT_WORSE),
                min_samples=item.get("minSamples", DEFAULT_MIN_SAMPLES),
                baseline=None if selector is None else tuple(sorted(selector.items())),
            )
        )
    return tuple(out)


def alerts_from_document(value: Mapping[str, Any] | None) -> Alerts | None:
    if value is None:
        return None
    return Alerts(
        matchers=tuple(value["matchers"]),
        node_label=value.get("nodeLabel", DEFAULT_NODE_LABEL),
    )


def to_document(compare: tuple[Comparison, ...]) -> list[dict[str, Any]]:
    """The document form, every default written out (the status record)."""
    out: list[dict[str, Any]] = []
    for c in compare:
        item: dict[str, Any] = {"name": c.name}
        if c.query:
            item["query"] = c.query
            item["worse"] = c.worse
        else:
            item["errors"] = c.errors
            item["total"] = c.total
        item["tolerance"] = format_percent(c.tolerance)
        item["minSamples"] = c.min_samples
        if c.baseline is not None:
            item["baseline"] = {"selector": dict(c.baseline)}
        out.append(item)
    return out


def alerts_to_document(alerts: Alerts) -> dict[str, Any]:
    return {"matchers": list(alerts.matchers), "nodeLabel": alerts.node_label}


@dataclass(frozen=True)
class FiringAlert:
    """An active alert as Alertmanager showed it."""

    alertname: str
    labels: tuple[tuple[str, str], ...]
    starts_at: str  # RFC 3339, as Alertmanager gave it


def alert_record(alert: FiringAlert) -> dict[str, Any]:
    return {"alertname": alert.alertname, "labels": dict(alert.labels), "startsAt": alert.starts_at}


def alert_from(record: Mapping[str, Any]) -> FiringAlert:
    return FiringAlert(
        record.get("alertname", ""),
        tuple(sorted(record.get("labels", {}).items())),
        record.get("startsAt", ""),
    )


# -- what decided a comparison, as recorded in a node's checks ----------------


@dataclass(frozen=True)
class Measured:
    """The numbers a decided comparison rests on: each side's median (a
    ``query``) or rate (``errors``), its sample count, the baseline's nodes
    (the node itself when compared with its own window before dispatch,
    ``own_window``), the change (how much worse) and the p-value."""

    kind: str  # median | rate
    canary: float | None
    canary_samples: int
    baseline: float | None
    baseline_samples: int
    baseline_nodes: tuple[str, ...]
    change: float | None
    p_value: float | None
    own_window: bool = False
    # each side's (smallest, first quartile, third quartile, largest), when recorded
    canary_spread: tuple[float, float, float, float] | None = None
    baseline_spread: tuple[float, float, float, float] | None = None


def measured_record(m: Measured) -> dict[str, Any]:
    """``{canary: {median|rate, samples}, baseline: {median|rate, samples,
    nodes[, ownWindow]}, change, pValue}``."""
    baseline: dict[str, Any] = {
        m.kind: m.baseline,
        "samples": m.baseline_samples,
        "nodes": list(m.baseline_nodes),
    }
    if m.own_window:
        baseline["ownWindow"] = True
    canary: dict[str, Any] = {m.kind: m.canary, "samples": m.canary_samples}
    # Written only when recorded, so earlier records stay as they were.
    if m.canary_spread is not None:
        canary["spread"] = list(m.canary_spread)
    if m.baseline_spread is not None:
        baseline["spread"] = list(m.baseline_spread)
    return {
        "canary": canary,
        "baseline": baseline,
        "change": m.change,
        "pValue": m.p_value,
    }


def measured_from(record: Mapping[str, Any]) -> Measured | None:
    canary, baseline = record.get("canary"), record.get("baseline")
    if not isinstance(canary, dict) or not isinstance(baseline, dict):
        return None
    kind = "rate" if "rate" in canary else "median"
    return Measured(
        kind=kind,
        canary=canary.get(kind),
        canary_samples=canary.get("samples", 0),
        baseline=baseline.get(kind),
        baseline_samples=baseline.get("samples", 0),
        baseline_nodes=tuple(baseline.get("nodes", ())),
        change=record.get("change"),
        p_value=record.get("pValue"),
        own_window=baseline.get("ownWindow", False),
        canary_spread=_spread(canary.get("spread")),
        baseline_spread=_spread(baseline.get("spread")),
    )


def _spread(value: Any) -> tuple[float, float, float, float] | None:
    if not isinstance(value, list) or len(value) != 4:
        return None
    return (float(value[0]), float(value[1]), float(value[2]), float(value[3]))
