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


@dataclass(frozen=True)
class SignedAnswer:
    """An agent's answer as it came, split from its ``evidence``
    (DESIGN.md 12): ``body`` is the answer without ``evidence``, whose
    canonical JSON ``signature`` (standard base64) signs with the key
    ``key_id``. Whether it verifies is the daemon's business, not this value's."""

    body: Mapping[str, Any] = field(hash=False)
    key_id: str
    signature: str


# How the daemon marks an answer it did not believe (DESIGN.md 12): an
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


@dataclass(frozen=True)
class RuntimeReport:
    type: str
    provider: str
    model: str
    profile: str
    config_digest: str = ""


@dataclass(frozen=True)
class Heartbeat:
    node: str
    time: str  # RFC 3339, agent clock
    agent_version: str = ""
    runtimes: tuple[RuntimeReport, ...] = ()
    signed: SignedAnswer | None = None  # as on JobObservation

    def runtime(self, runtime_type: str) -> RuntimeReport | None:
        return next((r for r in self.runtimes if r.type == runtime_type), None)


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
