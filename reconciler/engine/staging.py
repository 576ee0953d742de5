"""Staging: a rollout's artifacts downloaded to its nodes ahead of their
apply (docs/rollouts.md), as tables and pure rules.

Theory of operation. A node of a rollout with ``target.artifacts`` goes
``pending`` -> ``staging`` (a stage job is sent) -> ``staged`` (every artifact
is held with its digest) -> ``dispatched`` (the apply). Staging is a
pipeline over the frozen order: nodes of the batches from the current one
(the first batch not done) up to ``stage.ahead`` batches beyond it, never
more than ``stage.maxConcurrent`` staging at once, and none started while
the rollout is held. Until one node's stage succeeded (its digests
matched), one node stages alone (``FAN_OUT_RULES``): a wrong digest costs
one download, not a batch's, as the canary goes first for applies. A batch is dispatched only when each of its nodes is
``staged`` or settled without an apply. A stage verdict is decided by
``STAGE_RULES``: nothing on the node changed, so no policy stops or restores.

Values in, values out: the step records what these return. Must not read
the clock, do IO, or know about status files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from reconciler.engine.evidence import Seen
from reconciler.engine.inputs import NodeChange
from reconciler.engine.policy import ALWAYS, FIRST_FAILURE, RETRIED_BEFORE, Decision
from reconciler.engine.records import evolve
from reconciler.protocol.effects import SendJob
from reconciler.protocol.job_ids import job_id
from reconciler.protocol.observations import NO_EVIDENCE, JobObservation
from reconciler.spec.artifact_records import Vouched
from reconciler.spec.artifacts import DEFAULT_STAGE_TIMEOUT, Stage
from reconciler.spec.durations import format_duration
from reconciler.spec.model import ON_FAILURE_MODES
from reconciler.spec.rollout_status import (
    BatchRecord,
    FrozenSpec,
    NodeRecord,
    StageRecord,
)

HOLD = "stage_failed"
# How a node's error starts when its stage failed: the agent's code follows.
STAGE_FAILED = "stage failed"


@dataclass(frozen=True)
class StageRule:
    verdict: str  # failed | unknown
    policy: str
    when: str  # a condition of ``reconciler.engine.policy``
    decision: Decision  # continue | restage | hold
    says: str  # the table cell, as docs/rollouts.md words it


def _rules() -> tuple[StageRule, ...]:
    rules = [
        StageRule("failed", "observe", ALWAYS, Decision("continue"), "record `failed`, continue"),
        StageRule(
            "failed",
            "retry_once",
            FIRST_FAILURE,
            Decision("restage"),
            "node's first automatic retry in this rollout: stage it once more",
        ),
        StageRule(
            "failed",
            "retry_once",
            RETRIED_BEFORE,
            Decision("hold", HOLD),
            f"after that: hold `{HOLD}`",
        ),
        StageRule("unknown", "observe", ALWAYS, Decision("continue"), "record, continue"),
    ]
    # Nothing on the node changed: stop and rollback have nothing to act on.
    for policy in ("pause", "stop", "rollback"):
        rules.append(StageRule("failed", policy, ALWAYS, Decision("hold", HOLD), f"hold `{HOLD}`"))
    for policy in ("pause", "retry_once", "stop", "rollback"):
        rules.append(
            StageRule(
                "unknown",
                policy,
                ALWAYS,
                Decision("hold", "health_unknown"),
                "hold `health_unknown`",
            )
        )
    return tuple(rules)


# One rule per (verdict, policy, condition); ``decide`` takes the first that holds.
STAGE_RULES: tuple[StageRule, ...] = _rules()
assert all(
    any(r.verdict == v and r.policy == p for r in STAGE_RULES)
    for v in ("failed", "unknown")
    for p in ON_FAILURE_MODES
)


def decide(policy: str, verdict: str, *, auto_retried: bool) -> Decision:
    """The decision on a node whose stage ended ``verdict`` (failed or unknown)."""
    for rule in STAGE_RULES:
        if rule.verdict != verdict or rule.policy != policy:
            continue
        if rule.when == ALWAYS or (rule.when == FIRST_FAILURE) != auto_retried:
            return rule.decision
    raise ValueError(f"no stage rule for {verdict!r} under {policy!r}")


@dataclass(frozen=True)
class FanOutRule:
    proven: bool  # a node of the rollout staged: the artifacts' digests matched there
    most: str  # how many nodes may stage at once: one | maxConcurrent
    says: str  # as docs/rollouts.md words it


FAN_OUT_RULES: tuple[FanOutRule, ...] = (
    FanOutRule(False, "one", "no node staged yet: one node stages alone, the first in order"),
    FanOutRule(True, "maxConcurrent", "a node staged: up to `stage.maxConcurrent` at once"),
)
assert sorted(r.proven for r in FAN_OUT_RULES) == [False, True]


def most_staging(nodes: Iterable[NodeRecord], stage: Stage) -> int:
    """How many nodes may be staging at once now (``FAN_OUT_RULES``)."""
    proven = any(n.stage is not None and n.stage.state == "staged" for n in nodes)
    rule = next(r for r in FAN_OUT_RULES if r.proven == proven)
    return 1 if rule.most == "one" else stage.max_concurrent


def render_stage_table() -> str:
    """``STAGE_RULES`` as a Markdown table (verdict rows, policy columns)."""
    header = "| stage verdict | " + " | ".join(ON_FAILURE_MODES) + " |"
    lines = [header, "|---" * (len(ON_FAILURE_MODES) + 1) + "|", "| staged | next |"]
    lines[-1] += " next |" * (len(ON_FAILURE_MODES) - 1)
    for verdict in ("failed", "unknown"):
        cells = [
            "; ".join(r.says for r in STAGE_RULES if r.verdict == verdict and r.policy == p)
            for p in ON_FAILURE_MODES
        ]
        lines.append(f"| {verdict} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# -- where the pipeline stands ----------------------------------------------------


def current_batch(batches: Sequence[BatchRecord]) -> int:
    """The batch being applied, or next to be: the first not done."""
    return next((b.index for b in batches if b.state != "done"), len(batches) + 1)


def window(frozen: FrozenSpec | None, batches: Sequence[BatchRecord]) -> range:
    """The batches whose nodes may be staging or staged now: pending ones up
    to ``ahead`` past the current batch (empty without artifacts)."""
    if frozen is None or not frozen.artifacts:
        return range(0)
    first = current_batch(batches)
    while first <= len(batches) and batches[first - 1].state != "pending":
        first += 1
    last = min(current_batch(batches) + settings_of(frozen).ahead, len(batches))
    return range(first, last + 1)


def needs_stage(frozen: FrozenSpec | None, node: NodeRecord) -> bool:
    """Whether a node's next attempt must be staged before it is applied."""
    if frozen is None or not frozen.artifacts:
        return False
    return node.stage is None or node.stage.state != "staged"


def stage_failure(node: NodeRecord) -> str | None:
    """``failed`` or ``unknown`` when the node's last stage ended so and its
    apply was never sent for it; else None."""
    stage = node.stage
    if stage is None or stage.state not in ("failed", "unknown") or node.state != stage.state:
        return None
    return stage.state if node.verdict is None else None


def to_start(nodes: Sequence[NodeRecord], order: Iterable[int], max_concurrent: int) -> list[int]:
    """Of the nodes at ``order`` (batch by batch, frozen order), the pending
    ones to start staging now without passing ``max_concurrent``."""
    indexes = list(order)
    busy = sum(1 for i in indexes if nodes[i].state == "staging")
    free = max_concurrent - busy
    picked: list[int] = []
    for i in indexes:
        if free <= 0:
            break
        if nodes[i].state == "pending" and nodes[i].held is None:
            picked.append(i)
            free -= 1
    return picked


def batch_ready(nodes: Iterable[NodeRecord], policy: str) -> bool:
    """Whether a batch may be dispatched: each node staged, or settled
    without an apply (skipped, or a failure observe carries on from)."""
    for node in nodes:
        if node.state in ("staged", "skipped"):
            continue
        settled = node.state in ("failed", "unknown", "timed_out") and node.held is None
        if settled and policy == "observe":
            continue
        return False
    return True


# -- a stage job --------------------------------------------------------------------


def next_stage(
    node: NodeRecord, *, rollout: str, start_commit: str, now: datetime, auto_retry: bool = False
) -> NodeRecord:
    """The node's record once its next stage job is recorded."""
    attempt = node.stage.attempt + 1 if node.stage is not None else 1
    return evolve(
        node,
        state="staging",
        held=None,
        error="",
        auto_retried=node.auto_retried or auto_retry,
        stage=StageRecord(
            job_id=job_id(rollout, start_commit, node.name, attempt, "stage"),
            attempt=attempt,
            state="staging",
            started_at=now,
        ),
    )


def stage_job(rollout: str, frozen: FrozenSpec, start_commit: str, node: NodeRecord) -> SendJob:
    """The stage job of a staging node, rebuilt from status alone: its
    source commit is the start commit the artifacts were frozen at."""
    assert node.stage is not None
    return SendJob(
        job_id=node.stage.job_id,
        kind="stage",
        node=node.name,
        rollout=rollout,
        attempt=node.stage.attempt,
        mode=frozen.mode,
        target=frozen.target,
        source_commit=start_commit,
        artifacts=frozen.artifacts,
        stage_timeout=_stage_timeout(frozen),
        signature=frozen.signature,
        signers=frozen.signers,
    )


def _stage_timeout(frozen: FrozenSpec) -> int | None:
    """The stage.timeout a stage job carries: none when it is the default,
    which an agent assumes, so a rollout that keeps it sends the payload
    agents of version 3 accept."""
    seconds = settings_of(frozen).timeout_seconds
    return None if seconds == DEFAULT_STAGE_TIMEOUT else seconds


def settings_of(frozen: FrozenSpec) -> Stage:
    """The rollout's ``stage`` settings (the defaults when none was frozen)."""
    return frozen.stage if frozen.stage is not None else Stage()


def deadline(frozen: FrozenSpec, stage: StageRecord) -> datetime:
    return stage.started_at + timedelta(seconds=settings_of(frozen).timeout_seconds)


def observe(
    staging: Iterable[tuple[int, NodeRecord]],
    frozen: FrozenSpec,
    seen: Seen,
    in_fleet: Callable[[str], bool],
) -> list[NodeChange]:
    """The outcome of each staging node's stage job, when one is known."""
    changes: list[NodeChange] = []
    for i, node in staging:
        judged = judge(node, frozen, seen, in_fleet(node.name))
        if judged is None:
            continue
        state, error = judged
        assert node.stage is not None
        stage = StageRecord(
            node.stage.job_id,
            node.stage.attempt,
            state,
            node.stage.started_at,
            seen.now,
            error,
            vouched(seen.observations.jobs.get(node.stage.job_id), frozen, state),
        )
        new = evolve(node, state=state, error=error, stage=stage)
        changes.append(NodeChange(i, new, error or "staged"))
    return changes


def vouched(job: JobObservation | None, frozen: FrozenSpec, state: str) -> Vouched | None:
    """Who vouched for a staged node's files: the signer its answer names,
    for the signature frozen at start (None for an unsigned target)."""
    if state != "staged" or job is None or job.signature is None or frozen.signature is None:
        return None
    if job.signature.get("sha256") != frozen.signature.sha256:
        return None
    return Vouched(job.signature["signer"], frozen.signature.sha256)


def judge(
    node: NodeRecord, frozen: FrozenSpec, seen: Seen, in_fleet: bool
) -> tuple[str, str] | None:
    """(staged | failed | unknown, error) of a staging node, or None while
    it waits. The agent's answer decides; a node gone from nodes/ or
    unreachable for ``offlineAfter`` is unknown; past ``stage.timeout`` it failed."""
    stage = node.stage
    assert stage is not None
    obs, now = seen.observations, seen.now
    job = obs.jobs.get(stage.job_id)
    if job is not None and job.state == "succeeded":
        if frozen.signature is not None and vouched(job, frozen, "staged") is None:
            return "failed", (
                f"{STAGE_FAILED}: signature_invalid: the node's answer does not say which "
                "signer verified the signature; upgrade its agent"
            )
        return "staged", ""
    if job is not None and job.state in ("failed", "refused"):
        what = STAGE_FAILED if job.state == "failed" else f"{STAGE_FAILED}, refused"
        return "failed", f"{what}: {job.error}" if job.error else what
    if not in_fleet:
        return "unknown", "node removed from nodes/"
    since = obs.unreachable_since.get(node.name)
    if since is not None and now - max(since, stage.started_at) >= seen.offline_after:
        lasted = format_duration(seen.offline_after_seconds)
        if job is not None and job.error.startswith(NO_EVIDENCE):
            return "unknown", f"{job.error} (for {lasted} or more)"
        return "unknown", f"agent unreachable for {lasted} or more"
    if now >= deadline(frozen, stage):
        state = "no answer" if job is None else f"job still {job.state}"
        limit = format_duration(settings_of(frozen).timeout_seconds)
        return "failed", f"{STAGE_FAILED}: stage_timeout: not staged within {limit} ({state})"
    return None
