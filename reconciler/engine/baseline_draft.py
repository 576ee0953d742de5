"""The eval-baseline part of one rollout's step (docs/evals.md): baseline
eval jobs sent, their answers recorded in the status draft, the rollout
held when one fails, and a failed one sent again on a resume. The rules
are ``reconciler.engine.baselines``'s; these functions apply them to the
draft, and the step calls them at fixed points. For a rollout without
``matchesBaseline`` cases every function here does nothing, so such a
rollout steps exactly as before.

Each takes the draft, and as arguments everything else it reads. Pure,
like the rest of the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from reconciler.engine import attempts, baselines
from reconciler.engine.draft import StatusDraft
from reconciler.protocol.observations import Observations
from reconciler.spec.baseline_records import Answers, BaselineJob, first_nodes
from reconciler.spec.model import Node
from reconciler.spec.rollout_status import NodeRecord

NodeOf = Callable[[str], Node | None]


def baseline_gate(draft: StatusDraft) -> str:
    return baselines.gate(draft.frozen, draft.eval_baseline)


def baseline_ready(draft: StatusDraft) -> bool:
    """Whether the first batch may go as far as the baseline is concerned."""
    return baseline_gate(draft) == "go"


def baseline_failed(draft: StatusDraft) -> bool:
    return baseline_gate(draft) == "hold"


def baseline_answers(draft: StatusDraft) -> Answers:
    return baselines.answers_for_applies(draft.eval_baseline)


def send_baseline(draft: StatusDraft, node_of: NodeOf) -> bool:
    """Send the eval jobs, once, when the rollout needs a baseline."""
    if baseline_gate(draft) != "send":
        return False
    assert draft.frozen is not None
    chosen = baselines.choose(draft.frozen.evals, draft.nodes)
    jobs = tuple(_send(draft, node, names, 1, node_of) for node, names in chosen.items())
    draft.eval_baseline = jobs
    return bool(jobs)


def resume_baseline(draft: StatusDraft, node_of: NodeOf) -> bool:
    """A resume's answer to ``eval_baseline_failed``: each failed
    baseline job sent again as a new attempt."""
    if not baseline_failed(draft):
        return False
    draft.eval_baseline = tuple(
        _send(draft, job.node, job.evals, job.attempt + 1, node_of)
        if job.state == "failed"
        else job
        for job in draft.eval_baseline
    )
    return True


def _send(
    draft: StatusDraft, node: str, names: tuple[str, ...], attempt: int, node_of: NodeOf
) -> BaselineJob:
    """Record a baseline job for ``node`` and send it, or record at
    once why it cannot be sent."""
    assert draft.frozen is not None and draft.start_commit is not None
    assert draft.health_timeout is not None
    job = baselines.new_job(
        node,
        names,
        attempt,
        rollout=draft.name,
        start_commit=draft.start_commit,
        now=draft.now,
        frozen=draft.frozen,
        health_timeout=draft.health_timeout,
    )
    fleet_node = node_of(node)
    refusal = (
        "node is not in nodes/"
        if fleet_node is None
        else attempts.dispatch_refusal(fleet_node, draft.frozen.include_maintenance)
    )
    if refusal:
        job = replace(job, state="failed", finished_at=draft.now, error=refusal)
        return job
    draft.effects.append(baselines.eval_job(draft.name, draft.frozen, draft.start_commit, job))
    return job


def observe_baseline(draft: StatusDraft, obs: Observations, node_of: NodeOf) -> None:
    """Record the outcome of every baseline job in flight."""
    running = [j for j in draft.eval_baseline if j.state == "running"]
    if not running or draft.frozen is None or draft.health_timeout is None:
        return
    first_of = {name: job.node for name, job in first_nodes(draft.eval_baseline).items()}
    judged = []
    for job in draft.eval_baseline:
        new = job
        if job.state == "running":
            new = baselines.judge(
                job,
                draft.frozen,
                obs,
                draft.now,
                in_fleet=node_of(job.node) is not None,
                health_timeout=draft.health_timeout,
                first_of=first_of,
            )
        judged.append(new)
    draft.eval_baseline = tuple(judged)


def baseline_held(draft: StatusDraft) -> list[NodeRecord]:
    """The failed baseline nodes as held records, for the rollout's hold."""
    if not baseline_failed(draft):
        return []
    return [
        NodeRecord(name=j.node, batch=0, held=baselines.HOLD, error=j.error)
        for j in draft.eval_baseline
        if j.state == "failed"
    ]
