"""Explicit rollback (DESIGN.md section 5, ``rollbackRequest``): which nodes
a request restores, refuses or skips, and why, applied to one rollout's step.
The restore jobs themselves are sent by the step (``send_restore``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from reconciler.engine.evidence import JOB_FAILED, JOB_REFUSED
from reconciler.engine.holds import RESTORE_STATES, name_list
from reconciler.spec.rollout_status import NodeRecord, RollbackNode, RollbackRecord

if TYPE_CHECKING:
    from reconciler.engine.step import RolloutStep


def refuse_request(step: RolloutStep, message: str) -> None:
    """Record the rollout's rollbackRequest as refused, once, with why."""
    spec = step.inp.spec
    assert spec is not None and spec.rollback_request is not None
    request = spec.rollback_request
    if any(r.id == request.id for r in step.rollbacks):
        return
    record = RollbackRecord(
        id=request.id,
        requested_by=step.inp.author,
        time=step.now,
        state="refused",
        message=message,
    )
    step.rollbacks = (*step.rollbacks, record)
    step.set_condition("rollback_refused", f"rollbackRequest {request.id!r} refused: {message}")
    step.spec_commit = step.inp.spec_commit


def handle_request(step: RolloutStep) -> None:
    spec = step.inp.spec
    if spec is None:
        return
    request = spec.rollback_request
    withdraw_waiting(step, request.id if request is not None else None)
    if request is None:
        return
    previous = next((r for r in step.rollbacks if r.id == request.id), None)
    if previous is not None and previous.state != "waiting":
        return  # handled: the same id restores once
    assert step.frozen is not None
    if not step.frozen.live:
        refuse_request(step, "a dry-run rollout changed nothing, so there is nothing to roll back")
        return
    if step.phase == "running" and previous is None:
        # A request accepted while held and waiting for backup lists stays
        # accepted: nothing is dispatched while it waits.
        refuse_request(
            step,
            "the rollout is running and not held; pause it first (paused: true), "
            "or wait for a hold",
        )
        return
    if request.nodes is None:
        wanted = [n.name for n in step.nodes]
    else:
        wanted = list(dict.fromkeys(request.nodes))
    plan: list[tuple[str, str, str]] = []  # (name, outcome, message)
    waiting: list[str] = []
    changed_by = changed_since(step)
    for name in wanted:
        i = step.index(name)
        if i is None:
            plan.append((name, "refused", "not a node of this rollout"))
            continue
        node = step.nodes[i]
        if node.attempt == 0:
            plan.append((name, "skipped", "never sent: this rollout did not change it"))
            continue
        if node.state == "dispatched" or node.state in RESTORE_STATES:
            plan.append((name, "refused", "a job is in flight on it; retry when it finished"))
            continue
        if name in changed_by:
            plan.append((name, "refused", f"changed since by rollout {changed_by[name]}"))
            continue
        if never_applied(node):
            # Its backup holds what the agent already put back; restoring
            # it would rerun the after-apply command for nothing.
            plan.append((name, "skipped", "never changed: its only apply failed"))
            continue
        node = step.resolve_first_backup(i)
        if not node.first_backup_known:
            waiting.append(name)
            plan.append((name, "waiting", ""))
            continue
        if node.first_backup_id is not None:
            plan.append((name, "restoring", ""))
        elif node.first_apply_attempt is not None or node.state == "succeeded":
            # A later attempt's backup holds bytes from within this
            # rollout: putting them back is no rollback (DESIGN.md 5).
            which = f" (attempt {node.first_apply_attempt})" if node.first_apply_attempt else ""
            plan.append(
                (
                    name,
                    "unavailable",
                    f"its first apply{which} left no backup: the node had no config "
                    "before this rollout, or already had its target",
                )
            )
        else:
            plan.append((name, "skipped", "never changed: its apply did not succeed"))
    if waiting:
        message = (
            f"waiting for the backup lists of {name_list(waiting)} to find their first "
            "backups; the restores are sent once they are read"
        )
        if previous is not None and previous.message == message:
            return
        record = RollbackRecord(
            request.id,
            previous.requested_by if previous is not None else step.inp.author,
            previous.time if previous is not None else step.now,
            "waiting",
            message,
        )
        step.rollbacks = (*(r for r in step.rollbacks if r.id != request.id), record)
        step.spec_commit = step.inp.spec_commit
        return
    nodes: list[RollbackNode] = []
    for name, outcome, message in plan:
        if outcome == "restoring":
            i = step.index(name)
            assert i is not None
            step.send_restore(i, request.id, "restoring")
        nodes.append(RollbackNode(name, outcome, message))
    refused = [n.name for n in nodes if n.outcome == "refused"]
    step.set_condition(
        "rollback_refused",
        None
        if not refused
        else f"rollbackRequest {request.id!r} refused for {name_list(refused)}: "
        + "; ".join(f"{n.name}: {n.message}" for n in nodes if n.outcome == "refused")[:500],
    )
    state = "restoring" if any(n.outcome == "restoring" for n in nodes) else "done"
    record = RollbackRecord(
        request.id,
        # who asked is settled when the request is first seen
        previous.requested_by if previous is not None else step.inp.author,
        previous.time if previous is not None else step.now,
        state,
        rollback_summary(nodes),
        tuple(nodes),
    )
    step.rollbacks = (*(r for r in step.rollbacks if r.id != request.id), record)
    step.spec_commit = step.inp.spec_commit


def withdraw_waiting(step: RolloutStep, current: str | None) -> None:
    """A request waiting for backup lists that the file no longer carries
    (removed, or replaced by a new id) has sent nothing: it ends refused,
    so it stops holding back dispatches and resumes."""
    if not any(r.state == "waiting" and r.id != current for r in step.rollbacks):
        return
    why = f"replaced by {current!r}" if current is not None else "removed from the file"
    step.rollbacks = tuple(
        replace(r, state="refused", message=f"{why} before its restores were sent")
        if r.state == "waiting" and r.id != current
        else r
        for r in step.rollbacks
    )


def changed_since(step: RolloutStep) -> dict[str, str]:
    """Nodes of this rollout that a later-started or running rollout has
    sent a job to, with that rollout's name."""
    mine = {n.name for n in step.nodes}
    started = step.started_at
    found: dict[str, str] = {}
    for name, other in step.ctx.current.items():
        if name == step.inp.name or not other.started or other.started_at is None:
            continue
        later = started is None or other.started_at > started
        if not (later or other.phase in ("running", "paused")):
            continue
        for node in other.nodes:
            if node.attempt > 0 and node.name in mine:
                found.setdefault(node.name, name)
    return found


def update_outcome(step: RolloutStep, request: str, node: str, outcome: str, error: str) -> None:
    """A restore of rollback ``request`` on ``node`` ended with ``outcome``."""
    records = list(step.rollbacks)
    for k, record in enumerate(records):
        if record.id != request:
            continue
        nodes = tuple(
            RollbackNode(n.name, outcome, error) if n.name == node else n for n in record.nodes
        )
        state = "restoring" if any(n.outcome == "restoring" for n in nodes) else "done"
        records[k] = replace(
            record, nodes=nodes, state=state, message=rollback_summary(list(nodes))
        )
    step.rollbacks = tuple(records)


def never_applied(node: NodeRecord) -> bool:
    """The node's one apply attempt was failed or refused by its agent, so
    this rollout never changed its config (a later attempt might have)."""
    return (
        node.attempt == 1
        and node.verdict == "failed"
        and node.error.startswith((JOB_FAILED, JOB_REFUSED))
    )


def rollback_summary(nodes: Sequence[RollbackNode]) -> str:
    counts: dict[str, int] = {}
    for n in nodes:
        counts[n.outcome] = counts.get(n.outcome, 0) + 1
    return ", ".join(f"{c} {o}" for o, c in counts.items()) or "no nodes"


def restore_waiting(node: NodeRecord) -> bool:
    """The policy decided a restore that waits for the agent's backup list."""
    return node.held == "rollback_pending" and node.state not in RESTORE_STATES
