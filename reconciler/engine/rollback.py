"""Explicit rollback (docs/rollouts.md, ``rollbackRequest``): which nodes
a request restores, refuses or skips, and why, applied to one rollout's step.
The restore jobs themselves are sent by the step (``send_restore``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from reconciler.engine.evidence import JOB_FAILED, JOB_REFUSED
from reconciler.engine.holds import RESTORE_STATES, name_list, quoted
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
    step.set_condition(
        "rollback_refused", f"rollbackRequest {quoted(request.id)} refused: {message}"
    )
    step.spec_commit = step.inp.spec_commit


def handle_request(step: RolloutStep) -> None:
    """Handle the rollout's ``rollbackRequest``, once per id: refuse it as a
    whole (``request_refusal``); or plan each node (``node_outcome``) and
    either wait for backup lists (``wait_for_backups``) or send the restores
    and record the outcome (``start_restores``)."""
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
    refusal = request_refusal(step.frozen.live, step.phase, accepted=previous is not None)
    if refusal:
        refuse_request(step, refusal)
        return
    wanted = (
        [n.name for n in step.nodes]
        if request.nodes is None
        else list(dict.fromkeys(request.nodes))
    )
    plan: list[tuple[str, str, str]] = []  # (name, outcome, message)
    changed_by = changed_since(step)
    for name in wanted:
        i = step.index(name)
        node = step.nodes[i] if i is not None else None
        decided = node_outcome(node, changed_by.get(name))
        if decided is None:
            assert i is not None
            decided = backup_outcome(step.resolve_first_backup(i))
        plan.append((name, *decided))
    waiting = [name for name, outcome, _ in plan if outcome == "waiting"]
    if waiting:
        wait_for_backups(step, request.id, previous, waiting)
    else:
        start_restores(step, request.id, previous, plan)


def request_refusal(live: bool, phase: str, *, accepted: bool) -> str:
    """Why a rollbackRequest is refused as a whole, or "" (docs/rollouts.md)."""
    if not live:
        return "a dry-run rollout changed nothing, so there is nothing to roll back"
    if phase == "running" and not accepted:
        # A request accepted while held and waiting for backup lists stays
        # accepted: nothing is dispatched while it waits.
        return (
            "the rollout is running and not held; pause it first (paused: true), or wait for a hold"
        )
    return ""


def node_outcome(node: NodeRecord | None, changed_by: str | None) -> tuple[str, str] | None:
    """(outcome, message) for one requested node decided without its
    backups, or None when its first backup decides (``backup_outcome``).
    The rules in order; the first that applies decides."""
    if node is None:
        return "refused", "not a node of this rollout"
    if node.attempt == 0:
        return "skipped", "never sent: this rollout did not change it"
    if node.state == "dispatched" or node.state in RESTORE_STATES:
        return "refused", "a job is in flight on it; retry when it finished"
    if changed_by is not None:
        return "refused", f"changed since by rollout {changed_by}"
    if never_applied(node):
        # Its backup holds what the agent already put back; restoring
        # it would rerun the after-apply command for nothing.
        return "skipped", "never changed: its only apply failed"
    return None


def backup_outcome(node: NodeRecord) -> tuple[str, str]:
    """(outcome, message) for a requested node from its first backup:
    ``waiting`` while the backup list has not been read."""
    if not node.first_backup_known:
        return "waiting", ""
    if node.first_backup_id is not None:
        return "restoring", ""
    if node.first_apply_attempt is not None or node.state == "succeeded":
        # A later attempt's backup holds bytes from within this
        # rollout: putting them back is no rollback (docs/rollouts.md).
        which = f" (attempt {node.first_apply_attempt})" if node.first_apply_attempt else ""
        return (
            "unavailable",
            f"its first apply{which} left no backup: the node had no config "
            "before this rollout, or already had its target",
        )
    return "skipped", "never changed: its apply did not succeed"


def wait_for_backups(
    step: RolloutStep, request: str, previous: RollbackRecord | None, waiting: list[str]
) -> None:
    """Accept the request as ``waiting`` until the agents' backup lists of
    ``waiting`` are read; nothing is sent yet."""
    message = (
        f"waiting for the backup lists of {name_list(waiting)} to find their first "
        "backups; the restores are sent once they are read"
    )
    if previous is not None and previous.message == message:
        return
    record = RollbackRecord(
        request,
        previous.requested_by if previous is not None else step.inp.author,
        previous.time if previous is not None else step.now,
        "waiting",
        message,
    )
    step.rollbacks = (*(r for r in step.rollbacks if r.id != request), record)
    step.spec_commit = step.inp.spec_commit


def start_restores(
    step: RolloutStep,
    request: str,
    previous: RollbackRecord | None,
    plan: list[tuple[str, str, str]],
) -> None:
    """Send the restores the plan decided and record every node's outcome;
    refusals also go into the ``rollback_refused`` condition."""
    nodes: list[RollbackNode] = []
    for name, outcome, message in plan:
        if outcome == "restoring":
            i = step.index(name)
            assert i is not None
            step.send_restore(i, request, "restoring")
        nodes.append(RollbackNode(name, outcome, message))
    refused = [n.name for n in nodes if n.outcome == "refused"]
    step.set_condition(
        "rollback_refused",
        None
        if not refused
        else f"rollbackRequest {quoted(request)} refused for {name_list(refused)}: "
        + "; ".join(f"{n.name}: {n.message}" for n in nodes if n.outcome == "refused")[:500],
    )
    state = "restoring" if any(n.outcome == "restoring" for n in nodes) else "done"
    record = RollbackRecord(
        request,
        # who asked is settled when the request is first seen
        previous.requested_by if previous is not None else step.inp.author,
        previous.time if previous is not None else step.now,
        state,
        rollback_summary(nodes),
        tuple(nodes),
    )
    step.rollbacks = (*(r for r in step.rollbacks if r.id != request), record)
    step.spec_commit = step.inp.spec_commit


def withdraw_waiting(step: RolloutStep, current: str | None) -> None:
    """A request waiting for backup lists that the file no longer carries
    (removed, or replaced by a new id) has sent nothing: it ends refused,
    so it stops holding back dispatches and resumes."""
    if not any(r.state == "waiting" and r.id != current for r in step.rollbacks):
        return
    why = f"replaced by {quoted(current)}" if current is not None else "removed from the file"
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
