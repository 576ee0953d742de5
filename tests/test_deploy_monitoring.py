"""The monitoring shipped in example-repo/deploy/ (docs/operating.md): the
Grafana dashboard parses, every query in it and in the alert rules names
only metrics the daemon and the agents export (read from a running
daemon's /metrics and from the metrics classes), and Debian's ``promtool``
accepts the rules."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconciler.daemon.gauges import PhaseGauges
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.notifications import Notifier
from reconciler.engine.inputs import FleetStep
from reconciler.node.agent_metrics import AgentMetrics
from reconciler.spec.evals import Eval
from reconciler.spec.rollout_status import Waiting
from reconciler.spec.safe_yaml import load_yaml
from tests.kit.agents import start_agent
from tests.kit.daemons import DaemonProcess
from tests.kit.documents import make_status, node_yaml
from tests.kit.git import make_bare_repo
from tests.kit.keys import make_key
from tests.kit.web_statuses import failed_canary

DEPLOY = Path(__file__).resolve().parent.parent / "example-repo" / "deploy"
DASHBOARD = DEPLOY / "grafana-dashboard.json"
RULES = DEPLOY / "prometheus-alerts.yaml"
OURS = re.compile(r"\breconciler_[a-zA-Z0-9_]+")


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]


def rule_queries() -> list[str]:
    rules = load_yaml(str(RULES), RULES.read_bytes())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def exported(text: str) -> set[str]:
    """The sample names in Prometheus text."""
    return {line.split("{")[0].split()[0] for line in text.splitlines() if line[:1].isalpha()}


def class_names() -> set[str]:
    metrics = Metrics()
    Notifier([], metrics=metrics).close()  # registers the notification counters
    agent = AgentMetrics(list, list, ["hermes"])
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    names = set()
    for registry in (metrics.registry, agent.registry):
        for family in registry.collect():  # labelled series may have no sample yet
            names |= {family.name + s for s in suffixes.get(family.type, ("",))}
    return names


@pytest.fixture(scope="module")
def daemon_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    root = tmp_path_factory.mktemp("deploy")
    key = make_key(root / "keys" / "reconciler")
    bare = make_bare_repo(root, {"nodes/web-1.yaml": node_yaml("web-1")}, message="Seed")
    with DaemonProcess(bare, key.private, "--metrics", "127.0.0.1:0") as daemon:
        base = f"http://{daemon.metrics_address()}"
        text = httpx.get(f"{base}/metrics", timeout=10).text
    return exported(text)


@pytest.fixture(scope="module")
def agent_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The sample names a real agent process's first scrape carries."""
    root = tmp_path_factory.mktemp("agent")
    key = make_key(root / "keys" / "reconciler")
    agent = start_agent(root / "node", "node-a", key.public, config=b"model: m\n")
    try:
        text = httpx.get(f"{agent.url}/metrics", timeout=10).text
    finally:
        agent.close()
    return exported(text)


def test_the_dashboard_parses_and_every_query_names_an_exported_metric(
    daemon_names: set[str], agent_names: set[str]
) -> None:
    """Every name against real scrapes of a daemon and an agent, but for
    the per-receiver notification counters, which have no sample before a
    receiver is configured: those are read from the metrics class."""
    queries = dashboard_queries()
    assert len(queries) >= 10
    notifications = {n for n in class_names() if n.startswith("reconciler_notifications_")}
    known = daemon_names | agent_names | notifications
    for query in queries:
        names = OURS.findall(query)
        assert names, f"names no metric of ours: {query}"
        assert set(names) <= known, f"unknown metric in {query!r}: {set(names) - known}"


def test_the_dashboard_draws_waits_out_of_service_and_comparisons_the_daemon_exports(
    daemon_names: set[str],
) -> None:
    """The panels for what version 3 added, each on a metric a real
    daemon's scrape carries from its first pass."""
    queries = " ".join(dashboard_queries())
    for name in (
        "reconciler_waits",
        "reconciler_node_out_of_service_seconds_bucket",
        "reconciler_comparisons_total",
    ):
        assert name in queries, name
        assert name in daemon_names, name


def test_the_dashboard_draws_staging_and_evals_a_real_agent_and_daemon_export(
    daemon_names: set[str], agent_names: set[str]
) -> None:
    """The staging and eval panels, each on a metric a real agent's (or,
    for the node records' evals, a real daemon's) first scrape carries."""
    queries = " ".join(dashboard_queries())
    for name in (
        "reconciler_agent_downloaded_bytes_total",
        "reconciler_agent_stage_seconds_bucket",
        "reconciler_agent_store_bytes",
        "reconciler_agent_evals_total",
    ):
        assert name in queries, name
        assert name in agent_names, name
    assert "reconciler_evals_total" in queries
    assert "reconciler_evals_total" in daemon_names


def test_the_daemon_counts_waits_and_observes_out_of_service_and_comparisons_once() -> None:
    metrics = Metrics()
    gauges = PhaseGauges(metrics)
    waiting = replace(
        make_status("w", "running", [("a", 1, "succeeded")]),
        waiting=Waiting("alert_firing", None),
    )
    approval = replace(make_status("p", "pending"), reason="unverified")
    switched = failed_canary("c")
    node = replace(switched.nodes[0], out_of_service=42.0, timings={})
    switched = replace(switched, nodes=(node, *switched.nodes[1:]))
    gauges.update({"w": waiting, "p": approval}, FleetStep(), None)
    merged = {"w": waiting, "p": approval, "c": switched}
    for _ in range(2):  # the same status again observes nothing new
        gauges.update(merged, FleetStep(statuses={"c": switched}), ["c"])

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert value("reconciler_waits", reason="alert_firing") == 1
    assert value("reconciler_waits", reason="approval") == 1
    assert value("reconciler_waits", reason="freeze") == 0
    assert value("reconciler_node_out_of_service_seconds_count") == 1
    assert value("reconciler_node_out_of_service_seconds_sum") == 42.0
    assert value("reconciler_comparisons_total", outcome="failed") == 1
    assert value("reconciler_comparisons_total", outcome="passed") == 0


def _eval_result(name: str, passed: int, total: int) -> dict[str, object]:
    """An eval result as an agent's job record gives it."""
    cases = [
        {"name": f"case-{i}", "ok": i < passed, "answer": "", "detail": ""} for i in range(total)
    ]
    rate = round(100.0 * passed / total, 2)
    return {"name": name, "suiteSha256": "ab" * 32, "passed": passed, "total": total,
            "passRate": rate, "cases": cases}  # fmt: skip


def test_the_daemon_counts_each_node_attempts_evals_once_by_outcome_on_its_scrape() -> None:
    """Through a scrape of the daemon's real metrics server: a node's eval
    results count once however many passes see them, judged against the
    frozen minimum (75% for golden, the default 100% for safety), and a
    new attempt's results count again."""
    metrics = Metrics()
    server = metrics.serve("127.0.0.1:0")
    try:
        gauges = PhaseGauges(metrics)
        status = make_status("e", "running", [("a", 1, "succeeded")])
        assert status.frozen is not None
        golden = Eval("golden", "golden", "http://127.0.0.1:8000", 75.0, 60)
        status = replace(status, frozen=replace(status.frozen, evals=(golden,)))
        results = (_eval_result("golden", 3, 4), _eval_result("safety", 1, 2))
        ran = replace(status, nodes=(replace(status.nodes[0], attempt=1, evals=results),))
        gauges.update({"e": status}, FleetStep(), None)
        for _ in range(2):  # the same status again counts nothing new
            gauges.update({"e": ran}, FleetStep(statuses={"e": ran}), ["e"])
        first = _scraped_evals(server.server_port)
        again = replace(ran, nodes=(replace(ran.nodes[0], attempt=2),))
        gauges.update({"e": again}, FleetStep(statuses={"e": again}), ["e"])
        second = _scraped_evals(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
    assert first == {"passed": 1, "failed": 1}
    assert second == {"passed": 2, "failed": 2}


def _scraped_evals(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        s.labels["outcome"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "reconciler_evals_total"
    }


def test_every_alert_names_an_exported_metric(daemon_names: set[str]) -> None:
    known = daemon_names | class_names()
    alerting = {name for query in rule_queries() for name in OURS.findall(query)}
    assert alerting <= known, alerting - known
    # The alerts the operator guide promises.
    for wanted in (
        "reconciler_last_successful_pass_timestamp_seconds",
        "reconciler_holds",
        "reconciler_pass_errors_total",
        "reconciler_unverified_answers_total",
    ):
        assert wanted in alerting
    assert any('state="offline"' in q for q in rule_queries())


def test_promtool_accepts_the_alert_rules() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is in Debian's prometheus package (.ci/run installs it)"
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout
