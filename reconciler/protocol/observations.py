"""What the daemon saw of the fleet in one pass, as values handed to the
engine. Agent times (``finished_at``, heartbeat ``time``) are the agent's own
clock and are compared only with each other; the daemon's clock enters the
engine only as ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from reconciler.protocol.canary_observations import AlertAnswer, CanaryWatch


@dataclass(frozen=True)
class SignedAnswer:
    """An agent's answer as it came, split from its ``evidence``
    (docs/trust.md): ``body`` is the answer without ``evidence``, whose
    canonical JSON ``signature`` (standard base64) signs with the key
    ``key_id``. Whether it verifies is the daemon's business, not this value's."""

    body: Mapping[str, Any] = field(hash=False)
    key_id: str
    signature: str


# How the daemon marks an answer it did not believe (docs/trust.md): an
# ``unreachable`` job observation whose error starts with this.
NO_EVIDENCE = "no evidence:"

# Job states as the agent reports them, plus what the daemon's client adds:
#   refused      the agent answered the POST with a 4xx (a failed verdict)
#   unreachable  connection error, timeout, 5xx or an answer we cannot use


@dataclass(frozen=True)
class JobObservation:
    job_id: str
    state: str
    error: str = ""  # agent error code and message, for failed and refused
    backup_id: str | None = None
    finished_at: str | None = None  # RFC 3339, agent clock
    source_commit: str | None = None
    detail: str = ""  # what a dry-run would change, or the after-apply output tail
    # the signed answer this observation was read from; the daemon keeps it
    # only when it verified against the node's agentKey
    signed: SignedAnswer | None = None
    # a live apply's drainStartedAt .. servingAt (agent clock), when the agent gave them
    timings: Mapping[str, str | None] | None = field(default=None, hash=False)
    # a signed target's stage: {signer, sha256} of the signature the node verified
    signature: Mapping[str, str] | None = field(default=None, hash=False)
    # a live apply's evals as the agent ran them (docs/evals.md), when it had any
    evals: tuple[Mapping[str, Any], ...] | None = field(default=None, hash=False)
    # an apply or restore on slots: {slot (the previous one kept warm, or
    # None), serving, warm (restores)} (docs/rollouts.md#warm-standby)
    standby: Mapping[str, Any] | None = field(default=None, hash=False)


@dataclass(frozen=True)
class RuntimeReport:
    type: str
    provider: str
    model: str
    profile: str
    config_digest: str = ""


@dataclass(frozen=True)
class CheckReport:
    """One agent check as a heartbeat reports it (docs/health.md): ``ok_since``
    starts the current unbroken run of successes (None while failing),
    ``failures`` counts consecutive failures. Times are the agent's clock."""

    name: str
    job_id: str
    ok: bool
    ok_since: str | None
    failures: int
    last_error: str = ""
    probed_at: str | None = None


@dataclass(frozen=True)
class Heartbeat:
    node: str
    time: str  # RFC 3339, agent clock
    agent_version: str = ""
    runtimes: tuple[RuntimeReport, ...] = ()
    signed: SignedAnswer | None = None  # as on JobObservation
    checks: tuple[CheckReport, ...] = ()

    def runtime(self, runtime_type: str) -> RuntimeReport | None:
        return next((r for r in self.runtimes if r.type == runtime_type), None)

    def check(self, name: str, job_id: str) -> CheckReport | None:
        return next((c for c in self.checks if c.name == name and c.job_id == job_id), None)


def parse_check_reports(data: Any) -> tuple[CheckReport, ...]:
    """A heartbeat's ``checks`` (JSON already decoded; absent in version 1
    heartbeats) as values; ValueError says what is wrong with it."""
    if data is None:
        return ()
    if not isinstance(data, list) or not all(isinstance(c, dict) for c in data):
        raise ValueError("heartbeat checks is not a list of objects")
    reports = []
    for item in data:
        name, job_id, ok, failures = (item.get(k) for k in ("name", "jobId", "ok", "failures"))
        ok_since, probed_at = item.get("okSince"), item.get("probedAt")
        if not (isinstance(name, str) and isinstance(job_id, str) and isinstance(ok, bool)):
            raise ValueError("a heartbeat check lacks name, jobId or ok")
        if type(failures) is not int or failures < 0:
            raise ValueError(f"heartbeat check {name}: failures is not a count")
        if not (ok_since is None or isinstance(ok_since, str)):
            raise ValueError(f"heartbeat check {name}: okSince is not a time")
        error = item.get("lastError")
        reports.append(
            CheckReport(
                name=name,
                job_id=job_id,
                ok=ok,
                ok_since=ok_since,
                failures=failures,
                last_error=error if isinstance(error, str) else "",
                probed_at=probed_at if isinstance(probed_at, str) else None,
            )
        )
    return tuple(reports)


@dataclass(frozen=True)
class MetricAnswer:
    """Prometheus's answer to one instant query: the samples of a vector
    result as (labels as text, value), or ``error`` (no evidence: an error,
    a timeout, an unreachable server, a result that is not a vector);
    ``rejected`` when Prometheus refused the query itself (HTTP 400)."""

    samples: tuple[tuple[str, float], ...] = ()
    error: str = ""
    rejected: bool = False


@dataclass(frozen=True)
class MetricCheck:
    """What the daemon's own asking of Prometheus has shown so far for one
    node's check during one job (docs/health.md), daemon clock, kept in memory
    only: a restart starts it again, so a soak restarts, never shortens.

    ``ok_since``: the first holding answer after the job finished with no
    answer out of bounds since (None: none yet, or broken); ``failures``:
    consecutive answers out of bounds; ``error_since``: when the current run
    of answers that are no evidence (error, timeout, unreachable) began;
    ``rejected``: Prometheus refused the query itself (a bad query)."""

    name: str
    job_id: str
    ok_since: datetime | None = None
    failures: int = 0
    detail: str = ""  # the last answer, or why there was none
    error_since: datetime | None = None
    rejected: bool = False


@dataclass(frozen=True)
class Backup:
    backup_id: str
    runtime: str
    created_at: str
    job_id: str
    rollout: str
    provider: str
    model: str


# A backup list's fields (GET /v1/nodes/NAME/backups), by Backup attribute.
BACKUP_FIELDS = {
    "backup_id": "backupId",
    "runtime": "runtime",
    "created_at": "createdAt",
    "job_id": "jobId",
    "rollout": "rollout",
    "provider": "provider",
    "model": "model",
}


# Asked with this query, an agent answers its backup list as an object,
# ``{node, backups}``, which (unlike a bare list) can carry evidence.
SIGNED_LIST_QUERY = "signed=1"


def signed_list_asked(query: str) -> bool:
    return SIGNED_LIST_QUERY in query.split("&")


@dataclass(frozen=True)
class BackupList:
    """A node's backups as an agent listed them, and the evidence of the
    list (None for a bare list): the signature covers every backup's
    ``jobId``, so no backup can be relabelled with another job's."""

    backups: tuple[Backup, ...]
    signed: SignedAnswer | None = None


def parse_backup_list(data: Any) -> tuple[Backup, ...]:
    """An agent's backup list (JSON already decoded) as values, in the
    agent's order; ValueError says what is wrong with it."""
    if not isinstance(data, list) or not all(isinstance(b, dict) for b in data):
        raise ValueError("backup list is not a list of objects")
    backups = []
    for item in data:
        values = {attr: item.get(key) for attr, key in BACKUP_FIELDS.items()}
        for attr, value in values.items():
            if not isinstance(value, str):
                raise ValueError(f"field {BACKUP_FIELDS[attr]} is missing or not text")
        backups.append(Backup(**values))
    return tuple(backups)


@dataclass(frozen=True)
class Observations:
    jobs: Mapping[str, JobObservation] = field(default_factory=dict)  # by job id
    heartbeats: Mapping[str, Heartbeat] = field(default_factory=dict)  # by node
    # by node: when the current run of failed contacts began (daemon clock,
    # kept in memory only, so a restart can delay `unknown`, never hasten it)
    unreachable_since: Mapping[str, datetime] = field(default_factory=dict)
    backups: Mapping[str, tuple[Backup, ...]] = field(default_factory=dict)  # by node, newest first
    # by node: why its answers were not believed (no or bad evidence for
    # its agentKey); each such answer was dropped as no evidence
    unverified: Mapping[str, str] = field(default_factory=dict)
    # by (node, check name): the daemon's prometheus checks of the current job
    metric_checks: Mapping[tuple[str, str], MetricCheck] = field(default_factory=dict)
    # by node: the soak and comparisons of its current job (docs/health.md)
    canary: Mapping[str, CanaryWatch] = field(default_factory=dict)
    # by rollout: what Alertmanager showed for its health.alerts matchers
    alerts: Mapping[str, AlertAnswer] = field(default_factory=dict)
