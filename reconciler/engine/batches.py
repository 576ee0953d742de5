"""Where a started rollout stands in its batches (docs/rollouts.md): the
batch that started last, the batch a ``pauseAfter`` holds after, and
which nodes no longer keep their batch open. Pure functions of the
recorded batches and node records; the step applies them."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from reconciler.engine.holds import RESTORE_STATES, VERDICT_STATES, restore_waiting
from reconciler.spec.rollout_status import BatchRecord, NodeRecord

# Node states that let a running batch be done, whatever the policy; a
# verdict lets it be done only under observe (which records and goes on).
SETTLED_STATES = frozenset({"succeeded", "skipped", "rolled_back", "rollback_failed"})


def node_settled(node: NodeRecord, *, ended: bool, policy: str) -> bool:
    """Whether ``node`` lets its batch be done. In an ``ended`` rollout a
    node is done once nothing is in flight or decided for it; while it
    runs, a held node keeps its batch open."""
    if ended:
        return (
            node.state != "dispatched"
            and node.state not in RESTORE_STATES
            and not restore_waiting(node)
        )
    if node.held is not None:
        return False
    if node.state in SETTLED_STATES:
        return True
    return node.state in VERDICT_STATES and policy == "observe"


def last_started(batches: Sequence[BatchRecord]) -> int | None:
    """The last batch that is not pending (batches start in order)."""
    last = None
    for b in batches:
        if b.state == "pending":
            break
        last = b.index
    return last


def paused_after(batches: Sequence[BatchRecord], pause_after: Collection[int]) -> int | None:
    """The batch after which ``pauseAfter`` holds now: the last started, if
    it is done, listed, and not the last batch."""
    done = last_started(batches)
    if done is None or done >= len(batches):
        return None
    if batches[done - 1].state != "done" or done not in pause_after:
        return None
    return done
