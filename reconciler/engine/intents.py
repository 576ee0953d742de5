"""Operator intents on a started rollout (docs/rollouts.md): ``skipNodes``
and ``resumeRequest``, applied to one rollout's step. What a resume does
with each held node is the table ``holds.RESUME_OF_HELD``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.engine.holds import (
    ASK_AGAIN,
    RESTORE_STATES,
    RESUME_OF_HELD,
    SKIP,
    name_list,
    quoted,
)
from reconciler.engine.records import evolve
from reconciler.engine.rollback import restore_waiting
from reconciler.spec.model import RolloutSpec

if TYPE_CHECKING:
    from reconciler.engine.step import RolloutStep


def skip_nodes(step: RolloutStep, spec: RolloutSpec) -> None:
    """``skipNodes``: each listed node that has not succeeded and has no job
    in flight becomes ``skipped`` (final; never dispatched again)."""
    for name in spec.skip_nodes:
        i = step.index(name)
        if i is None:
            continue
        node = step.nodes[i]
        if node.state in ("succeeded", "skipped", "dispatched") or node.state in RESTORE_STATES:
            continue
        step.set_node(i, evolve(node, state="skipped", held=None), "skipNodes")


def handle_resume(step: RolloutStep, spec: RolloutSpec) -> bool:
    """A new ``resumeRequest`` answers the current hold once: refused while a
    restore runs or waits; else each held node as ``RESUME_OF_HELD`` says,
    or the batch after a pauseAfter. True when it was handled."""
    token = spec.resume_request
    if not token or token == step.last_handled_resume:
        return False
    if step.pause_after_waiting(spec) is not None and not step.any_held() and not step.gate_open():
        return (
            False  # it would start a batch: it waits, unhandled, for the window (docs/rollouts.md)
        )
    step.last_handled_resume = token
    open_nodes = list(step.open_indexes())
    restoring = [
        step.nodes[i].name
        for i in open_nodes
        if step.nodes[i].state in RESTORE_STATES or restore_waiting(step.nodes[i])
    ]
    asked = [r.id for r in step.rollbacks if r.state == "waiting"]
    if restoring:
        step.set_condition(
            "resume_refused",
            f"resumeRequest {quoted(token)} refused: a restore is in progress on "
            f"{name_list(restoring)}; wait for it to finish, then resume again, or abort",
        )
        return True
    if asked:
        step.set_condition(
            "resume_refused",
            f"resumeRequest {quoted(token)} refused: rollbackRequest {quoted(asked[0])} waits for "
            "the agents' backup lists to send its restores; wait for it, then resume "
            "again, or abort",
        )
        return True
    step.set_condition("resume_refused", None)
    held = [i for i in open_nodes if step.nodes[i].held is not None]
    if held:
        for i in held:
            node = step.nodes[i]
            fleet_node = step.ctx.node(node.name)
            gone = fleet_node is None or (
                fleet_node.maintenance
                and step.frozen is not None
                and not step.frozen.include_maintenance
            )
            action = SKIP if gone else RESUME_OF_HELD[node.state]
            if action == SKIP:
                why = "resume: removed or in maintenance" if gone else "resume"
                step.set_node(i, evolve(node, state="skipped", held=None), why)
            elif action == ASK_AGAIN:
                step.dispatch(i, f"resume {quoted(token)}")
        return True
    waiting = step.pause_after_waiting(spec)
    if waiting is not None:
        step.dispatch_batch(waiting + 1, f"resume {quoted(token)} after batch {waiting}")
        return True
    return True  # recorded; nothing was held
