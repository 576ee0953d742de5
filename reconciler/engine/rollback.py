"""Explicit rollback (docs/rollouts.md, ``rollbackRequest``): which nodes
a request restores, refuses or skips, and why. Values in, a
``RollbackUpdate`` out: ``reconciler.engine.restores`` records it and sends
the restores it names; nothing here changes a status."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from reconciler.engine.backups import first_backup_listed
from reconciler.engine.evidence import JOB_FAILED, JOB_REFUSED
from reconciler.engine.holds import RESTORE_STATES, name_list, quoted
from reconciler.engine.inputs import NodeChange
from reconciler.protocol.observations import Backup
from reconciler.spec.model import RollbackRequest
from reconciler.spec.rollout_status import (
    NodeRecord,
    RollbackNode,
    RollbackRecord,
    RolloutStatus,
)


@dataclass(frozen=True)
class RollbackUpdate:
    """What handling a rollbackRequest changes in the rollout's status."""

    rollbacks: tuple[RollbackRecord, ...]  # the rollout's rollback records after it
    refused: str | None = None  # the rollback_refused condition (with ``sets_condition``)
    sets_condition: bool = False
    found: tuple[NodeChange, ...] = ()  # first backups found in the agents' backup lists
    restores: tuple[int, ...] = ()  # indexes of the nodes to send this request's restore
    request: str = ""  # the request's id
    handled: bool = True  # the request's spec commit is recorded (False: only a withdrawal)


@dataclass(frozen=True)
class Rollout:
    """The parts of a started rollout's step that a rollbackRequest reads."""

    name: str
    author: str  # who committed the request
    now: datetime
    live: bool
    phase: str
    started_at: datetime | None
    start_commit: str
    nodes: Sequence[NodeRecord]
    rollbacks: tuple[RollbackRecord, ...]
    index: Callable[[str], int | None]
    # every rollout's status as it stands; called only when a request needs it
    others: Callable[[], Mapping[str, RolloutStatus]]
    backups: Mapping[str, tuple[Backup, ...]]  # the agents' backup lists read this pass


def refusal(
    request: RollbackRequest,
    author: str,
    now: datetime,
    rollbacks: tuple[RollbackRecord, ...],
    message: str,
) -> RollbackUpdate | None:
    """The request recorded as refused, once, with why (None: it was recorded already)."""
    if any(r.id == request.id for r in rollbacks):
        return None
    record = RollbackRecord(
        id=request.id, requested_by=author, time=now, state="refused", message=message
    )
    return RollbackUpdate(
        (*rollbacks, record),
        refused=f"rollbackRequest {quoted(request.id)} refused: {message}",
        sets_condition=True,
        request=request.id,
    )


def handle_request(request: RollbackRequest | None, rollout: Rollout) -> RollbackUpdate | None:
    """The rollout's ``rollbackRequest``, once per id: refused as a whole
    (``request_refusal``); or each node planned (``node_outcome``) and
    either waiting for backup lists (``wait_for_backups``) or its restores
    sent and the outcome recorded (``start_restores``). None: nothing changes."""
    rollbacks = withdraw_waiting(rollout.rollbacks, request.id if request is not None else None)
    withdrawn = None if rollbacks is rollout.rollbacks else RollbackUpdate(rollbacks, handled=False)
    if request is None:
        return withdrawn
    previous = next((r for r in rollbacks if r.id == request.id), None)
    if previous is not None and previous.state != "waiting":
        return withdrawn  # handled: the same id restores once
    why = request_refusal(rollout.live, rollout.phase, accepted=previous is not None)
    if why:
        return refusal(request, rollout.author, rollout.now, rollbacks, why) or withdrawn
    wanted = (
        [n.name for n in rollout.nodes]
        if request.nodes is None
        else list(dict.fromkeys(request.nodes))
    )
    plan: list[tuple[str, str, str]] = []  # (name, outcome, message)
    found: list[NodeChange] = []
    changed_by = changed_since(rollout)
    for name in wanted:
        i = rollout.index(name)
        node = rollout.nodes[i] if i is not None else None
        decided = node_outcome(node, changed_by.get(name))
        if decided is None:
            assert i is not None and node is not None
            listed = first_backup_listed(
                node, rollout.backups.get(name), rollout.name, rollout.start_commit
            )
            if listed is not node:
                found.append(NodeChange(i, listed, "backup list searched"))
            decided = backup_outcome(listed)
        plan.append((name, *decided))
    waiting = [name for name, outcome, _ in plan if outcome == "waiting"]
    if waiting:
        update = wait_for_backups(rollout, rollbacks, request.id, previous, waiting)
    else:
        update = start_restores(rollout, rollbacks, request.id, previous, plan)
    if update is None:  # still waiting for the same lists
        if found or withdrawn is not None:
            return RollbackUpdate(rollbacks, found=tuple(found), handled=False)
        return None
    return replace(update, found=tuple(found))


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
    rollout: Rollout,
    rollbacks: tuple[RollbackRecord, ...],
    request: str,
    previous: RollbackRecord | None,
    waiting: list[str],
) -> RollbackUpdate | None:
    """The request accepted as ``waiting`` until the agents' backup lists of
    ``waiting`` are read; nothing is sent yet. None: it waits as it did."""
    message = (
        f"waiting for the backup lists of {name_list(waiting)} to find their first "
        "backups; the restores are sent once they are read"
    )
    if previous is not None and previous.message == message:
        return None
    record = RollbackRecord(
        request,
        previous.requested_by if previous is not None else rollout.author,
        previous.time if previous is not None else rollout.now,
        "waiting",
        message,
    )
    return RollbackUpdate((*(r for r in rollbacks if r.id != request), record), request=request)


def start_restores(
    rollout: Rollout,
    rollbacks: tuple[RollbackRecord, ...],
    request: str,
    previous: RollbackRecord | None,
    plan: list[tuple[str, str, str]],
) -> RollbackUpdate:
    """The restores the plan decided and every node's outcome; refusals
    also go into the ``rollback_refused`` condition."""
    restores: list[int] = []
    nodes: list[RollbackNode] = []
    for name, outcome, message in plan:
        if outcome == "restoring":
            i = rollout.index(name)
            assert i is not None
            restores.append(i)
        nodes.append(RollbackNode(name, outcome, message))
    refused = [n.name for n in nodes if n.outcome == "refused"]
    state = "restoring" if any(n.outcome == "restoring" for n in nodes) else "done"
    record = RollbackRecord(
        request,
        # who asked is settled when the request is first seen
        previous.requested_by if previous is not None else rollout.author,
        previous.time if previous is not None else rollout.now,
        state,
        rollback_summary(nodes),
        tuple(nodes),
    )
    return RollbackUpdate(
        (*(r for r in rollbacks if r.id != request), record),
        refused=None
        if not refused
        else f"rollbackRequest {quoted(request)} refused for {name_list(refused)}: "
        + "; ".join(f"{n.name}: {n.message}" for n in nodes if n.outcome == "refused")[:500],
        sets_condition=True,
        restores=tuple(restores),
        request=request,
    )


def withdraw_waiting(
    rollbacks: tuple[RollbackRecord, ...], current: str | None
) -> tuple[RollbackRecord, ...]:
    """A request waiting for backup lists that the file no longer carries
    (removed, or replaced by a new id) has sent nothing: it ends refused,
    so it stops holding back dispatches and resumes. The same tuple when
    nothing is withdrawn."""
    if not any(r.state == "waiting" and r.id != current for r in rollbacks):
        return rollbacks
    why = f"replaced by {quoted(current)}" if current is not None else "removed from the file"
    return tuple(
        replace(r, state="refused", message=f"{why} before its restores were sent")
        if r.state == "waiting" and r.id != current
        else r
        for r in rollbacks
    )


def changed_since(rollout: Rollout) -> dict[str, str]:
    """Nodes of this rollout that a later-started or running rollout has
    sent a job to, with that rollout's name."""
    mine = {n.name for n in rollout.nodes}
    started = rollout.started_at
    found: dict[str, str] = {}
    for name, other in rollout.others().items():
        if name == rollout.name or not other.started or other.started_at is None:
            continue
        later = started is None or other.started_at > started
        if not (later or other.phase in ("running", "paused")):
            continue
        for node in other.nodes:
            if node.attempt > 0 and node.name in mine:
                found.setdefault(node.name, name)
    return found


def with_outcome(
    rollbacks: tuple[RollbackRecord, ...], request: str, node: str, outcome: str, error: str
) -> tuple[RollbackRecord, ...]:
    """The rollback records once a restore of ``request`` on ``node`` ended with ``outcome``."""
    records = list(rollbacks)
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
    return tuple(records)


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
