"""The health checks' evidence rules (docs/health.md) (``engine.health_evidence``): each rule of
the standing tables on its own, the node's verdict from its checks, the
daemon's fold of Prometheus answers, and the engine around them (soak in
the deadline, holds, conditions), ending with a state machine: a node
never passes before its soak, and never with a failing check."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from reconciler.engine import health_evidence as he
from reconciler.protocol.observations import (
    CheckReport,
    Heartbeat,
    MetricAnswer,
    MetricCheck,
    Observations,
    RuntimeReport,
)
from reconciler.spec.health import Health, HealthCheck, HttpProbe, PrometheusQuery
from reconciler.spec.model import Settings
from reconciler.spec.rollout_status import from_record, to_record
from reconciler.spec.times import format_time
from tests.engine_world import T0, TARGET, World

READY = HealthCheck("ready", http=HttpProbe("http://127.0.0.1:8000/ready"))
ERRORS = HealthCheck("errors", prometheus=PrometheusQuery("rate(errors[1m])", max=0.01))
HEALTH = Health(soak=120, failure_threshold=3, interval=10, checks=(READY, ERRORS))
PROM = Settings(prometheus_url="http://127.0.0.1:9090")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def agent(report: CheckReport | None, beat: float) -> he.Standing:
    return he.standing(he.CheckInput(READY, HEALTH, report=report, beat_time=at(beat)))


def metric(state: MetricCheck | None, now: float, configured: bool = True) -> he.Standing:
    return he.standing(
        he.CheckInput(
            ERRORS,
            HEALTH,
            metric=state,
            now=at(now),
            offline_after=timedelta(seconds=60),
            prometheus_configured=configured,
        )
    )


def report(ok: bool, since: float | None, failures: int = 0, error: str = "") -> CheckReport:
    return CheckReport(
        "ready", "j1", ok, None if since is None else format_time(at(since)), failures, error
    )


# -- the agent table, rule by rule


def test_an_agent_check_not_yet_probed_waits() -> None:
    assert agent(None, 100).standing == he.WAITING


def test_an_agent_check_at_the_failure_threshold_fails_with_its_last_error() -> None:
    found = agent(report(False, None, 3, "status 503"), 100)
    assert (found.standing, found.detail) == (he.FAILED, "failed 3 times in a row: status 503")


def test_an_agent_check_below_the_threshold_is_failing_and_waits() -> None:
    assert agent(report(False, None, 2, "status 503"), 100).standing == he.FAILING


def test_an_agent_check_holds_once_ok_since_is_soak_before_the_heartbeat() -> None:
    assert agent(report(True, 10), 129).standing == he.SOAKING
    assert agent(report(True, 10), 130).standing == he.HELD
    assert agent(report(True, 10), 130).detail == "ok for 2m"


# -- the prometheus table, rule by rule


def test_a_prometheus_check_without_a_server_in_settings_has_no_evidence() -> None:
    assert metric(None, 10, configured=False).standing == he.NO_EVIDENCE


def test_a_prometheus_check_not_asked_yet_waits() -> None:
    assert metric(None, 10).standing == he.WAITING


def test_a_rejected_query_is_no_evidence() -> None:
    state = MetricCheck("errors", "j1", detail="parse error", error_since=at(0), rejected=True)
    assert metric(state, 5).standing == he.NO_EVIDENCE


def test_answers_out_of_bounds_fail_at_the_threshold() -> None:
    state = MetricCheck("errors", "j1", failures=3, detail="value = 0.5 (bounds: max 0.01)")
    assert metric(state, 5).standing == he.FAILED
    assert metric(MetricCheck("errors", "j1", failures=1), 5).standing == he.FAILING


def test_errors_are_no_evidence_then_lost_after_offline_after() -> None:
    state = MetricCheck("errors", "j1", detail="connection refused", error_since=at(0))
    assert metric(state, 59).standing == he.NO_EVIDENCE
    assert metric(state, 60).standing == he.LOST


def test_holding_answers_hold_after_the_soak_on_the_daemon_clock() -> None:
    state = MetricCheck("errors", "j1", ok_since=at(10), detail="value = 0")
    assert metric(state, 129).standing == he.SOAKING
    assert metric(state, 130).standing == he.HELD


# -- the node


def standing(name: str, kind: str) -> he.Standing:
    return he.Standing(name, kind, "detail")


@pytest.mark.parametrize(
    ("kinds", "deadline_passed", "verdict"),
    [
        ((he.HELD, he.HELD), False, "passed"),
        ((he.HELD, he.FAILED), False, "failed"),
        ((he.LOST, he.FAILED), False, "failed"),
        ((he.HELD, he.LOST), False, "unknown"),
        ((he.SOAKING, he.HELD), False, None),
        ((he.NO_EVIDENCE, he.HELD), False, None),
        ((he.NO_EVIDENCE, he.SOAKING), True, "unknown"),
        ((he.FAILING, he.SOAKING), True, "timed_out"),
        ((he.WAITING, he.HELD), True, "timed_out"),
    ],
)
def test_the_node_verdict_follows_from_its_checks(
    kinds: tuple[str, str], deadline_passed: bool, verdict: str | None
) -> None:
    found = (standing("ready", kinds[0]), standing("errors", kinds[1]))
    assert he.judge_health(found, deadline_passed=deadline_passed).verdict == verdict


def test_a_failed_check_is_named_in_the_error() -> None:
    found = (standing("ready", he.HELD), he.Standing("errors", he.FAILED, "value = 3"))
    assert he.judge_health(found, deadline_passed=False).error == (
        "health check errors failed: value = 3"
    )


# -- the daemon's fold of answers


def test_holding_answers_keep_the_first_ones_time_and_one_out_of_bounds_breaks_it() -> None:
    ok = MetricAnswer(samples=(("", 0.0),))
    bad = MetricAnswer(samples=(('{node="a"}', 0.5),))
    state = he.fold_metric_answer(None, ERRORS, "j1", ok, at(0))
    state = he.fold_metric_answer(state, ERRORS, "j1", ok, at(10))
    assert (state.ok_since, state.failures) == (at(0), 0)
    state = he.fold_metric_answer(state, ERRORS, "j1", bad, at(20))
    assert (state.ok_since, state.failures) == (None, 1)
    assert state.detail == '{node="a"} = 0.5 (bounds: max 0.01)'
    state = he.fold_metric_answer(state, ERRORS, "j1", ok, at(30))
    assert (state.ok_since, state.failures) == (at(30), 0)


def test_an_empty_result_does_not_hold_and_an_error_breaks_the_soak() -> None:
    state = he.fold_metric_answer(None, ERRORS, "j1", MetricAnswer(), at(0))
    assert (state.failures, state.detail) == (1, "empty result")
    state = he.fold_metric_answer(None, ERRORS, "j1", MetricAnswer(samples=(("", 0),)), at(0))
    state = he.fold_metric_answer(state, ERRORS, "j1", MetricAnswer(error="timeout"), at(5))
    assert (state.ok_since, state.error_since, state.failures) == (None, at(5), 0)


def test_an_answer_for_a_new_job_starts_afresh() -> None:
    state = MetricCheck("errors", "j1", failures=2)
    new = he.fold_metric_answer(state, ERRORS, "j2", MetricAnswer(samples=(("", 9),)), at(0))
    assert (new.job_id, new.failures) == ("j2", 1)


# -- the engine around them


class HealthWorld(World):
    """The engine world with agent check reports and prometheus memory."""

    def __init__(self, nodes: int = 1, settings: Settings = PROM) -> None:
        super().__init__(nodes, settings)
        self.reports: dict[str, tuple[CheckReport, ...]] = {}
        self.metrics: dict[tuple[str, str], MetricCheck] = {}

    def beat(self, node: str, *reports: CheckReport) -> None:
        self.reports[node] = reports
        self.heartbeats[node] = Heartbeat(
            node,
            format_time(self.now),
            runtimes=(RuntimeReport("hermes", TARGET.provider, TARGET.model, "default"),),
            checks=reports,
        )

    def observations(self) -> Observations:
        base = super().observations()
        return Observations(
            jobs=base.jobs,
            heartbeats=base.heartbeats,
            unreachable_since=base.unreachable_since,
            backups=base.backups,
            metric_checks=dict(self.metrics),
        )


def started(health: Health = HEALTH, **fields: object) -> HealthWorld:
    world = HealthWorld()
    world.rollout(live=True, health=health, **fields)
    world.step(0)
    return world


def ok_report(job: str, since: float, failures: int = 0) -> CheckReport:
    return CheckReport("ready", job, failures == 0, format_time(at(since)), failures, "")


def test_the_deadline_includes_the_soak() -> None:
    world = started()
    assert world.node("n1").deadline == at(300 + 120)


def test_a_healthy_node_passes_after_the_soak_and_not_before() -> None:
    world = started()
    job = world.succeed("n1", at=at(5)).job_id
    world.metrics[("n1", "errors")] = MetricCheck("errors", job, ok_since=at(10), detail="0")
    world.now = at(129)
    world.beat("n1", ok_report(job, 8))
    world.step()
    assert world.state("n1") == "dispatched"
    world.now = at(130)
    world.beat("n1", ok_report(job, 8))
    world.step()
    assert world.state("n1") == "succeeded"
    assert [(c.name, c.ok) for c in world.node("n1").checks] == [("ready", True), ("errors", True)]
    assert world.phase() == "completed"


def test_a_check_failing_during_the_soak_fails_the_node_with_its_name() -> None:
    world = started()
    job = world.succeed("n1", at=at(5)).job_id
    world.now = at(60)
    world.beat("n1", CheckReport("ready", job, False, None, 3, "status 503 (expected 200)"))
    world.step()
    node = world.node("n1")
    assert (node.state, world.hold()) == ("failed", "health_failed")
    assert (
        node.error
        == "health check ready failed: failed 3 times in a row: status 503 (expected 200)"
    )
    assert [(c.name, c.ok) for c in node.checks] == [("ready", False), ("errors", False)]


def test_prometheus_lost_for_offline_after_makes_the_node_unknown_and_holds() -> None:
    world = started()
    job = world.succeed("n1", at=at(5)).job_id
    world.metrics[("n1", "errors")] = MetricCheck(
        "errors", job, detail="connection refused", error_since=at(20)
    )
    world.beat("n1", ok_report(job, 8))
    world.step(139)
    assert world.state("n1") == "dispatched"
    world.beat("n1", ok_report(job, 8))
    world.step(140)
    assert (world.state("n1"), world.hold()) == ("unknown", "health_unknown")
    assert "no evidence for health check errors" in world.node("n1").error


def test_a_rejected_query_is_a_condition_naming_the_check() -> None:
    world = started()
    job = world.succeed("n1", at=at(5)).job_id
    world.metrics[("n1", "errors")] = MetricCheck(
        "errors", job, detail="bad_data: parse error", error_since=at(6), rejected=True
    )
    world.step(10)
    condition = world.status().condition("prometheus_query_rejected")
    assert condition is not None and "check errors: bad_data: parse error" in condition.message


def test_without_a_prometheus_server_the_rollout_waits_pending() -> None:
    world = HealthWorld(settings=Settings())
    world.rollout(live=True, health=HEALTH)
    world.step(0)
    assert (world.phase(), world.status().reason) == ("pending", "prometheus_not_configured")


def test_a_dry_run_ignores_health_and_sends_no_checks() -> None:
    world = HealthWorld()
    world.rollout(live=False, health=HEALTH)
    world.step(0)
    assert world.job("n1").health is None
    assert world.node("n1").deadline == at(300)
    world.succeed("n1")
    world.step(1)
    assert world.state("n1") == "succeeded"


def test_live_applies_carry_the_agent_checks_and_health_is_frozen() -> None:
    world = started()
    assert world.job("n1").health == HEALTH
    world.edit(health=Health(soak=1, checks=(READY,)))
    world.step(1)
    condition = world.status().condition("frozen_fields_changed")
    assert condition is not None and "health" in condition.message


def test_status_records_keep_health_and_check_outcomes() -> None:
    world = started()
    job = world.succeed("n1", at=at(5)).job_id
    world.beat("n1", CheckReport("ready", job, False, None, 3, "refused"))
    world.step(30)
    status = world.status()
    assert from_record(to_record(status)) == status
    assert to_record(status)["frozen"]["health"]["soak"] == "2m"


def test_a_version_1_status_record_has_no_health_fields() -> None:
    world = HealthWorld()
    world.rollout(live=True)
    world.step(0)
    record = to_record(world.status())
    assert "health" not in record["frozen"] and "checks" not in record["nodes"][0]


# -- the state machine


class SoakMachine(RuleBasedStateMachine):
    """One live node with an agent check and a prometheus check, probed and
    asked in any order as time goes by; the engine steps after each event."""

    def __init__(self) -> None:
        super().__init__()
        self.health = Health(soak=60, failure_threshold=2, interval=10, checks=(READY, ERRORS))
        self.world = HealthWorld()
        self.world.rollout(live=True, health=self.health)
        self.world.step(0)
        self.job = self.world.job("n1").job_id
        self.finished: float | None = None
        self.t = 0.0
        self.agent: CheckReport | None = None
        self.metric: MetricCheck | None = None
        self.passed_at: float | None = None

    def _step(self) -> None:
        if self.agent is not None:
            self.world.beat("n1", self.agent)
        if self.metric is not None:
            self.world.metrics[("n1", "errors")] = self.metric
        before = self.world.state("n1")
        self.world.step(self.t)
        if before == "dispatched" and self.world.state("n1") == "succeeded":
            self.passed_at = self.t
            self.check_the_pass()

    def check_the_pass(self) -> None:
        assert self.agent is not None and self.agent.ok and self.agent.ok_since is not None
        assert self.metric is not None and self.metric.ok_since is not None
        soak = timedelta(seconds=self.health.soak)
        assert datetime.fromisoformat(self.agent.ok_since) <= at(self.t) - soak
        assert self.metric.ok_since <= at(self.t) - soak
        assert self.finished is not None and at(self.finished) <= at(self.t) - soak

    @rule(seconds=st.integers(1, 40))
    def time_passes(self, seconds: int) -> None:
        self.t += seconds
        self._step()

    @rule()
    def job_finishes(self) -> None:
        if self.finished is None:
            self.finished = self.t
            self.world.succeed("n1", at=at(self.t))
            self._step()

    @rule(ok=st.booleans())
    def agent_probes(self, ok: bool) -> None:
        if self.finished is None:
            return
        previous = self.agent
        if ok:
            since = previous.ok_since if previous is not None and previous.ok else None
            self.agent = CheckReport("ready", self.job, True, since or format_time(at(self.t)), 0)
        else:
            failures = (previous.failures if previous is not None else 0) + 1
            self.agent = CheckReport("ready", self.job, False, None, failures, "status 503")
        self._step()

    @rule(answer=st.sampled_from(["holds", "out", "error"]))
    def prometheus_answers(self, answer: str) -> None:
        if self.finished is None:
            return
        value = MetricAnswer(
            samples=(("", 0.0 if answer == "holds" else 1.0),),
            error="timeout" if answer == "error" else "",
        )
        self.metric = he.fold_metric_answer(self.metric, ERRORS, self.job, value, at(self.t))
        self._step()

    @invariant()
    def a_passed_node_stays_passed_and_nothing_passes_before_the_soak(self) -> None:
        node = self.world.node("n1")
        if node.state == "succeeded":
            assert self.passed_at is not None and self.passed_at >= self.health.soak


TestSoakMachine = SoakMachine.TestCase
TestSoakMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
