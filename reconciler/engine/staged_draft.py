"""The staging part of one rollout's step (docs/rollouts.md): stage jobs,
their outcomes and the decisions on them, recorded in the status draft.
The rules are ``reconciler.engine.staging``'s; these functions apply them
to the draft, and the step calls them at fixed points. For a rollout
without artifacts every function here does nothing, so such a rollout
steps exactly as before.

Each takes the draft, and as arguments everything else it reads. Pure,
like the rest of the engine: the fleet comes in as a lookup, time as the
draft's ``now``.
"""

from __future__ import annotations

from collections.abc import Callable

from reconciler.engine import attempts, batches, budget, staging
from reconciler.engine.draft import StatusDraft
from reconciler.engine.evidence import Seen
from reconciler.engine.inputs import NodeChange
from reconciler.engine.records import evolve
from reconciler.spec.model import Node, RolloutSpec
from reconciler.spec.rollout_status import ALERT_WAITING_REASONS, Waiting

NodeOf = Callable[[str], Node | None]
Dispatch = Callable[[int, str], None]


def staged_rollout(draft: StatusDraft) -> bool:
    return draft.frozen is not None and bool(draft.frozen.artifacts)


def observe_stages(draft: StatusDraft, seen: Callable[[], Seen], node_of: NodeOf) -> None:
    """Record the outcome of every stage job in flight."""
    if not staged_rollout(draft):
        return
    busy = [(i, draft.nodes[i]) for i in draft.open_indexes() if draft.nodes[i].state == "staging"]
    if not busy:
        return
    assert draft.frozen is not None
    changes = staging.observe(busy, draft.frozen, seen(), lambda n: node_of(n) is not None)
    draft.apply(changes)
    draft.apply(budget.past_budget(draft.frozen, draft.nodes, changes))


def decide_stages(draft: StatusDraft, policy: str, node_of: NodeOf) -> bool:
    """The stage table on each stage failure not yet decided."""
    if not staged_rollout(draft):
        return False
    progressed = False
    for i in list(draft.open_indexes()):
        node = draft.nodes[i]
        verdict = staging.stage_failure(node)
        if verdict is None or node.held is not None:
            continue
        decision = staging.decide(policy, verdict, auto_retried=node.auto_retried)
        if decision.action == "restage":
            start_stage(draft, i, "automatic retry (retry_once)", node_of, auto_retry=True)
        elif decision.action == "hold":
            draft.set_node(i, evolve(node, held=decision.hold), decision.hold or "hold")
        else:
            continue  # observe: recorded, and the batch goes on without it
        progressed = True
    return progressed


def stage_ahead(
    draft: StatusDraft, spec: RolloutSpec, node_of: NodeOf, alert_wait: Waiting | None = None
) -> bool:
    """Start stage jobs down the pipeline, unless the rollout is held or
    ``alert_wait`` stands (a fleet-wide alert fires, or Alertmanager
    cannot be asked: as for a new batch, recorded as the wait)."""
    if not staged_rollout(draft) or draft.restores_in_flight() or draft.any_held():
        return False
    if not alerts_let_stages_start(draft, alert_wait):
        return False
    if batches.paused_after(draft.batches, spec.pause_after) is not None:
        return False
    assert draft.frozen is not None
    order = [i for b in staging.window(draft.frozen, draft.batches) for i in draft.batch_range(b)]
    limit = staging.most_staging(draft.nodes, staging.settings_of(draft.frozen))
    picked = staging.to_start(draft.nodes, order, limit)
    for i in picked:
        start_stage(draft, i, f"staging batch {draft.nodes[i].batch}", node_of)
    return bool(picked)


def alerts_let_stages_start(draft: StatusDraft, alert_wait: Waiting | None) -> bool:
    if alert_wait is not None:
        # An unchanged wait keeps its value, so an idle pass writes nothing.
        draft.waiting = draft.waiting if alert_wait == draft.waiting else alert_wait
        return False
    if draft.waiting is not None and draft.waiting.reason in ALERT_WAITING_REASONS:
        draft.waiting = None  # resolved; a due batch's gate records its own wait
    return True


def start_stage(
    draft: StatusDraft, i: int, reason: str, node_of: NodeOf, auto_retry: bool = False
) -> None:
    """Send the node's next stage job, or record why the daemon cannot."""
    node = draft.nodes[i]
    assert draft.frozen is not None and draft.start_commit is not None
    fleet_node = node_of(node.name)
    if fleet_node is None or attempts.dispatch_refusal(
        fleet_node, draft.frozen.include_maintenance
    ):
        # As for an apply: never sent ends unknown, else held dispatch_refused.
        new, _ = attempts.next_apply(
            node,
            fleet_node,
            include_maintenance=draft.frozen.include_maintenance,
            rollout=draft.name,
            start_commit=draft.start_commit,
            source_commit=draft.start_commit,
            now=draft.now,
            deadline=draft.now,
        )
        draft.set_node(i, new, new.error)
        ended = (NodeChange(i, new, new.error),)
        draft.apply(budget.past_budget(draft.frozen, draft.nodes, ended))
        return
    new = staging.next_stage(
        node,
        rollout=draft.name,
        start_commit=draft.start_commit,
        now=draft.now,
        auto_retry=auto_retry,
    )
    draft.set_node(i, new, reason)
    draft.effects.append(staging.stage_job(draft.name, draft.frozen, draft.start_commit, new))


def ask_again(draft: StatusDraft, i: int, reason: str, dispatch: Dispatch, node_of: NodeOf) -> None:
    """A resume's new attempt: staged first when the node is not staged."""
    if staging.needs_stage(draft.frozen, draft.nodes[i]):
        start_stage(draft, i, reason, node_of)
    else:
        dispatch(i, reason)


def batch_ready(draft: StatusDraft, batch: int, policy: str) -> bool:
    """Whether ``batch`` may be dispatched: always, without artifacts."""
    if not staged_rollout(draft) or batch > len(draft.batches):
        return True
    return staging.batch_ready((draft.nodes[i] for i in draft.batch_range(batch)), policy)


def dispatch_staged(draft: StatusDraft, dispatch: Dispatch, reason: str = "staged") -> bool:
    """Dispatch every staged node of a running batch that is not held."""
    if not staged_rollout(draft):
        return False
    ready = [
        i
        for b in draft.batches
        if b.state == "running"
        for i in draft.batch_range(b.index)
        if draft.nodes[i].state == "staged" and draft.nodes[i].held is None
    ]
    for i in ready:
        dispatch(i, reason)
    return bool(ready)
