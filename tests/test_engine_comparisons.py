"""The rules of comparisons and alerts, pure: each row of their tables, the
node's verdict they lead to with ``judge_health``, the gate on new batches,
the conditions, the records they leave in status, and the baseline the
daemon picks (the rollout's nodes not yet dispatched, else the node's own
window before its dispatch)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from reconciler.daemon import canary_readings
from reconciler.daemon.range_queries import RangeAnswer
from reconciler.engine import comparisons
from reconciler.engine.health_evidence import (
    FAILED,
    HELD,
    LOST,
    NO_EVIDENCE,
    SOAKING,
    WAITING,
    Standing,
    judge_health,
)
from reconciler.protocol.canary_observations import (
    AlertAnswer,
    CanaryWatch,
    ComparisonVerdict,
    FiringAlert,
)
from reconciler.spec.compare import Alerts, Comparison, Measured
from reconciler.spec.health import Health
from reconciler.spec.model import Node
from reconciler.spec.rollout_status import (
    CheckOutcome,
    FrozenSpec,
    NodeRecord,
    RolloutStatus,
    Waiting,
    node_from_record,
    node_to_record,
    to_record,
)
from reconciler.text.health_text import comparison_lines
from reconciler.text.status_text import waiting_text
from tests.kit.documents import make_status

NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
LATENCY = Comparison("latency-p95", 0.1, query='latency{node="{node}"}')
MEASURED = Measured("median", 0.13, 12, 0.1, 24, ("gpu-a2", "gpu-a3"), 0.3, 0.0001)
HEALTH = Health(soak=60, interval=1, compare=(LATENCY,), alerts=Alerts(('severity="page"',)))


def watch(*verdicts: ComparisonVerdict, since: datetime = NOW) -> CanaryWatch:
    return CanaryWatch("job-1", since, {v.name: v for v in verdicts})


NO_ALERTS = AlertAnswer()


def found(
    w: CanaryWatch | None, answer: AlertAnswer | None = NO_ALERTS, now: datetime = NOW
) -> tuple[Standing, ...]:
    return comparisons.standings(HEALTH, "gpu-a1", "job-1", w, answer, now)


def hot(**labels: str) -> FiringAlert:
    return FiringAlert("GpuHot", tuple(sorted({"alertname": "GpuHot", **labels}.items())), "T0")


@pytest.mark.parametrize(
    ("w", "standing"),
    [
        (None, WAITING),
        (watch(), SOAKING),
        (watch(ComparisonVerdict("latency-p95", "failed", "median 0.13", MEASURED)), FAILED),
        (watch(ComparisonVerdict("latency-p95", "unknown", "too few samples")), LOST),
        (watch(ComparisonVerdict("latency-p95", "passed", "median 0.1", MEASURED)), HELD),
        # a watch of another job is no evidence for this one
        (CanaryWatch("job-0", NOW, {}), WAITING),
    ],
)
def test_each_row_of_the_comparison_table(w: CanaryWatch | None, standing: str) -> None:
    assert found(w)[0].standing == standing


def test_a_failed_comparison_fails_the_node_under_its_name_and_keeps_its_numbers() -> None:
    failed = ComparisonVerdict("latency-p95", "failed", "median 0.13 against 0.1", MEASURED)
    standings = found(watch(failed, since=NOW - timedelta(minutes=2)))

    judged = judge_health(standings, deadline_passed=False)

    assert judged.verdict == "failed"
    assert judged.error == "health check latency-p95 failed: median 0.13 against 0.1"
    assert judged.outcomes[0] == CheckOutcome(
        "latency-p95", False, "median 0.13 against 0.1", MEASURED
    )


def test_an_inconclusive_comparison_makes_the_node_unknown_at_once() -> None:
    unknown = ComparisonVerdict("latency-p95", "unknown", "too few samples to judge")
    judged = judge_health(found(watch(unknown)), deadline_passed=False)
    assert judged.verdict == "unknown"
    assert "inconclusive: too few samples to judge" in judged.error


def test_a_node_passes_only_when_its_comparison_passed_and_the_soak_elapsed() -> None:
    passed = ComparisonVerdict("latency-p95", "passed", "ok", MEASURED)
    soaking = judge_health(found(watch(passed)), deadline_passed=False)
    soaked = judge_health(
        found(watch(passed), now=NOW + timedelta(seconds=60)), deadline_passed=False
    )
    assert soaking.verdict is None
    assert soaked.verdict == "passed"


@pytest.mark.parametrize(
    ("answer", "standing"),
    [
        (AlertAnswer(alerts=(hot(node="gpu-a1"),)), FAILED),
        (AlertAnswer(alerts=(hot(node="gpu-b7"),)), SOAKING),
        (AlertAnswer(error="cannot reach"), NO_EVIDENCE),
        (AlertAnswer(rejected="bad matcher"), NO_EVIDENCE),
        (None, NO_EVIDENCE),
    ],
)
def test_each_row_of_the_alert_table(answer: AlertAnswer | None, standing: str) -> None:
    assert found(watch(), answer)[1].standing == standing


def test_an_alert_naming_the_node_fails_it_whatever_its_job_says() -> None:
    answer = AlertAnswer(alerts=(hot(node="gpu-a1", severity="page"),))
    assert comparisons.alert_failure(HEALTH, answer, "gpu-a1") == (
        "health check alerts failed: alert GpuHot firing since T0"
    )
    assert comparisons.alert_failure(HEALTH, answer, "gpu-a2") == ""


def frozen(health: Health) -> FrozenSpec:
    status = make_status("r", "running", [("gpu-a1", 1, "dispatched")])
    assert status.frozen is not None
    return replace(status.frozen, health=health)


@pytest.mark.parametrize(
    ("answer", "waiting"),
    [
        (AlertAnswer(), None),
        (AlertAnswer(alerts=(hot(node="gpu-a1"),)), None),
        (AlertAnswer(alerts=(hot(),)), Waiting("alert_firing", None, (hot(),))),
        (AlertAnswer(error="refused"), Waiting("alertmanager_unreachable", None)),
        (None, Waiting("alertmanager_unreachable", None)),
    ],
)
def test_a_fleet_wide_alert_or_no_alertmanager_makes_the_next_batch_wait(
    answer: AlertAnswer | None, waiting: Waiting | None
) -> None:
    assert comparisons.batch_wait(frozen(HEALTH), answer) == waiting
    assert comparisons.batch_wait(frozen(Health()), answer) is None


def test_conditions_name_a_baseline_matching_no_node_and_rejected_matchers() -> None:
    picky = Comparison("p", 0.1, query="q", baseline=(("role", "baseline"),))
    health = Health(compare=(picky,), alerts=Alerts(('severity=~"("',)))
    nodes = [NodeRecord("gpu-a1", 1, "dispatched")]
    fleet = {"gpu-a1": Node("gpu-a1", "http://x", (("role", "gpu"),))}

    words = dict(
        comparisons.condition_words(
            frozen(health),
            nodes,
            fleet.get,
            AlertAnswer(rejected="unescaped double quote"),
        )
    )

    assert words["baseline_matches_no_node"] is not None
    assert "comparison(s) p matches none" in words["baseline_matches_no_node"]
    assert words["alert_matchers_rejected"] == (
        'Alertmanager rejects the matchers severity=~"(": unescaped double quote; fix them '
        "in a new rollout (health is frozen at start)"
    )


def test_a_decided_comparison_is_recorded_with_what_decided_it_and_read_back() -> None:
    record = NodeRecord(
        "gpu-a1", 1, "failed", checks=(CheckOutcome("latency-p95", False, "median", MEASURED),)
    )
    written = node_to_record(record)
    assert written["checks"] == [
        {
            "name": "latency-p95",
            "ok": False,
            "detail": "median",
            "canary": {"median": 0.13, "samples": 12},
            "baseline": {"median": 0.1, "samples": 24, "nodes": ["gpu-a2", "gpu-a3"]},
            "change": 0.3,
            "pValue": 0.0001,
        }
    ]
    assert node_from_record(written) == record
    assert comparison_lines([record]) == [
        "gpu-a1 latency-p95 failed: median; baseline gpu-a2, gpu-a3"
    ]


def fleet_of(*names: str) -> dict[str, Node]:
    return {n: Node(n, "http://x", (("role", "gpu"),)) for n in names}


def test_the_baseline_is_the_rollouts_nodes_not_yet_dispatched() -> None:
    status = make_status(
        "r",
        "running",
        [("gpu-a1", 1, "dispatched"), ("gpu-a2", 2, "pending"), ("gpu-a3", 3, "pending")],
    )
    status = _with_health(status)
    due = canary_readings._due(
        status, status.nodes[0], LATENCY, watch(), fleet_of("gpu-a1", "gpu-a2", "gpu-a3")
    )
    assert due.baseline == ("gpu-a2", "gpu-a3") and not due.own_window
    assert (due.base_start, due.base_end) == (NOW, NOW + timedelta(seconds=60))


def test_with_none_left_the_node_is_compared_with_its_own_window_before_dispatch() -> None:
    status = make_status("r", "running", [("gpu-a2", 1, "succeeded"), ("gpu-a1", 2, "dispatched")])
    status = _with_health(status)
    node = replace(status.nodes[1], dispatched_at=NOW - timedelta(seconds=5))
    due = canary_readings._due(status, node, LATENCY, watch(), fleet_of("gpu-a1", "gpu-a2"))
    assert due.baseline == ("gpu-a1",) and due.own_window
    assert (due.base_start, due.base_end) == (
        NOW - timedelta(seconds=65),
        NOW - timedelta(seconds=5),
    )
    own = due.own(LATENCY.query)
    before = due.queries(LATENCY.query, "gpu-a1")
    assert (own.start, own.end) == (NOW, NOW + timedelta(seconds=60)) and own != before
    samples = tuple((float(i), 0.1) for i in range(12))
    slow = tuple((float(i), 0.13 + i / 1000) for i in range(12))
    [verdict] = canary_readings.judge_all(
        [due], {own: RangeAnswer((slow,)), before: RangeAnswer((samples,))}
    )
    assert verdict.verdict == "failed"
    assert verdict.measured is not None and verdict.measured.own_window
    assert verdict.detail.endswith("against its own window before its dispatch")


def test_a_prometheus_error_on_either_side_is_inconclusive() -> None:
    status = _with_health(
        make_status("r", "running", [("gpu-a1", 1, "dispatched"), ("gpu-a2", 2, "pending")])
    )
    due = canary_readings._due(
        status, status.nodes[0], LATENCY, watch(), fleet_of("gpu-a1", "gpu-a2")
    )
    own, base = due.own(LATENCY.query), due.queries(LATENCY.query, "gpu-a2")
    [verdict] = canary_readings.judge_all(
        [due], {own: RangeAnswer(((1.0, 0.1),)), base: RangeAnswer(error="HTTP 503")}
    )
    assert verdict.verdict == "unknown" and "HTTP 503" in verdict.detail


def test_nodes_judged_together_keep_each_comparisons_own_settings() -> None:
    # The same query under two tolerances, for two nodes against one
    # baseline: tested together, each verdict by its own comparison.
    loose = replace(LATENCY, name="latency-loose", tolerance=0.5)
    status = _with_health(
        make_status(
            "r",
            "running",
            [("gpu-a1", 1, "dispatched"), ("gpu-a2", 1, "dispatched"), ("gpu-a3", 2, "pending")],
        )
    )
    fleet = fleet_of("gpu-a1", "gpu-a2", "gpu-a3")
    due = [
        canary_readings._due(status, node, c, watch(), fleet)
        for node in status.nodes[:2]
        for c in (LATENCY, loose)
    ]
    base = tuple((float(i), 0.1 + i / 10_000) for i in range(12))
    slow = tuple((float(i), 0.13 + i / 10_000) for i in range(12))
    answers = {
        due[0].own(LATENCY.query): RangeAnswer((slow,)),
        due[2].own(LATENCY.query): RangeAnswer((base,)),
        due[0].queries(LATENCY.query, "gpu-a3"): RangeAnswer((base,)),
    }

    verdicts = canary_readings.judge_all(due, answers)

    assert [(v.name, v.verdict) for v in verdicts] == [
        ("latency-p95", "failed"),
        ("latency-loose", "passed"),
        ("latency-p95", "passed"),
        ("latency-loose", "passed"),
    ]


def _with_health(status: RolloutStatus) -> RolloutStatus:
    assert status.frozen is not None
    return replace(status, frozen=replace(status.frozen, health=HEALTH))


def test_status_says_why_a_batch_waits_for_alerts() -> None:
    assert waiting_text(Waiting("alert_firing", None, (hot(),))) == (
        "alert_firing: GpuHot since T0; the next batch starts once it resolves"
    )
    assert waiting_text(Waiting("alertmanager_unreachable", None)) == (
        "alertmanager_unreachable: no new batch until Alertmanager answers"
    )
    record = {
        "reason": "alert_firing",
        "alerts": [{"alertname": "GpuHot", "labels": {"alertname": "GpuHot"}, "startsAt": "T0"}],
    }
    status = replace(make_status("r", "running"), waiting=Waiting("alert_firing", None, (hot(),)))
    assert to_record(status)["waiting"] == record


SOAK_START = """
import sys
from dataclasses import replace
from datetime import timedelta
from reconciler.daemon.canary_readings import CanaryReadings
from reconciler.daemon.range_queries import RangeQueries
from reconciler.protocol.observations import Observations
from tests.test_engine_comparisons import HEALTH, NOW, fleet_of, watch
from tests.kit.documents import make_status

status = make_status("r", "running", [("gpu-a1", 1, "dispatched"), ("gpu-a2", 2, "pending")])
status = replace(status, frozen=replace(status.frozen, health=HEALTH))
now = [NOW + timedelta(seconds=10)]
verdicts = CanaryReadings(RangeQueries(), lambda: now[0])
verdicts.watches["gpu-a1"] = replace(watch(), job_id=status.nodes[0].job_id)
assert "scipy.stats" not in sys.modules
verdicts.observe([status], Observations(), fleet_of("gpu-a1", "gpu-a2"), None)
print("scipy.stats" in sys.modules, verdicts.next_soak_end == NOW + timedelta(seconds=60))
"""


def test_scipy_is_loaded_during_the_soak_and_the_soak_end_is_when_a_pass_is_due() -> None:
    # In a fresh interpreter: this one has SciPy loaded already.
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", SOAK_START], cwd=root, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]
