"""The failure budget of an observe rollout (docs/capacity.md): once more
nodes than ``failureBudget`` allows have ended ``failed``, ``timed_out``
or ``unknown``, each further node that ends so is held with
``failure_budget_exceeded``. A resume lets the held nodes carry on
(``holds.RESUME_OF_REASON``) and the count goes on, so the next failure
holds again. Decided when a node ends, from the node records; pure."""

from __future__ import annotations

from collections.abc import Sequence

from reconciler.engine.holds import VERDICT_STATES
from reconciler.engine.inputs import NodeChange
from reconciler.engine.records import evolve
from reconciler.spec.batch_shapes import budget_of
from reconciler.spec.rollout_status import FrozenSpec, NodeRecord

REASON = "failure_budget_exceeded"


def past_budget(
    frozen: FrozenSpec, nodes: Sequence[NodeRecord], ended: Sequence[NodeChange]
) -> list[NodeChange]:
    """Of ``ended`` (changes just recorded in ``nodes``, in order), those
    that end a node failed, timed out or unknown past the budget, each now
    held for it. [] without a budget."""
    if frozen.failure_budget is None:
        return []
    allowed = budget_of(frozen.failure_budget, len(nodes))
    failing = [c for c in ended if c.node.state in VERDICT_STATES and c.node.held is None]
    if not failing:
        return []
    counted = sum(1 for node in nodes if node.state in VERDICT_STATES)
    before = counted - len(failing)  # nodes that had ended so before these
    return [
        NodeChange(change.index, evolve(change.node, held=REASON), "failure budget exceeded")
        for k, change in enumerate(failing, start=1)
        if before + k > allowed
    ]


def counted(nodes: Sequence[NodeRecord]) -> list[str]:
    """The nodes the budget counts, in frozen order: the hold names them."""
    return [node.name for node in nodes if node.state in VERDICT_STATES]
