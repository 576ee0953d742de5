"""Model artifacts in status records: the frozen ``artifacts``, ``stage``,
``drain`` and ``warmup`` of a started rollout, and a node's ``stage``,
``timings`` and ``outOfService``, as plain data and back.

Each is written only when set, so the status of a rollout without artifacts
stays byte for byte what it was. Pure; must not read or write files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from reconciler.spec.artifacts import (
    SIGNATURE_NAME,
    Artifact,
    Drain,
    ModelSigner,
    Stage,
    Warmup,
)
from reconciler.spec.durations import format_duration, parse_duration
from reconciler.spec.times import format_time, parse_time

TIMING_KEYS = ("drainStartedAt", "drainedAt", "activatedAt", "warmedAt", "servingAt")
# A standby apply's: traffic moved to the new slot (absent from other records).
ROUTED_AT = "routedAt"


@dataclass(frozen=True)
class Vouched:
    """Who vouched for a node's model files: the signer whose key verified
    the target's signature there, and that signature file's SHA-256."""

    signer: str
    sha256: str

    def record(self) -> dict[str, str]:
        return {"signer": self.signer, "sha256": self.sha256}


@dataclass(frozen=True)
class StageRecord:
    """A node's latest stage job: its artifacts downloaded and checked ahead
    of its apply. ``attempt`` counts the node's stage jobs in the rollout;
    ``state`` is one of ``rollout_status.STAGE_STATES``."""

    job_id: str
    attempt: int
    state: str
    started_at: datetime
    finished_at: datetime | None = None
    error: str = ""
    signature: Vouched | None = None  # a signed target's, once the node verified it


def node_record(
    stage: StageRecord | None,
    timings: Mapping[str, str | None] | None,
    out_of_service: float | None,
) -> dict[str, Any]:
    """A node record's keys for these values (none when unset)."""
    record: dict[str, Any] = {}
    if stage is not None:
        record["stage"] = {
            "jobId": stage.job_id,
            "attempt": stage.attempt,
            "state": stage.state,
            "startedAt": format_time(stage.started_at),
            "finishedAt": None if stage.finished_at is None else format_time(stage.finished_at),
            "error": stage.error,
        }
        if stage.signature is not None:
            record["stage"]["signature"] = stage.signature.record()
            if stage.state == "staged":  # the node's files, as its stage found them
                record["signature"] = stage.signature.record()
    if timings is not None:
        record["timings"] = {key: timings.get(key) for key in TIMING_KEYS}
        if timings.get(ROUTED_AT) is not None:
            record["timings"][ROUTED_AT] = timings[ROUTED_AT]
    if out_of_service is not None:
        record["outOfService"] = out_of_service
    return record


def node_from(record: Mapping[str, Any]) -> dict[str, Any]:
    """``NodeRecord`` keyword arguments from a node record."""
    values: dict[str, Any] = {}
    stage = record.get("stage")
    if stage is not None:
        finished = stage.get("finishedAt")
        values["stage"] = StageRecord(
            job_id=stage["jobId"],
            attempt=stage["attempt"],
            state=stage["state"],
            started_at=parse_time(stage["startedAt"]),
            finished_at=None if finished is None else parse_time(finished),
            error=stage.get("error", ""),
            signature=vouched_from(stage.get("signature")),
        )
    if record.get("timings") is not None:
        values["timings"] = dict(record["timings"])
    if record.get("outOfService") is not None:
        values["out_of_service"] = record["outOfService"]
    return values


def vouched_from(value: Any) -> Vouched | None:
    """A ``{signer, sha256}`` record, or None when absent."""
    if not isinstance(value, Mapping):
        return None
    return Vouched(str(value["signer"]), str(value["sha256"]))


def frozen_record(
    artifacts: tuple[Artifact, ...],
    stage: Stage | None,
    drain: Drain | None,
    warmup: tuple[Warmup, ...],
    signature: Artifact | None = None,
    signers: tuple[ModelSigner, ...] = (),
) -> dict[str, Any]:
    """The frozen record's keys for these values (none when unset)."""
    record: dict[str, Any] = {}
    if signature is not None:
        record["signature"] = {
            "url": signature.url,
            "sha256": signature.sha256,
            "size": signature.size,
        }
    if signers:
        record["signers"] = [
            {"name": s.name, "publicKey": s.public_key, "models": list(s.models)} for s in signers
        ]
    if artifacts:
        record["artifacts"] = [_artifact_record(a) for a in artifacts]
    if stage is not None:
        record["stage"] = {
            "ahead": stage.ahead,
            "maxConcurrent": stage.max_concurrent,
            "timeout": format_duration(stage.timeout_seconds),
        }
    if drain is not None:
        metric = drain.idle_metric
        idle = {
            "url": drain.idle_url,
            "metric": metric if isinstance(metric, str) else list(metric),
            "max": drain.idle_max,
        }
        if drain.runtime:
            idle["runtime"] = drain.runtime
        record["drain"] = {"timeout": format_duration(drain.timeout_seconds), "idle": idle}
    if warmup:
        record["warmup"] = [
            {
                "http": {
                    "url": w.url,
                    "method": w.method,
                    "body": w.body,
                    "expectStatus": w.expect_status,
                    "timeout": format_duration(w.timeout_seconds),
                },
                "times": w.times,
                **({"runtime": w.runtime} if w.runtime else {}),
            }
            for w in warmup
        ]
    return record


def _artifact_record(artifact: Artifact) -> dict[str, Any]:
    record: dict[str, Any] = {
        "name": artifact.name,
        "url": artifact.url,
        "sha256": artifact.sha256,
        "size": artifact.size,
    }
    if artifact.path:
        record["path"] = artifact.path
    return record


def frozen_from(record: Mapping[str, Any]) -> dict[str, Any]:
    """``FrozenSpec`` keyword arguments from a frozen record."""
    values: dict[str, Any] = {}
    signature = record.get("signature")
    if signature is not None:
        values["signature"] = Artifact(
            SIGNATURE_NAME, signature["url"], signature["sha256"], signature["size"]
        )
    if "signers" in record:
        values["signers"] = tuple(
            ModelSigner(s["name"], s["publicKey"], tuple(s["models"])) for s in record["signers"]
        )
    if "artifacts" in record:
        values["artifacts"] = tuple(
            Artifact(a["name"], a["url"], a["sha256"], a["size"], a.get("path", ""))
            for a in record["artifacts"]
        )
    stage = record.get("stage")
    if stage is not None:
        values["stage"] = Stage(
            stage["ahead"], stage["maxConcurrent"], parse_duration(stage["timeout"])
        )
    drain = record.get("drain")
    if drain is not None:
        idle = drain["idle"]
        metric = idle["metric"]
        values["drain"] = Drain(
            parse_duration(drain["timeout"]),
            idle["url"],
            metric if isinstance(metric, str) else tuple(metric),
            idle["max"],
            idle.get("runtime", ""),
        )
    if "warmup" in record:
        values["warmup"] = tuple(
            Warmup(
                w["http"]["url"],
                w["http"]["method"],
                w["http"]["body"],
                w["http"]["expectStatus"],
                parse_duration(w["http"]["timeout"]),
                w["times"],
                w.get("runtime", ""),
            )
            for w in record["warmup"]
        )
    return values


def out_of_service(timings: Mapping[str, str | None]) -> float | None:
    """Seconds a node did not serve: ``servingAt`` minus ``drainStartedAt``
    (or ``activatedAt`` without drain); None when the times do not say.
    Both are the agent's clock, compared only with each other. A standby
    apply that routed traffic to a warm slot never stopped serving: 0."""
    if timings.get(ROUTED_AT) is not None:
        return 0
    serving = timings.get("servingAt")
    start = timings.get("drainStartedAt") or timings.get("activatedAt")
    if serving is None or start is None:
        return None
    try:
        seconds = (parse_time(serving) - parse_time(start)).total_seconds()
    except ValueError:
        return None
    return round(seconds, 3) if seconds >= 0 else None
