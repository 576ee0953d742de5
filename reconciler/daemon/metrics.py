"""Prometheus metrics of the daemon and its health answer, served on
``--metrics HOST:PORT``: ``/metrics`` (Prometheus text) and ``/healthz``
(200 while the last successful pass is recent, 503 with the reason
otherwise); any other path is 404.

Every labelled counter and gauge starts at 0 for each of its known label
values, so a rate or an alert works from the first scrape. The server is
prometheus_client's WSGI app behind a small dispatcher on ``wsgiref``'s
threading server, as prometheus_client's own ``start_http_server`` runs.
Must not: decide anything, or read Git.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from reconciler.protocol.build_info import BUILD_INFO, build_version
from reconciler.spec.fleet_status import FLEET_STATES
from reconciler.spec.rollout_status import (
    HOLD_REASONS,
    JOB_KINDS,
    NODE_STATES,
    PHASES,
    WAITING_REASONS,
)

PASS_ERROR_KINDS = ("store", "host_key", "unexpected")
SENT_KINDS = (*JOB_KINDS, "resend")
UNVERIFIED_KINDS = ("job", "heartbeat", "backups")
# What a rollout that is no hold waits for: a window, a freeze, its alerts, approval.
WAIT_REASONS = (*WAITING_REASONS, "approval")
COMPARISON_OUTCOMES = ("passed", "failed", "unknown")
EVAL_OUTCOMES = ("passed", "failed")

_StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.build_info = Gauge(
            BUILD_INFO, "The running daemon's version (always 1)", ["version"],
            registry=r,
        )  # fmt: skip
        self.build_info.labels(version=build_version()).set(1)
        self._pass_metrics(r)
        self._rollout_metrics(r)
        self._fleet_metrics(r)
        _start_at_zero(self.pass_errors, "kind", PASS_ERROR_KINDS)
        _start_at_zero(self.jobs_sent, "kind", SENT_KINDS)
        _start_at_zero(self.verdicts, "state", NODE_STATES)
        _start_at_zero(self.unverified_answers, "kind", UNVERIFIED_KINDS)
        _start_at_zero(self.rollouts, "phase", PHASES)
        _start_at_zero(self.holds, "reason", HOLD_REASONS)
        _start_at_zero(self.fleet_nodes, "state", FLEET_STATES)
        _start_at_zero(self.waits, "reason", WAIT_REASONS)
        _start_at_zero(self.comparisons, "outcome", COMPARISON_OUTCOMES)
        _start_at_zero(self.evals, "outcome", EVAL_OUTCOMES)
        self.health = Health()

    def _pass_metrics(self, r: CollectorRegistry) -> None:
        """Passes, their commits and the jobs they send."""
        self.passes = Counter("reconciler_passes", "Reconcile passes run", registry=r)
        self.last_pass = Gauge(
            "reconciler_last_successful_pass_timestamp_seconds",
            "When the last pass that ran to its end finished (Unix time; 0: none yet)",
            registry=r,
        )
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
        self.poll_failures = Counter(
            "reconciler_poll_failures", "Polls of a remote's branches that failed", registry=r
        )

    def _rollout_metrics(self, r: CollectorRegistry) -> None:
        """Rollouts and their nodes: phases, holds, waits, time out of service,
        comparisons, evals."""
        self.rollouts = Gauge("reconciler_rollouts", "Rollouts by phase", ["phase"], registry=r)
        self.holds = Gauge(
            "reconciler_holds", "Rollouts held, by the reason of their hold", ["reason"],
            registry=r,
        )  # fmt: skip
        self.waits = Gauge(
            "reconciler_waits",
            "Rollouts waiting without a hold, by what they wait for",
            ["reason"],
            registry=r,
        )
        self.out_of_service = Histogram(
            "reconciler_node_out_of_service_seconds",
            "Time a node was out of service in its switch (drain to serving), each node once",
            buckets=(1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
            registry=r,
        )
        self.comparisons = Counter(
            "reconciler_comparisons",
            "Canary comparisons decided, by outcome",
            ["outcome"],
            registry=r,
        )
        self.evals = Counter(
            "reconciler_evals",
            "Eval results of nodes' live applies, by outcome against the frozen minimum",
            ["outcome"],
            registry=r,
        )

    def _fleet_metrics(self, r: CollectorRegistry) -> None:
        """The fleet watch's sweeps and what they found."""
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

    def passed(self) -> None:
        """A pass ran to its end: the daemon is alive."""
        now = time.time()
        self.last_pass.set(now)
        self.health.passed(now)

    def serve(self, address: str, stale_after: float = 180.0) -> WSGIServer:
        """Serve ``/metrics`` and ``/healthz`` on ``address`` in a thread."""
        self.health.stale_after = stale_after
        host, _, port = address.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        app = _dispatcher(make_wsgi_app(self.registry), self.health)
        server = make_server(
            host,
            int(port),
            app,
            server_class=_ThreadingWSGIServer6 if ":" in host else _ThreadingWSGIServer,
            handler_class=_QuietHandler,
        )
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
        return server


def _start_at_zero(metric: Counter | Gauge, label: str, values: Iterable[str]) -> None:
    for value in values:
        metric.labels(**{label: value})


class Health:
    """Whether the daemon passes: healthy while its last successful pass
    ended less than ``stale_after`` seconds ago (the daemon passes at least
    once per reread, interval or poll, whichever is longest)."""

    def __init__(self, stale_after: float = 180.0, clock: Callable[[], float] = time.time) -> None:
        self.stale_after = stale_after
        self.clock = clock
        self.last: float | None = None

    def passed(self, when: float) -> None:
        self.last = when

    def answer(self) -> tuple[bool, dict[str, Any]]:
        """(healthy, a JSON body that says why)."""
        last = self.last
        if last is None:
            return False, {"status": "starting", "reason": "no pass has ended yet"}
        age = max(self.clock() - last, 0.0)
        body = {"lastPassAgeSeconds": round(age, 3), "staleAfterSeconds": self.stale_after}
        if age > self.stale_after:
            reason = (
                f"the last successful pass ended {age:.0f}s ago (more than "
                f"{self.stale_after:.0f}s): passes fail or hang; see the pass_failed log lines"
            )
            return False, {"status": "stale", "reason": reason, **body}
        return True, {"status": "ok", **body}


def _dispatcher(metrics_app: Callable[..., Iterable[bytes]], health: Health) -> Any:
    def app(environ: dict[str, Any], start_response: _StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path == "/healthz":
            healthy, body = health.answer()
            return _json(start_response, "200 OK" if healthy else "503 Service Unavailable", body)
        return _json(
            start_response, "404 Not Found", {"error": "not found: try /metrics or /healthz"}
        )

    return app


def _json(start_response: _StartResponse, status: str, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body).encode() + b"\n"
    start_response(
        status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    )
    return [data]


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingWSGIServer6(_ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not events: nothing is written per request."""
