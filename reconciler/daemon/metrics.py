"""Prometheus metrics of the daemon, served as text on ``--metrics HOST:PORT``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.passes = Counter("reconciler_passes", "Reconcile passes run", registry=r)
        self.pass_errors = Counter(
            "reconciler_pass_errors", "Passes that could not run", ["kind"], registry=r
        )
        self.pass_seconds = Histogram(
            "reconciler_pass_duration_seconds",
            "Wall time of one reconcile pass",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.commits = Counter("reconciler_status_commits", "Status commits made", registry=r)
        self.conflicts = Counter(
            "reconciler_conflicts", "Passes that lost the compare-and-swap", registry=r
        )
        self.jobs_sent = Counter(
            "reconciler_jobs_sent", "Jobs sent to agents", ["kind"], registry=r
        )
        self.verdicts = Counter(
            "reconciler_node_transitions", "Node state transitions", ["state"], registry=r
        )
        self.unverified_answers = Counter(
            "reconciler_unverified_answers",
            "Agent answers not believed: no or bad evidence for the node's agentKey",
            ["kind"],
            registry=r,
        )
        self.rollouts = Gauge("reconciler_rollouts", "Rollouts by phase", ["phase"], registry=r)
        self.fleet_nodes = Gauge(
            "reconciler_fleet_nodes",
            "Nodes by fleet state (status/fleet.yaml)",
            ["state"],
            registry=r,
        )
        self.fleet_sweeps = Counter(
            "reconciler_fleet_sweeps", "Fleet sweeps of every node's heartbeat", registry=r
        )
        self.fleet_sweep_seconds = Histogram(
            "reconciler_fleet_sweep_duration_seconds",
            "Wall time of one fleet sweep",
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.poll_failures = Counter(
            "reconciler_poll_failures", "Polls of a remote's branches that failed", registry=r
        )

    def serve(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        start_http_server(int(port), addr=host or "127.0.0.1", registry=self.registry)
