"""Comparisons and alerts end to end (docs/health.md): real agents, Debian's
``prometheus`` scraping one exporter per node (latency normal around
100 ms, the canary's times a factor the test sets; request counters with an
error share the test sets), Debian's ``prometheus-alertmanager`` on
loopback, alerts posted and silenced through its API, and the real daemon
stepping a bare repository. Soaks run on real clocks: seconds.

The exporters are synthetic because these tests need exact latency factors
and error shares, which a real runtime cannot be set to; the same comparison
on real llama-server nodes is tests/test_canary_llama_e2e.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reconciler.daemon.loop import Daemon
from tests.kit.alertmanager import AlertmanagerServer
from tests.kit.documents import node_map, rollout_yaml
from tests.kit.fleets import AgentFleet
from tests.kit.node_exporters import NodeExporter
from tests.kit.prometheus import PrometheusServer

OLD = b"provider: ollama\nmodel: llama3-8b\nprofile: default\n"
NODES = ("gpu-a1", "gpu-a2", "gpu-a3")
PAUSE = 0.25  # seconds between passes
LATENCY = "{name: latency-p95, query: 'request_latency_seconds{node=\"{node}\"}', tolerance: 10%}"
ERRORS = (
    "{name: errors, "
    'errors: \'sum(increase(http_requests_total{node="{node}",code="500"}[5s]))\', '
    "total: 'sum(increase(http_requests_total{node=\"{node}\"}[5s]))', tolerance: 0.5%}"
)
PAGES = "{matchers: ['severity=\"page\"']}"


@dataclass
class World:
    fleet: AgentFleet
    daemon: Daemon
    exporters: dict[str, NodeExporter]
    prometheus: PrometheusServer
    alertmanager: AlertmanagerServer | None

    def start(self, health: str) -> None:
        rollout = rollout_yaml("r", nodeIds=list(NODES), live=True, batchSize=1, health=health)
        self.fleet.push({"rollouts/r.yaml": rollout})

    def run_until(
        self, done: Callable[[dict[str, Any]], bool], timeout: float = 120
    ) -> dict[str, Any]:
        return self.fleet.run_until(self.daemon, done, timeout=timeout, pause=PAUSE)


def nodes(statuses: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return node_map(statuses["r"]) if "r" in statuses else {}


def state(statuses: dict[str, Any], name: str) -> str:
    return str(nodes(statuses).get(name, {}).get("state", ""))


def check(record: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in record.get("checks", ()) if c["name"] == name)


def wait_scraped(prom: PrometheusServer, timeout: float = 30) -> None:
    """Until Prometheus has scraped every node's exporter."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = prom.query("up == 1").get("data", {}).get("result", [])
        if {r["metric"].get("node") for r in result} >= set(NODES):
            return
        time.sleep(0.2)
    raise AssertionError("prometheus never scraped every node")


@contextmanager
def world(
    tmp_path: Path, *, alerts: bool = False, **exporters: dict[str, float]
) -> Iterator[World]:
    """Three nodes, an exporter each (``gpu_a1={"factor": 1.3}`` sets one),
    Prometheus, and Alertmanager when ``alerts``."""
    with ExitStack() as stack:
        made = {
            n: stack.enter_context(NodeExporter(n, **exporters.get(n.replace("-", "_"), {})))
            for n in NODES
        }
        prom = stack.enter_context(PrometheusServer(tmp_path, targets=list(made.values())))
        am = stack.enter_context(AlertmanagerServer(tmp_path)) if alerts else None
        settings = (
            "apiVersion: reconciler/v1\nkind: Settings\nspec:\n"
            f"  prometheus: {{url: '{prom.url}'}}\n"
            + (f"  alertmanager: {{url: '{am.url}'}}\n" if am is not None else "")
        )
        fleet = AgentFleet.create(
            tmp_path, {n: {"config": OLD} for n in NODES}, files={"reconciler.yaml": settings}
        )
        stack.callback(fleet.close)
        wait_scraped(prom)
        yield World(fleet, fleet.daemon(), made, prom, am)


def test_a_canary_30_percent_slower_fails_latency_p95_with_both_medians(tmp_path: Path) -> None:
    with world(tmp_path, gpu_a1={"factor": 1.3}) as w:
        w.start(f"{{soak: 12s, interval: 1s, compare: [{LATENCY}]}}")

        statuses = w.run_until(lambda s: state(s, "gpu-a1") == "failed")

        record = nodes(statuses)["gpu-a1"]
        assert record["error"].startswith("health check latency-p95 failed: median ")
        judged = check(record, "latency-p95")
        assert judged["ok"] is False
        assert judged["canary"]["median"] == pytest.approx(0.13, rel=0.05)
        assert judged["baseline"]["median"] == pytest.approx(0.1, rel=0.05)
        assert judged["baseline"]["nodes"] == ["gpu-a2", "gpu-a3"]
        assert judged["canary"]["samples"] >= 10 and judged["baseline"]["samples"] >= 20
        assert judged["pValue"] < 0.05
        assert judged["change"] == pytest.approx(0.3, abs=0.05)
        for side in ("canary", "baseline"):  # the spread the page draws around the median
            low, q1, q3, high = judged[side]["spread"]
            assert low <= q1 <= judged[side]["median"] <= q3 <= high
        assert statuses["r"]["hold"]["reason"] == "health_failed"
        assert state(statuses, "gpu-a2") == "pending"


@pytest.mark.parametrize("plain", [False, True], ids=["combined", "plain"])
def test_run_plain_asks_prometheus_a_query_at_a_time_and_judges_the_same(
    tmp_path: Path, plain: bool
) -> None:
    """Two comparisons over three nodes: the daemon sends the queries of one
    window and step to Prometheus as one combined request, and ``plain``
    (``run --plain``) one request each; both fail the slow canary alike."""
    with world(tmp_path, gpu_a1={"factor": 1.3}) as w:
        w.daemon = w.fleet.daemon(plain=plain)
        w.start(f"{{soak: 12s, interval: 1s, compare: [{LATENCY}, {ERRORS}]}}")
        before = w.prometheus.range_queries_answered()

        statuses = w.run_until(lambda s: state(s, "gpu-a1") == "failed")

        asked = w.prometheus.range_queries_answered() - before
        judged = check(nodes(statuses)["gpu-a1"], "latency-p95")
        assert judged["ok"] is False and judged["baseline"]["nodes"] == ["gpu-a2", "gpu-a3"]
        assert check(nodes(statuses)["gpu-a1"], "errors")["ok"] is True
        # A judging round asks latency for the canary and the baseline's two
        # nodes, errors and totals for each of the three: nine queries, in one
        # request when combined. A round or two judge the node.
        if plain:
            assert asked >= 9, asked
        else:
            assert 1 <= asked <= 3, asked


def test_a_canary_3_percent_slower_passes_with_a_10_percent_tolerance(tmp_path: Path) -> None:
    with world(tmp_path, gpu_a1={"factor": 1.03}) as w:
        w.start(f"{{soak: 12s, interval: 1s, compare: [{LATENCY}]}}")

        statuses = w.run_until(lambda s: state(s, "gpu-a1") == "succeeded")

        judged = check(nodes(statuses)["gpu-a1"], "latency-p95")
        assert judged["ok"] is True
        assert judged["change"] < 0.1  # the medians' noise is a few percent either way
        assert judged["baseline"]["nodes"] == ["gpu-a2", "gpu-a3"]


def test_an_error_rate_from_a_tenth_of_a_percent_to_two_percent_fails_errors(
    tmp_path: Path,
) -> None:
    with world(tmp_path, gpu_a1={"error_share": 0.02}) as w:
        w.start(f"{{soak: 12s, interval: 1s, compare: [{ERRORS}]}}")

        statuses = w.run_until(lambda s: state(s, "gpu-a1") == "failed")

        record = nodes(statuses)["gpu-a1"]
        assert record["error"].startswith("health check errors failed: rate ")
        judged = check(record, "errors")
        assert judged["canary"]["rate"] == pytest.approx(0.02, rel=0.1)
        assert judged["baseline"]["rate"] == pytest.approx(0.001, rel=0.5)
        assert judged["pValue"] < 0.05


def test_too_few_samples_hold_health_unknown_never_passed_nor_failed(tmp_path: Path) -> None:
    with world(tmp_path, gpu_a1={"factor": 1.3}) as w:
        few = LATENCY.replace("tolerance: 10%", "tolerance: 10%, minSamples: 100")
        w.start(f"{{soak: 5s, interval: 1s, compare: [{few}]}}")

        statuses = w.run_until(lambda s: state(s, "gpu-a1") not in ("", "pending", "dispatched"))

        record = nodes(statuses)["gpu-a1"]
        assert record["state"] == "unknown"
        assert "too few samples to judge" in record["error"]
        assert statuses["r"]["hold"]["reason"] == "health_unknown"


def test_an_alert_naming_a_soaking_node_fails_it(tmp_path: Path) -> None:
    with world(tmp_path, alerts=True) as w:
        assert w.alertmanager is not None
        w.start(f"{{soak: 2m, interval: 1s, alerts: {PAGES}}}")
        w.run_until(lambda s: "gpu-a1" in w.daemon.observer.canary.watches)

        w.alertmanager.post_alert("GpuHot", node="gpu-a1", severity="page")
        statuses = w.run_until(lambda s: state(s, "gpu-a1") == "failed")

        record = nodes(statuses)["gpu-a1"]
        assert record["error"].startswith("health check alerts failed: alert GpuHot firing since ")
        assert statuses["r"]["hold"]["reason"] == "health_failed"


def test_a_fleet_wide_alert_stops_the_next_batch_until_silenced(tmp_path: Path) -> None:
    with world(tmp_path, alerts=True) as w:
        assert w.alertmanager is not None
        w.start(f"{{soak: 6s, interval: 1s, alerts: {PAGES}}}")
        w.run_until(lambda s: "gpu-a1" in w.daemon.observer.canary.watches)

        w.alertmanager.post_alert("DatacenterHot", severity="page")
        statuses = w.run_until(
            lambda s: (
                state(s, "gpu-a1") == "succeeded"
                and s["r"].get("waiting", {}).get("reason") == "alert_firing"
            )
        )
        waiting = statuses["r"]["waiting"]
        assert [a["alertname"] for a in waiting["alerts"]] == ["DatacenterHot"]
        assert waiting["alerts"][0]["labels"] == {"alertname": "DatacenterHot", "severity": "page"}
        assert statuses["r"]["phase"] == "running" and statuses["r"].get("hold") is None
        for _ in range(4):  # passes go by: the batch still waits
            w.daemon.run_pass()
        assert state(w.fleet.statuses(), "gpu-a2") == "pending"

        w.alertmanager.silence(alertname="DatacenterHot")
        statuses = w.run_until(lambda s: state(s, "gpu-a2") in ("dispatched", "succeeded"))
        assert statuses["r"].get("waiting") is None


def test_alertmanager_stopped_means_no_new_batch(tmp_path: Path) -> None:
    with world(tmp_path, alerts=True) as w:
        assert w.alertmanager is not None
        w.alertmanager.stop()
        w.start(f"{{soak: 2s, interval: 1s, alerts: {PAGES}}}")

        statuses = w.run_until(
            lambda s: s.get("r", {}).get("waiting", {}).get("reason") == "alertmanager_unreachable"
        )
        for _ in range(4):
            w.daemon.run_pass()
        assert set(node_map(w.fleet.statuses()["r"])) == set(NODES)
        assert all(state(w.fleet.statuses(), n) == "pending" for n in NODES)
        assert statuses["r"]["phase"] == "running"


def test_a_matcher_alertmanager_rejects_is_a_condition_naming_it(tmp_path: Path) -> None:
    with world(tmp_path, alerts=True) as w:
        w.start("{soak: 2m, interval: 1s, alerts: {matchers: ['severity=~\"(']}}")

        statuses = w.run_until(
            lambda s: any(
                c["type"] == "alert_matchers_rejected" for c in s.get("r", {}).get("conditions", ())
            )
        )

        condition = next(
            c for c in statuses["r"]["conditions"] if c["type"] == "alert_matchers_rejected"
        )
        assert condition["message"].startswith(
            'Alertmanager rejects the matchers severity=~"(: matcher value contains unescaped'
        )
