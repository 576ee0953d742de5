"""A job payload as the node reads it: a frozen, typed value parsed once from
the signed JSON.

``read_job`` is the one parser. The agent calls it right after admission,
and the journal calls it for a record read back after a restart, so a job
looks the same to the node's job code either way. The signed mapping stays
in ``signed``: it is what the journal stores and what ``same_job`` compares,
and it is never changed.

Lists the node hands on to code that speaks the wire format (the artifact
store and downloader, the health prober) keep their entries as they were
signed, beside the typed fields that the job code reads.

Must not verify, validate against the schema (admission did), do IO or read
the clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

SLOT_PORT = "{slotPort}"  # in a warm-up or eval URL: the port of the slot switched to


@dataclass(frozen=True)
class JobTarget:
    runtime: str
    provider: str
    model: str
    profile: str


@dataclass(frozen=True)
class JobArtifact:
    """A file the node must hold; ``entry`` is it as signed, for the store."""

    name: str
    url: str
    sha256: str
    size: int
    path: str | None
    entry: Mapping[str, Any]


@dataclass(frozen=True)
class JobSignature:
    url: str
    sha256: str
    size: int
    entry: Mapping[str, Any]


@dataclass(frozen=True)
class JobSigner:
    name: str
    public_key: str


@dataclass(frozen=True)
class JobDrain:
    timeout_seconds: int
    idle_url: str
    idle_metrics: tuple[str, ...]  # summed over their series
    idle_max: float


@dataclass(frozen=True)
class JobWarmup:
    url: str
    method: str
    body: str
    expect_status: int
    timeout_seconds: int
    times: int


@dataclass(frozen=True)
class EvalRequest:
    max_tokens: int
    temperature: float
    seed: int | None


@dataclass(frozen=True)
class EvalSuite:
    """One golden-prompt suite as frozen at the rollout's start. Cases stay
    as signed: each one's expectation is a one-key object judged by its key."""

    name: str
    url: str
    min_pass_rate: float
    timeout: int
    api: str  # completions | chat
    request: EvalRequest
    suite_sha256: str
    cases: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class JobPayload:
    """What the node's job code reads of a job. ``kind`` is one of apply,
    restore, stage, eval and release."""

    job_id: str
    kind: str
    node: str
    rollout: str
    attempt: int
    mode: str  # dry_run | live
    target: JobTarget
    source_commit: str
    issued_at: str
    expires_at: str
    signed: dict[str, Any]  # never changed
    backup_id: str | None = None
    artifacts: tuple[JobArtifact, ...] = ()
    signature: JobSignature | None = None
    signers: tuple[JobSigner, ...] = ()
    drain: JobDrain | None = None
    warmup: tuple[JobWarmup, ...] = ()
    evals: tuple[EvalSuite, ...] = ()
    checks: tuple[Mapping[str, Any], ...] = ()  # as signed: the prober reads them
    keep_previous: str | None = None  # standby: untilSoaked | untilCompleted
    timeout_seconds: int | None = None  # stage jobs

    @property
    def live(self) -> bool:
        return self.mode == "live"

    @property
    def standby(self) -> bool:
        return self.keep_previous is not None

    def artifact_entries(self) -> list[Mapping[str, Any]]:
        """The artifacts as signed, for the store, downloader and model directories."""
        return [a.entry for a in self.artifacts]

    def on_slot_port(self, port: int) -> JobPayload:
        """This job with every warm-up and eval URL's slot port made ``port``."""
        here = str(port)
        return replace(
            self,
            warmup=tuple(replace(w, url=w.url.replace(SLOT_PORT, here)) for w in self.warmup),
            evals=tuple(
                replace(
                    e,
                    url=e.url.replace(SLOT_PORT, here),
                    cases=tuple(_on_slot_port(c, here) for c in e.cases),
                )
                for e in self.evals
            ),
        )


def _on_slot_port(value: Any, port: str) -> Any:
    """``value`` with every string under a ``url`` key made to name ``port``,
    at any depth, as the slot switch has always rewritten a suite."""
    if isinstance(value, list):
        return [_on_slot_port(v, port) for v in value]
    if isinstance(value, dict):
        return {
            k: v.replace(SLOT_PORT, port)
            if k == "url" and isinstance(v, str)
            else _on_slot_port(v, port)
            for k, v in value.items()
        }
    return value


def read_job(signed: dict[str, Any]) -> JobPayload:
    """The typed job of an admitted payload (or of one the journal kept)."""
    target = signed["target"]
    signature = signed.get("signature")
    drain = signed.get("drain")
    standby = signed.get("standby")
    timeout = signed.get("timeoutSeconds")
    return JobPayload(
        job_id=signed["jobId"],
        kind=signed["kind"],
        node=signed["node"],
        rollout=signed["rollout"],
        attempt=signed["attempt"],
        mode=signed["mode"],
        target=JobTarget(target["runtime"], target["provider"], target["model"], target["profile"]),
        source_commit=signed["sourceCommit"],
        issued_at=signed["issuedAt"],
        expires_at=signed["expiresAt"],
        backup_id=signed.get("backupId"),
        artifacts=tuple(_artifact(a) for a in signed.get("artifacts") or ()),
        signature=(
            JobSignature(signature["url"], signature["sha256"], signature["size"], signature)
            if signature
            else None
        ),
        signers=tuple(JobSigner(s["name"], s["publicKey"]) for s in signed.get("signers") or ()),
        drain=_drain(drain) if drain else None,
        warmup=tuple(_warmup(w) for w in signed.get("warmup") or ()),
        evals=tuple(_suite(e) for e in signed.get("evals") or ()),
        checks=tuple(signed.get("checks") or ()),
        keep_previous=standby["keepPrevious"] if standby else None,
        timeout_seconds=int(timeout) if timeout is not None else None,
        signed=signed,
    )


def _artifact(entry: Mapping[str, Any]) -> JobArtifact:
    return JobArtifact(
        entry["name"], entry["url"], entry["sha256"], entry["size"], entry.get("path"), entry
    )


def _drain(drain: Mapping[str, Any]) -> JobDrain:
    idle = drain["idle"]
    metric = idle["metric"]
    metrics: Sequence[str] = [metric] if isinstance(metric, str) else metric
    return JobDrain(drain["timeoutSeconds"], idle["url"], tuple(metrics), float(idle["max"]))


def _warmup(warmup: Mapping[str, Any]) -> JobWarmup:
    return JobWarmup(
        url=warmup["url"],
        method=warmup["method"],
        body=warmup["body"],
        expect_status=warmup["expectStatus"],
        timeout_seconds=warmup["timeoutSeconds"],
        times=warmup["times"],
    )


def _suite(suite: Mapping[str, Any]) -> EvalSuite:
    request = suite["request"]
    return EvalSuite(
        name=suite["name"],
        url=suite["url"],
        min_pass_rate=float(suite["minPassRate"]),
        timeout=suite["timeout"],
        api=suite["api"],
        request=EvalRequest(request["maxTokens"], request["temperature"], request.get("seed")),
        suite_sha256=suite["suiteSha256"],
        cases=tuple(suite["cases"]),
    )
