"""Operator intents on a started rollout (docs/rollouts.md): ``skipNodes``
and ``resumeRequest``. Values in, changes out: the step records the node
changes these return and dispatches the nodes they name. What a resume
does with each held node is the table ``holds.RESUME_OF_HELD``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reconciler.engine.holds import (
    RESTORE_STATES,
    RESUME_OF_HELD,
    RESUME_OF_REASON,
    SKIP,
    name_list,
    quoted,
    restore_waiting,
)
from reconciler.engine.inputs import NodeChange
from reconciler.engine.records import evolve
from reconciler.spec.model import RolloutSpec
from reconciler.spec.rollout_status import NodeRecord

# Done, or with a job in flight (a stage job included).
_NOT_SKIPPED = frozenset({"succeeded", "skipped", "dispatched", "staging"})


def skips(
    spec: RolloutSpec, nodes: Sequence[NodeRecord], index: Callable[[str], int | None]
) -> list[NodeChange]:
    """``skipNodes``: each listed node that has not succeeded and has no job
    in flight becomes ``skipped`` (final; never dispatched again)."""
    changes: list[NodeChange] = []
    for name in spec.skip_nodes:
        i = index(name)
        if i is None:
            continue
        node = nodes[i]
        if node.state in _NOT_SKIPPED or node.state in RESTORE_STATES:
            continue
        changes.append(NodeChange(i, evolve(node, state="skipped", held=None), "skipNodes"))
    return changes


@dataclass(frozen=True)
class HeldAnswer:
    """What a resume does with one held node: ``action`` is a value of
    ``holds.RESUME_OF_HELD``."""

    index: int
    action: str
    reason: str


@dataclass(frozen=True)
class ResumeAnswer:
    """A new resumeRequest's answer to the current hold."""

    refusal: str | None  # the resume_refused condition; None: accepted
    held: tuple[HeldAnswer, ...] = ()  # each held node, in frozen order
    next_batch: int | None = None  # no node held and a pauseAfter holds: start this batch
    reason: str = ""  # why the next batch starts


def answer_resume(
    token: str,
    open_nodes: Sequence[tuple[int, NodeRecord]],
    waiting_requests: Sequence[str],
    gone: Callable[[str], bool],
    paused_after: int | None,
) -> ResumeAnswer:
    """The answer of resume ``token``: refused while a restore runs or
    waits (``open_nodes``: index and record of every node that may be held
    or in flight; ``waiting_requests``: rollback request ids waiting for
    backup lists); else each held node as ``RESUME_OF_HELD`` says (a node
    ``gone``, removed or in maintenance, is skipped), or by its hold's
    reason as ``RESUME_OF_REASON`` says; or the batch after the pauseAfter
    batch ``paused_after``."""
    restoring = [
        node.name for _, node in open_nodes if node.state in RESTORE_STATES or restore_waiting(node)
    ]
    if restoring:
        return ResumeAnswer(
            f"resumeRequest {quoted(token)} refused: a restore is in progress on "
            f"{name_list(restoring)}; wait for it to finish, then resume again, or abort"
        )
    if waiting_requests:
        return ResumeAnswer(
            f"resumeRequest {quoted(token)} refused: rollbackRequest "
            f"{quoted(waiting_requests[0])} waits for the agents' backup lists to send its "
            "restores; wait for it, then resume again, or abort"
        )
    held = [(i, node) for i, node in open_nodes if node.held is not None]
    if held:
        answers = []
        for i, node in held:
            assert node.held is not None
            away = node.held not in RESUME_OF_REASON and gone(node.name)
            action = RESUME_OF_REASON.get(node.held) or (
                SKIP if away else RESUME_OF_HELD[node.state]
            )
            if action == SKIP:
                why = "resume: removed or in maintenance" if away else "resume"
            else:
                why = f"resume {quoted(token)}"
            answers.append(HeldAnswer(i, action, why))
        return ResumeAnswer(None, held=tuple(answers))
    if paused_after is not None:
        return ResumeAnswer(
            None,
            next_batch=paused_after + 1,
            reason=f"resume {quoted(token)} after batch {paused_after}",
        )
    return ResumeAnswer(None)  # recorded; nothing was held
