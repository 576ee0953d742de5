"""The health checks' evidence rules (docs/health.md, "How checks are judged"): what a rollout's health checks say about one
live node whose apply succeeded and whose heartbeat shows the target.

Every check has a standing at each moment, decided by one rule of
``STANDINGS`` (first match wins); the node's health follows from the
standings by ``judge_health``:

- any check ``failed`` (``failureThreshold`` consecutive failures): failed,
  with the check's name and last error;
- every check ``held`` (continuously for ``soak``): passed;
- any check ``lost`` (no evidence for ``offlineAfter``): unknown, never
  acted on;
- else wait; at the deadline, a check without evidence makes the node
  unknown, any other makes it time out.

Agent checks are judged on the agent's clock (``okSince`` against the
heartbeat's ``time`` minus ``soak``); prometheus checks on the daemon's
clock, from ``MetricCheck`` values the daemon folds its answers into with
``fold_metric_answer``, kept in memory only, so a restart restarts a soak.

Pure: values in, values out; no clock, no IO.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from reconciler.protocol.observations import CheckReport, MetricAnswer, MetricCheck
from reconciler.spec.compare import Measured
from reconciler.spec.durations import format_duration
from reconciler.spec.health import Health, HealthCheck
from reconciler.spec.rollout_status import CheckOutcome
from reconciler.spec.times import parse_time

# Standings, from the worst: what each means for the node.
FAILED = "failed"  # reached failureThreshold: fails the node
LOST = "lost"  # no evidence for offlineAfter: unknown
NO_EVIDENCE = "no_evidence"  # no evidence right now: wait (unknown at the deadline)
FAILING = "failing"  # failed fewer than failureThreshold times in a row: wait
WAITING = "waiting"  # not probed or asked yet: wait
SOAKING = "soaking"  # holds, not yet for soak: wait
HELD = "held"  # has held continuously for soak

# Standings that count as "no evidence" when the deadline passes.
WITHOUT_EVIDENCE = frozenset({LOST, NO_EVIDENCE})


@dataclass(frozen=True)
class Standing:
    name: str
    standing: str
    detail: str
    measured: Measured | None = None  # a comparison's numbers

    @property
    def outcome(self) -> CheckOutcome:
        return CheckOutcome(self.name, self.standing == HELD, self.detail, self.measured)


@dataclass(frozen=True)
class CheckInput:
    """Everything one check's standing is decided from."""

    check: HealthCheck
    health: Health
    report: CheckReport | None = None  # agent checks: from a fresh heartbeat
    beat_time: datetime | None = None  # that heartbeat's time (agent clock)
    metric: MetricCheck | None = None  # prometheus checks: the daemon's memory
    now: datetime | None = None  # daemon clock
    offline_after: timedelta = timedelta(minutes=2)
    prometheus_configured: bool = True


def _soaked(since: datetime, at: datetime, soak: int) -> bool:
    return since <= at - timedelta(seconds=soak)


def _held_for(since: datetime, at: datetime) -> str:
    return format_duration(max(0, int((at - since).total_seconds())))


# -- agent checks: (standing, when, detail), first match wins ------------------


def _report(c: CheckInput) -> CheckReport:
    assert c.report is not None
    return c.report


def _agent_since(c: CheckInput) -> datetime:
    since = _ok_since(c)
    assert since is not None
    return since


def _beat(c: CheckInput) -> datetime:
    assert c.beat_time is not None
    return c.beat_time


def _metric_since(c: CheckInput) -> datetime:
    since = _metric(c).ok_since
    assert since is not None
    return since


def _error_since(c: CheckInput) -> datetime:
    since = _metric(c).error_since
    assert since is not None
    return since


def _ok_since(c: CheckInput) -> datetime | None:
    text = _report(c).ok_since
    if text is None:
        return None
    try:
        return parse_time(text)
    except ValueError:
        return None


_AGENT_RULES: tuple[tuple[str, Callable[[CheckInput], bool], Callable[[CheckInput], str]], ...] = (
    (WAITING, lambda c: c.report is None, lambda c: "not probed yet since the apply"),
    (
        FAILED,
        lambda c: _report(c).failures >= c.health.failure_threshold,
        lambda c: f"failed {_report(c).failures} times in a row: {_report(c).last_error}",
    ),
    (
        FAILING,
        lambda c: not _report(c).ok or _ok_since(c) is None,
        lambda c: (
            f"failed {_report(c).failures} of {c.health.failure_threshold} times in a row: "
            f"{_report(c).last_error}"
        ),
    ),
    (
        HELD,
        lambda c: _soaked(_agent_since(c), _beat(c), c.health.soak),
        lambda c: f"ok for {_held_for(_agent_since(c), _beat(c))}",
    ),
    (
        SOAKING,
        lambda c: True,
        lambda c: (
            f"ok for {_held_for(_agent_since(c), _beat(c))} of "
            f"soak {format_duration(c.health.soak)}"
        ),
    ),
)


# -- prometheus checks --------------------------------------------------------------


def _metric(c: CheckInput) -> MetricCheck:
    assert c.metric is not None
    return c.metric


def _now(c: CheckInput) -> datetime:
    assert c.now is not None
    return c.now


_METRIC_RULES: tuple[tuple[str, Callable[[CheckInput], bool], Callable[[CheckInput], str]], ...] = (
    (
        NO_EVIDENCE,
        lambda c: not c.prometheus_configured,
        lambda c: "settings.spec.prometheus is not set: nothing can answer this check",
    ),
    (WAITING, lambda c: c.metric is None, lambda c: "not asked yet since the job finished"),
    (
        NO_EVIDENCE,
        lambda c: _metric(c).rejected,
        lambda c: f"Prometheus rejected the query: {_metric(c).detail}",
    ),
    (
        FAILED,
        lambda c: _metric(c).failures >= c.health.failure_threshold,
        lambda c: f"out of bounds {_metric(c).failures} times in a row: {_metric(c).detail}",
    ),
    (
        LOST,
        lambda c: (
            _metric(c).error_since is not None and _now(c) - _error_since(c) >= c.offline_after
        ),
        lambda c: (
            f"no answer from Prometheus for {format_duration(int(c.offline_after.total_seconds()))}"
            f" or more: {_metric(c).detail}"
        ),
    ),
    (
        NO_EVIDENCE,
        lambda c: _metric(c).error_since is not None,
        lambda c: f"no answer from Prometheus: {_metric(c).detail}",
    ),
    (
        HELD,
        lambda c: (
            _metric(c).ok_since is not None and _soaked(_metric_since(c), _now(c), c.health.soak)
        ),
        lambda c: f"{_metric(c).detail}, within bounds for {_held_for(_metric_since(c), _now(c))}",
    ),
    (
        SOAKING,
        lambda c: _metric(c).ok_since is not None,
        lambda c: (
            f"{_metric(c).detail}, within bounds for "
            f"{_held_for(_metric_since(c), _now(c))} of "
            f"soak {format_duration(c.health.soak)}"
        ),
    ),
    (
        FAILING,
        lambda c: True,
        lambda c: (
            f"out of bounds {_metric(c).failures} of {c.health.failure_threshold} times: "
            f"{_metric(c).detail}"
        ),
    ),
)


def standing(c: CheckInput) -> Standing:
    """The check's standing: the first rule of its kind's table that applies."""
    rules = _METRIC_RULES if c.check.prometheus is not None else _AGENT_RULES
    for result, when, detail in rules:
        if when(c):
            return Standing(c.check.name, result, detail(c))
    raise AssertionError("the last rule of each table always applies")


# -- the node -------------------------------------------------------------------------


@dataclass(frozen=True)
class HealthJudgement:
    """``verdict`` None: wait (``error`` then says what is awaited)."""

    verdict: str | None
    error: str
    standings: tuple[Standing, ...]

    @property
    def outcomes(self) -> tuple[CheckOutcome, ...]:
        return tuple(s.outcome for s in self.standings)


def standings(
    health: Health,
    node: str,
    job_id: str,
    beat_checks: Mapping[str, CheckReport],
    beat_time: datetime | None,
    metrics: Mapping[tuple[str, str], MetricCheck],
    now: datetime,
    offline_after: timedelta,
    prometheus_configured: bool,
) -> tuple[Standing, ...]:
    """Each check's standing for ``node``'s job ``job_id``; reports and
    answers that belong to another job are not evidence for this one."""
    out = []
    for check in health.checks:
        report = beat_checks.get(check.name)
        if report is not None and report.job_id != job_id:
            report = None
        metric = metrics.get((node, check.name))
        if metric is not None and metric.job_id != job_id:
            metric = None
        out.append(
            standing(
                CheckInput(
                    check,
                    health,
                    report=report,
                    beat_time=beat_time,
                    metric=metric,
                    now=now,
                    offline_after=offline_after,
                    prometheus_configured=prometheus_configured,
                )
            )
        )
    return tuple(out)


def judge_health(found: tuple[Standing, ...], *, deadline_passed: bool) -> HealthJudgement:
    """The node's verdict from its checks' standings (module docstring)."""

    def first(kinds: frozenset[str] | set[str]) -> Standing | None:
        return next((s for s in found if s.standing in kinds), None)

    failed = first({FAILED})
    if failed is not None:
        return HealthJudgement(
            "failed", f"health check {failed.name} failed: {failed.detail}", found
        )
    if all(s.standing == HELD for s in found):
        return HealthJudgement("passed", "", found)
    lost = first({LOST})
    if lost is not None:
        return HealthJudgement(
            "unknown", f"no evidence for health check {lost.name}: {lost.detail}", found
        )
    pending = first({NO_EVIDENCE, FAILING, WAITING, SOAKING})
    assert pending is not None
    if deadline_passed:
        blind = first(WITHOUT_EVIDENCE)
        if blind is not None:
            return HealthJudgement(
                "unknown",
                f"no evidence for health check {blind.name} when the deadline passed: "
                f"{blind.detail}",
                found,
            )
        return HealthJudgement(
            "timed_out", f"deadline passed: health check {pending.name}: {pending.detail}", found
        )
    return HealthJudgement(None, f"health check {pending.name}: {pending.detail}", found)


def metric_holds(check: HealthCheck, answer: MetricAnswer) -> tuple[bool, str]:
    """Whether an answer (not an error) holds, and what it showed: every
    sample within the bounds; an empty result does not hold."""
    query = check.prometheus
    assert query is not None
    if not answer.samples:
        return False, "empty result"
    outside = [(labels, v) for labels, v in answer.samples if not query.holds(v)]
    shown = outside or list(answer.samples)
    text = ", ".join(f"{labels or 'value'} = {v:g}" for labels, v in shown[:3])
    if len(shown) > 3:
        text += f" and {len(shown) - 3} more"
    if outside:
        return False, f"{text} (bounds: {query.bounds()})"
    return True, text


def fold_metric_answer(
    previous: MetricCheck | None,
    check: HealthCheck,
    job_id: str,
    answer: MetricAnswer,
    now: datetime,
) -> MetricCheck:
    """The daemon's memory of one prometheus check after one more answer.
    A holding answer starts (or continues) the run of holding answers; one
    out of bounds breaks it and counts a failure; an error is no evidence:
    it breaks the run too (a soak must be seen whole), counts no failure,
    and starts the error clock."""
    name = check.name
    if previous is None or previous.job_id != job_id:
        previous = MetricCheck(name, job_id)
    if answer.error:
        return MetricCheck(
            name,
            job_id,
            ok_since=None,
            failures=previous.failures,
            detail=answer.error,
            error_since=previous.error_since or now,
            rejected=answer.rejected,
        )
    holds, detail = metric_holds(check, answer)
    if holds:
        return MetricCheck(
            name, job_id, ok_since=previous.ok_since or now, failures=0, detail=detail
        )
    return MetricCheck(name, job_id, ok_since=None, failures=previous.failures + 1, detail=detail)
