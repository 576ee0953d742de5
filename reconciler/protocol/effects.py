"""What the engine asks the outside world to do, as data. The daemon
executes effects only after the status that records them is committed."""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.spec.artifacts import Artifact, Drain, ModelSigner, Warmup
from reconciler.spec.evals import Eval
from reconciler.spec.health import Health
from reconciler.spec.model import Target

JOB_KINDS = ("apply", "restore", "stage", "eval", "release")


@dataclass(frozen=True)
class SendJob:
    """One job for one node. Everything in the signed payload except the
    issue and expiry times, which the sender stamps when it sends; so the
    same job id always carries the same payload (docs/architecture.md)."""

    job_id: str
    kind: str  # apply | restore | stage | eval | release
    node: str
    rollout: str
    attempt: int
    mode: str  # dry_run | live
    target: Target
    source_commit: str
    backup_id: str | None = None  # restore only
    health: Health | None = None  # live applies with agent checks: sent as ``checks``
    artifacts: tuple[Artifact, ...] = ()  # stage jobs, and applies of a rollout with artifacts
    drain: Drain | None = None  # live applies only
    warmup: tuple[Warmup, ...] = ()  # live applies only
    stage_timeout: int | None = None  # stage jobs: seconds the agent may spend (stage.timeout)
    signature: Artifact | None = None  # stage jobs and applies of a signed target
    signers: tuple[ModelSigner, ...] = ()  # with signature: the keys to check it
    evals: tuple[Eval, ...] = ()  # live applies and eval jobs, with their frozen suites
    standby: str | None = None  # live applies with a standby: keepPrevious
    # live applies after an eval baseline: eval -> ((case, answer), ...)
    baseline_answers: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
