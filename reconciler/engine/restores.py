"""Restores in one rollout's status draft (docs/rollouts.md): the restores
an explicit ``rollbackRequest`` or the failure policy decided, sent and
recorded. Which nodes a request restores is ``reconciler.engine.rollback``'s
rule, which backup is ``reconciler.engine.backups``'s, what a send records
is ``reconciler.engine.attempts``'s; these functions record what those
return in the draft and add the restore jobs to its effects.

Each takes the draft, and as arguments everything else it reads: the
agents' backup lists read this pass and the spec commit the step acts on.

Pure, like the rest of the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from reconciler.engine import attempts, rollback
from reconciler.engine.backups import first_backup_listed
from reconciler.engine.draft import StatusDraft
from reconciler.engine.holds import restore_waiting
from reconciler.engine.queries import restore_job
from reconciler.engine.records import evolve
from reconciler.protocol.observations import Backup
from reconciler.spec.model import RollbackRequest
from reconciler.spec.rollout_status import NodeRecord, RolloutStatus

Backups = Mapping[str, tuple[Backup, ...]]  # the agents' backup lists, by node


def answer_request(
    draft: StatusDraft,
    request: RollbackRequest | None,
    *,
    author: str,
    others: Callable[[], Mapping[str, RolloutStatus]],
    backups: Backups,
    spec_commit: str,
) -> None:
    """A started rollout's answer to its ``rollbackRequest`` (None: none
    written, which may withdraw a waiting one)."""
    assert draft.frozen is not None and draft.start_commit is not None
    update = rollback.handle_request(
        request,
        rollback.Rollout(
            name=draft.name,
            author=author,
            now=draft.now,
            live=draft.frozen.live,
            phase=draft.phase,
            started_at=draft.started_at,
            start_commit=draft.start_commit,
            nodes=draft.nodes,
            rollbacks=draft.rollbacks,
            index=draft.index,
            others=others,
            backups=backups,
        ),
    )
    record_rollback(draft, update, spec_commit=spec_commit)


def record_rollback(
    draft: StatusDraft,
    update: rollback.RollbackUpdate | None,
    *,
    spec_commit: str,
) -> None:
    """Record a request's answer, and send the restores it names."""
    if update is None:
        return
    draft.rollbacks = update.rollbacks
    draft.apply(update.found)
    for i in update.restores:
        send_restore(draft, i, update.request, "restoring", source_commit=spec_commit)
    if update.sets_condition:
        draft.set_condition("rollback_refused", update.refused)
    if update.handled:
        draft.spec_commit = spec_commit


def start_policy_restore(
    draft: StatusDraft, i: int, *, backups: Backups, source_commit: str
) -> bool:
    """The failure policy's restore of node ``i``, once its first backup is
    known. False while the backup list is not read yet."""
    node = resolve_first_backup(draft, i, backups)
    if not node.first_backup_known:
        return False  # wait for the backup list (wanted_backups asks for it)
    if node.first_backup_id is None:
        draft.set_node(i, evolve(node, held="rollback_unavailable"), "no backup to restore")
        return True
    send_restore(draft, i, "policy", "rollback_pending", source_commit=source_commit)
    return True


def carry_out_decided(draft: StatusDraft, *, backups: Backups, source_commit: str) -> None:
    """After an abort, restores the policy decided are still carried out."""
    for i in list(draft.open_indexes()):
        node = draft.nodes[i]
        if restore_waiting(node):
            node = resolve_first_backup(draft, i, backups)
            if node.first_backup_known and node.first_backup_id is not None:
                send_restore(draft, i, "policy", "rollback_pending", source_commit=source_commit)
            elif node.first_backup_known:
                draft.set_node(i, evolve(node, held=None), "no backup to restore")


def resolve_first_backup(draft: StatusDraft, i: int, backups: Backups) -> NodeRecord:
    """Node ``i`` with its first backup found in the agent's backup list,
    once that list is read."""
    assert draft.start_commit is not None
    node = draft.nodes[i]
    new = first_backup_listed(node, backups.get(node.name), draft.name, draft.start_commit)
    draft.set_node(i, new, "backup list searched")
    return new


def send_restore(
    draft: StatusDraft, i: int, request: str, state: str, *, source_commit: str
) -> None:
    """Record node ``i``'s next restore for ``request`` and send it."""
    node = draft.nodes[i]
    assert draft.frozen is not None and draft.start_commit is not None
    assert draft.health_timeout is not None
    restore = attempts.next_restore(
        node,
        request,
        rollout=draft.name,
        start_commit=draft.start_commit,
        source_commit=source_commit,
        now=draft.now,
        deadline=attempts.answer_by(draft.now, draft.health_timeout),
    )
    draft.set_node(i, evolve(node, state=state, restore=restore), f"restore ({request})")
    draft.effects.append(restore_job(draft.name, draft.frozen, node.name, restore))
