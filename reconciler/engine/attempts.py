"""A node's next attempt (docs/rollouts.md): the record a send writes for
an apply or a restore, or why the daemon cannot send. Pure functions of
the node record, its node file and the pass's ``now``; the step records
what they return and turns a dispatched record into a job."""

from __future__ import annotations

from datetime import datetime, timedelta

from reconciler.engine.records import evolve
from reconciler.protocol.job_ids import job_id
from reconciler.spec import agent_url
from reconciler.spec.agent_url import is_usable_agent_url
from reconciler.spec.model import Node
from reconciler.spec.rollout_status import NodeRecord, RestoreRecord

REMOVED = "node removed from nodes/"


def answer_by(now: datetime, health_timeout: int) -> datetime:
    """When a job sent at ``now`` must have answered: ``healthTimeout`` later."""
    return now + timedelta(seconds=health_timeout)


def next_apply(
    node: NodeRecord,
    fleet_node: Node | None,
    *,
    include_maintenance: bool,
    rollout: str,
    start_commit: str,
    source_commit: str,
    now: datetime,
    deadline: datetime,
    auto_retry: bool = False,
) -> tuple[NodeRecord, bool]:
    """The node's record after asking for its next attempt, and whether a
    job is to be sent. A node removed from nodes/ that was never sent an
    apply ends ``unknown``; one that was, or one the daemon cannot send to (its file
    says maintenance, or its agent address is unusable), is held
    ``dispatch_refused`` and keeps its verdict."""
    if fleet_node is None:
        if node.state in ("pending", "staged"):
            gone = evolve(
                node, state="unknown", verdict="unknown", error=REMOVED, finished_at=now, held=None
            )
            return gone, False
        return evolve(node, held="dispatch_refused", error=REMOVED), False
    refusal = dispatch_refusal(fleet_node, include_maintenance)
    if refusal:
        return evolve(node, held="dispatch_refused", error=refusal), False
    attempt = node.attempt + 1
    sent = evolve(
        node,
        state="dispatched",
        attempt=attempt,
        job_id=job_id(rollout, start_commit, node.name, attempt, "apply"),
        source_commit=source_commit,
        dispatched_at=now,
        deadline=deadline,
        finished_at=None,
        verdict=None,
        error="",
        backup_id=None,
        held=None,
        evidence=None,
        failed_by_alert=None,
        auto_retried=node.auto_retried or auto_retry,
        timings=None,
        out_of_service=None,
        evals=None,
    )
    return sent, True


def gone(fleet_node: Node | None, include_maintenance: bool) -> bool:
    """Removed from nodes/, or in maintenance that the rollout does not include."""
    return fleet_node is None or (fleet_node.maintenance and not include_maintenance)


def dispatch_refusal(node: Node, include_maintenance: bool) -> str:
    """Why the daemon cannot send ``node`` a job, or ""."""
    if node.maintenance and not include_maintenance:
        return "node is in maintenance"
    if not is_usable_agent_url(node.agent):
        return f"agent address {node.agent!r} is not {agent_url.SHAPE}"
    return ""


def next_restore(
    node: NodeRecord,
    request: str,
    *,
    rollout: str,
    start_commit: str,
    source_commit: str,
    now: datetime,
    deadline: datetime,
) -> RestoreRecord:
    """The restore that puts the node's first backup back for ``request``
    (``policy``, or a rollback request's id)."""
    assert node.first_backup_id is not None
    return RestoreRecord(
        request=request,
        job_id=job_id(rollout, start_commit, node.name, node.attempt, "restore", request),
        backup_id=node.first_backup_id,
        attempt=node.attempt,
        source_commit=source_commit,
        dispatched_at=now,
        deadline=deadline,
    )
