"""Which backup a restore puts back (docs/rollouts.md): the one taken by
the node's first apply of this rollout, never a later attempt's. Pure
functions from a node record and what the agent reported to the node's
new first-backup fields; the step records what they return."""

from __future__ import annotations

from collections.abc import Sequence

from reconciler.engine.records import evolve
from reconciler.protocol.job_ids import job_id
from reconciler.protocol.observations import Backup, JobObservation
from reconciler.spec.rollout_status import NodeRecord

# (first_backup_id, first_backup_known, first_apply_attempt)
FirstBackup = tuple[str | None, bool, int | None]


def first_backup_after(node: NodeRecord, job: JobObservation | None) -> FirstBackup:
    """The node's first-backup fields once a verdict on its current attempt
    is recorded, with ``job`` the agent's answer it rests on (if any)."""
    first_backup_id, known = node.first_backup_id, node.first_backup_known
    first_attempt = node.first_apply_attempt
    # A first backup recorded before first_apply_attempt existed is final too.
    if known and first_attempt is None and first_backup_id is None:
        if job is None or job.state not in ("succeeded", "failed", "refused"):
            # The apply may have run without our seeing it: only the
            # agent's backup list can tell.
            known, first_attempt = False, node.attempt
        elif job.state == "succeeded" or job.backup_id is not None:
            # The first apply the agent ran: its backup, or none (no config
            # before, or already the target), is what a restore puts back.
            first_backup_id, first_attempt = job.backup_id, node.attempt
        # Else the agent failed or refused it without a backup and left
        # the config as it was: the next apply counts as the first.
    return first_backup_id, known, first_attempt


def first_backup_listed(
    node: NodeRecord,
    backups: Sequence[Backup] | None,
    rollout: str,
    start_commit: str,
) -> NodeRecord:
    """``node`` with its first backup found in the agent's backup list
    (``backups``; None: not read), or ``node`` itself when it is known
    already or the list was not read.

    From the attempt whose result was never seen on (earlier ones left the
    config as it was), the oldest of this rollout's apply job ids in the
    list is the first. The list cannot tell an unseen apply that ran
    without a backup from one that never reached the agent; a later
    attempt's match is taken as the latter, since after the former a later
    apply finds its target in place and takes no backup either."""
    if node.first_backup_known or backups is None:
        return node
    start = node.first_apply_attempt or 1
    ours = {
        job_id(rollout, start_commit, node.name, a, "apply"): a
        for a in range(start, node.attempt + 1)
    }
    found = min(((ours[b.job_id], b.backup_id) for b in backups if b.job_id in ours), default=None)
    attempt, backup = found if found is not None else (start, None)
    return evolve(
        node, first_backup_id=backup, first_backup_known=True, first_apply_attempt=attempt
    )
