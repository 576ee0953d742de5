"""The standings of a live node's comparisons and of its rollout's alerts
(docs/health.md), from what the daemon saw: one rule table for each, first
match wins, giving the same standings as the health checks'
(``health_evidence``), so ``judge_health`` decides the node from all of them.

- A comparison waits until the daemon has judged it, once the node's soak
  has elapsed; failed fails the node under the comparison's name; unknown
  (inconclusive) is no evidence now, so the node is unknown, never acted on.
- The alerts check fails a node that a matching alert names (its
  ``nodeLabel``), at once; it holds once the soak has elapsed with no such
  alert; Alertmanager unreachable, or refusing the matchers, is no evidence.

And the gate on new batches: a matching alert naming no node of the fleet
(``fleet_wide``) makes them wait, as does an Alertmanager that cannot be asked.

Pure: values in, values out; no clock, no IO.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from reconciler.engine.health_evidence import (
    FAILED,
    HELD,
    LOST,
    NO_EVIDENCE,
    SOAKING,
    WAITING,
    Standing,
)
from reconciler.protocol.canary_observations import AlertAnswer, CanaryWatch, ComparisonVerdict
from reconciler.spec.compare import ALERTS_CHECK, Alerts, Comparison, FiringAlert
from reconciler.spec.durations import format_duration
from reconciler.spec.health import Health
from reconciler.spec.model import Node
from reconciler.spec.rollout_status import FrozenSpec, NodeRecord, Waiting
from reconciler.spec.times import format_time


@dataclass(frozen=True)
class CompareInput:
    comparison: Comparison
    soak: int  # seconds
    watch: CanaryWatch | None  # the node's current job's, or None

    @property
    def verdict(self) -> ComparisonVerdict | None:
        return None if self.watch is None else self.watch.verdicts.get(self.comparison.name)


def _verdict(c: CompareInput) -> ComparisonVerdict:
    assert c.verdict is not None
    return c.verdict


def _soak_end(watch: CanaryWatch | None, soak: int) -> str:
    assert watch is not None
    return format_time(watch.soak_since + timedelta(seconds=soak))


_Rules = tuple[tuple[str, Callable[[CompareInput], bool], Callable[[CompareInput], str]], ...]

COMPARE_RULES: _Rules = (
    (
        WAITING,
        lambda c: c.watch is None,
        lambda c: "judged once the soak has elapsed, from the pass that sees the apply",
    ),
    (
        SOAKING,
        lambda c: c.verdict is None,
        lambda c: f"judged when the soak ends at {_soak_end(c.watch, c.soak)}",
    ),
    (FAILED, lambda c: _verdict(c).verdict == "failed", lambda c: _verdict(c).detail),
    (
        LOST,
        lambda c: _verdict(c).verdict == "unknown",
        lambda c: f"inconclusive: {_verdict(c).detail}",
    ),
    (HELD, lambda c: True, lambda c: _verdict(c).detail),
)


def compare_standing(c: CompareInput) -> Standing:
    for result, when, detail in COMPARE_RULES:
        if when(c):
            verdict = c.verdict
            measured = verdict.measured if verdict is not None else None
            return Standing(c.comparison.name, result, detail(c), measured)
    raise AssertionError("the last rule always applies")


@dataclass(frozen=True)
class AlertInput:
    alerts: Alerts
    node: str
    soak: int
    answer: AlertAnswer | None
    watch: CanaryWatch | None
    now: datetime

    @property
    def naming(self) -> FiringAlert | None:
        if self.answer is None:
            return None
        return next(
            (
                a
                for a in self.answer.alerts
                if dict(a.labels).get(self.alerts.node_label) == self.node
            ),
            None,
        )


def _answer(c: AlertInput) -> AlertAnswer:
    assert c.answer is not None
    return c.answer


def _since(c: AlertInput) -> datetime:
    assert c.watch is not None
    return c.watch.soak_since


ALERT_RULES: tuple[tuple[str, Callable[[AlertInput], bool], Callable[[AlertInput], str]], ...] = (
    (
        FAILED,
        lambda c: c.naming is not None,
        lambda c: alert_words(c.naming) if c.naming is not None else "",
    ),
    (NO_EVIDENCE, lambda c: c.answer is None, lambda c: "Alertmanager not asked yet"),
    (
        NO_EVIDENCE,
        lambda c: bool(_answer(c).error),
        lambda c: f"no answer from Alertmanager: {_answer(c).error}",
    ),
    (
        NO_EVIDENCE,
        lambda c: bool(_answer(c).rejected),
        lambda c: f"Alertmanager rejects the matchers: {_answer(c).rejected}",
    ),
    (WAITING, lambda c: c.watch is None, lambda c: "no alert names the node; soak not begun"),
    (
        HELD,
        lambda c: _since(c) <= c.now - timedelta(seconds=c.soak),
        lambda c: f"no alert named the node for the soak of {format_duration(c.soak)}",
    ),
    (
        SOAKING,
        lambda c: True,
        lambda c: f"no alert names the node; soak of {format_duration(c.soak)} under way",
    ),
)


def alert_words(alert: FiringAlert) -> str:
    return f"alert {alert.alertname} firing since {alert.starts_at}"


def alert_standing(c: AlertInput) -> Standing:
    for result, when, detail in ALERT_RULES:
        if when(c):
            return Standing(ALERTS_CHECK, result, detail(c))
    raise AssertionError("the last rule always applies")


def standings(
    health: Health,
    node: str,
    job_id: str,
    watch: CanaryWatch | None,
    answer: AlertAnswer | None,
    now: datetime,
) -> tuple[Standing, ...]:
    """The standings of ``node``'s comparisons and alerts for job ``job_id``;
    a watch of another job is no evidence for this one."""
    if watch is not None and watch.job_id != job_id:
        watch = None
    found = [compare_standing(CompareInput(c, health.soak, watch)) for c in health.compare]
    if health.alerts is not None:
        found.append(
            alert_standing(AlertInput(health.alerts, node, health.soak, answer, watch, now))
        )
    return tuple(found)


def failing_alert(
    health: Health | None, answer: AlertAnswer | None, node: str
) -> FiringAlert | None:
    """The first matching alert that names ``node`` (None: none does)."""
    if health is None or health.alerts is None or answer is None:
        return None
    label = health.alerts.node_label
    return next((a for a in answer.alerts if dict(a.labels).get(label) == node), None)


def alert_failure(health: Health | None, answer: AlertAnswer | None, node: str) -> str:
    """The error of a node a matching alert names (empty: none does)."""
    alert = failing_alert(health, answer, node)
    if alert is None:
        return ""
    return f"health check {ALERTS_CHECK} failed: {alert_words(alert)}"


def batch_wait(frozen: FrozenSpec | None, answer: AlertAnswer | None) -> Waiting | None:
    """Why no new batch of a live rollout may start for its alerts: a
    matching alert without the node label fires (``alert_firing``), or
    Alertmanager could not be asked (``alertmanager_unreachable``); None: it may."""
    if frozen is None or not frozen.live or frozen.health is None:
        return None
    alerts = frozen.health.alerts
    if alerts is None:
        return None
    if answer is None or answer.error:
        return Waiting("alertmanager_unreachable", None)
    firing = tuple(a for a in answer.alerts if alerts.node_label not in dict(a.labels))
    if firing:
        return Waiting("alert_firing", None, firing)
    return None


def condition_words(
    frozen: FrozenSpec | None,
    nodes: Sequence[NodeRecord],
    node_spec: Callable[[str], Node | None],
    answer: AlertAnswer | None,
) -> tuple[tuple[str, str | None], ...]:
    """The conditions of a live rollout's comparisons and alerts, (type,
    message or None) each: a ``baseline`` selector that matches none of the
    rollout's nodes, and matchers Alertmanager rejects."""
    if frozen is None or not frozen.live or frozen.health is None:
        return ()
    health = frozen.health
    unmatched = [
        c.name
        for c in health.compare
        if c.baseline is not None and not any(selects(c.baseline, node_spec(n.name)) for n in nodes)
    ]
    baseline = (
        None
        if not unmatched
        else f"the baseline selector of comparison(s) {', '.join(unmatched)} matches none of "
        "this rollout's nodes: they have no baseline and are inconclusive; fix the selector in "
        "a new rollout (health is frozen at start)"
    )
    rejected = None
    if health.alerts is not None and answer is not None and answer.rejected:
        rejected = (
            f"Alertmanager rejects the matchers {', '.join(health.alerts.matchers)}: "
            f"{answer.rejected}; fix them in a new rollout (health is frozen at start)"
        )
    return (("baseline_matches_no_node", baseline), ("alert_matchers_rejected", rejected))


def selects(selector: tuple[tuple[str, str], ...], node: Node | None) -> bool:
    return node is not None and node.matches(selector)
