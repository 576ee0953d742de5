"""A comparison is judged when its soak ends, not at the daemon's next
interval (docs/daemon.md): ``reconciler run`` as a real process, with an
interval of ten minutes and the fleet watch off, so that nothing but the
soak's end can start the pass that judges; real agents, and Debian's
``prometheus`` scraping one exporter per node."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

from tests.kit.daemons import DaemonProcess
from tests.kit.documents import node_map, rollout_yaml
from tests.kit.fleets import AgentFleet
from tests.kit.node_exporters import NodeExporter
from tests.kit.prometheus import PrometheusServer
from tests.kit.waiting import wait_for

OLD = b"provider: ollama\nmodel: llama3-8b\nprofile: default\n"
NODES = ("gpu-a1", "gpu-a2", "gpu-a3")
LATENCY = "{name: latency-p95, query: 'request_latency_seconds{node=\"{node}\"}', tolerance: 10%}"


def scraped(prom: PrometheusServer) -> bool:
    result = prom.query("up == 1").get("data", {}).get("result", [])
    return {r["metric"].get("node") for r in result} >= set(NODES)


def judged(fleet: AgentFleet) -> dict[str, Any] | None:
    """gpu-a1's latency-p95 record once it carries a verdict."""
    statuses = fleet.statuses()
    record = node_map(statuses["r"]).get("gpu-a1", {}) if "r" in statuses else {}
    found = [c for c in record.get("checks", ()) if c.get("name") == "latency-p95"]
    return found[0] if found and "pValue" in found[0] else None


def test_a_comparison_is_judged_at_its_soak_end_not_at_the_interval(tmp_path: Path) -> None:
    with ExitStack() as stack:
        made = [stack.enter_context(NodeExporter(n)) for n in NODES]
        prom = stack.enter_context(PrometheusServer(tmp_path, targets=made))
        settings = (
            "apiVersion: reconciler/v1\nkind: Settings\nspec:\n"
            f"  prometheus: {{url: '{prom.url}'}}\n  fleetCheck: {{interval: 0s}}\n"
        )
        fleet = AgentFleet.create(
            tmp_path, {n: {"config": OLD} for n in NODES}, files={"reconciler.yaml": settings}
        )
        stack.callback(fleet.close)
        wait_for(lambda: scraped(prom), 30, "prometheus scraping every node")
        daemon = stack.enter_context(
            DaemonProcess(fleet.bare, fleet.key_path, "--interval", "10m", "--poll", "0.2s")
        )
        health = f"{{soak: 12s, interval: 1s, compare: [{LATENCY}]}}"
        fleet.push(
            {
                "rollouts/r.yaml": rollout_yaml(
                    "r", nodeIds=list(NODES), live=True, batchSize=1, health=health
                )
            }
        )

        # The push, the job's held read and the heartbeat's start the passes
        # up to the soak's start; after it, only the soak's end is due
        # before the interval. A minute is generous and far from ten.
        record = wait_for(lambda: judged(fleet), 60, "gpu-a1's latency-p95 judged")

        assert record["ok"] is True and record["baseline"]["nodes"] == ["gpu-a2", "gpu-a3"]
        assert daemon.process.poll() is None
