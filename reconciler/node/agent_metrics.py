"""The agent's Prometheus metrics, served on ``GET /metrics``: its version
(``reconciler_build_info``, as the daemon's), jobs by kind
and outcome, refusals by code, the health checks' current results, the
backups it holds, staging (bytes downloaded, stage job seconds, the
artifact store's size) and evals run by outcome. Counters start at 0 for
every known label value.

Must not: decide anything. What is read at scrape time (checks, backups,
store size) is read from the agent's own state, never from the network.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from reconciler.node.state_dir import BackupInfo
from reconciler.protocol.build_info import BUILD_INFO, build_version
from reconciler.spec.rollout_status import JOB_KINDS

JOB_OUTCOMES = ("accepted", "succeeded", "failed")
REFUSAL_CODES = (
    "invalid_job",
    "bad_signature",
    "untrusted_key",
    "wrong_node",
    "expired",
    "not_yet_valid",
    "unsupported_runtime",
    "live_not_allowed",
    "job_conflict",
    "journal_unwritable",
)
CHECK_RESULTS = ("ok", "failing")
EVAL_OUTCOMES = ("passed", "failed")
# A stage job lasts from a held file's instant answer to a model's hour.
STAGE_BUCKETS = (0.1, 1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600)


class AgentMetrics:
    def __init__(
        self,
        checks: Callable[[], Sequence[Mapping[str, Any]]],
        backups: Callable[[], Iterable[BackupInfo]],
        runtimes: Iterable[str],
        store_bytes: Callable[[], int] = lambda: 0,
    ) -> None:
        self.registry = r = CollectorRegistry()
        self._checks, self._backups = checks, backups
        self.build_info = Gauge(
            BUILD_INFO, "The running agent's version (always 1)", ["version"], registry=r
        )
        self.build_info.labels(version=build_version()).set(1)
        self.jobs = Counter(
            "reconciler_agent_jobs", "Jobs by kind and outcome", ["kind", "outcome"], registry=r
        )
        self.refusals = Counter(
            "reconciler_agent_refusals", "Jobs refused, by the refusal's code", ["code"],
            registry=r,
        )  # fmt: skip
        self.checks = Gauge(
            "reconciler_agent_checks", "Health checks by their latest result", ["result"],
            registry=r,
        )  # fmt: skip
        self.backups = Gauge(
            "reconciler_agent_backups", "Backups held, by runtime", ["runtime"], registry=r
        )
        self._staging_metrics(r, store_bytes)
        self.evals = Counter(
            "reconciler_agent_evals",
            "Evals run in live applies (one per suite), by outcome",
            ["outcome"],
            registry=r,
        )
        for outcome in EVAL_OUTCOMES:
            self.evals.labels(outcome=outcome)
        for kind in JOB_KINDS:
            for outcome in JOB_OUTCOMES:
                self.jobs.labels(kind=kind, outcome=outcome)
        for code in REFUSAL_CODES:
            self.refusals.labels(code=code)
        self._runtimes = tuple(runtimes)

    def _staging_metrics(self, r: CollectorRegistry, store_bytes: Callable[[], int]) -> None:
        self.downloaded = Counter(
            "reconciler_agent_downloaded_bytes",
            "Artifact bytes downloaded by stage jobs (a restarted download counts again)",
            registry=r,
        )
        self.stage_seconds = Histogram(
            "reconciler_agent_stage_seconds",
            "Wall time of one live stage job, succeeded or failed",
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.store_bytes = Gauge(
            "reconciler_agent_store_bytes",
            "Bytes of the files in the artifact store, partial downloads included",
            registry=r,
        )
        self.store_bytes.set_function(store_bytes)

    def counted_evals(self, held: Iterable[bool]) -> None:
        """One eval result each: held (passed) or not (failed)."""
        for ok in held:
            self.evals.labels(outcome="passed" if ok else "failed").inc()

    def text(self) -> bytes:
        """The Prometheus text exposition, the read-at-scrape gauges set now."""
        results = Tally("ok" if c.get("ok") else "failing" for c in self._checks())
        for result in CHECK_RESULTS:
            self.checks.labels(result=result).set(results[result])
        held = Tally(b.runtime for b in self._backups())
        for runtime in {*self._runtimes, *held}:
            self.backups.labels(runtime=runtime).set(held[runtime])
        return generate_latest(self.registry)
