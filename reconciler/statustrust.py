"""Whether a recorded status may be acted on under verification (DESIGN.md
section 8): nothing a job carries may come from unverified data.

Status files are written by the daemon, but anyone with push access can
commit to ``status/`` without a signature, and jobs are built from status
alone. So, with ``--allowed-signers``, the daemon derives again, from the
verified spec at the rollout's ``startCommit``, everything the engine froze
at start (target, mode, batch size, policy, selection and node list) and
compares. It also checks what can be checked of each node record without
the agents: job ids are derived from (rollout, startCommit, node, attempt,
kind), and a job's ``sourceCommit`` must be a commit of the branch's
first-parent history. A status that disagrees anywhere is *tampered*: the
daemon holds it as it holds an unreadable one (nothing stepped, nothing
sent, the file left as it is) and names the fields.

Pure: values in, field names out. The daemon reads the spec at
``startCommit``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from reconciler.engine import resolve_nodes
from reconciler.jobids import job_id
from reconciler.model import Fleet, RolloutSpec
from reconciler.status import FrozenSpec, RolloutStatus


@dataclass(frozen=True)
class StartSpec:
    """What the verified spec at a rollout's ``startCommit`` fixes."""

    frozen: FrozenSpec
    nodes: tuple[str, ...]  # the selection at that commit, in rollout order


def start_spec(spec: RolloutSpec, fleet: Fleet) -> StartSpec:
    """The frozen values the engine records when it starts ``spec``
    (``engine`` ``start``), and the nodes it selects in ``fleet``."""
    return StartSpec(
        frozen=FrozenSpec(
            target=spec.target,
            batch_size=spec.batch_size,
            live=spec.live,
            on_failure=spec.on_failure,
            selector=spec.selector,
            node_ids=spec.node_ids,
            start_at=spec.start_at,
            include_maintenance=spec.include_maintenance,
            allow_overlap=spec.allow_overlap,
        ),
        nodes=resolve_nodes(spec, fleet),
    )


_FROZEN_FIELDS: tuple[tuple[str, Callable[[FrozenSpec], object]], ...] = (
    ("target.runtime", lambda f: f.target.runtime),
    ("target.provider", lambda f: f.target.provider),
    ("target.model", lambda f: f.target.model),
    ("target.profile", lambda f: f.target.profile),
    ("batchSize", lambda f: f.batch_size),
    ("live", lambda f: f.live),
    ("onFailure", lambda f: f.on_failure),
    ("selector", lambda f: f.selector),
    ("nodeIds", lambda f: f.node_ids),
    ("startAt", lambda f: f.start_at),
    ("includeMaintenance", lambda f: f.include_maintenance),
    ("allowOverlap", lambda f: f.allow_overlap),
)


def tampered_fields(
    status: RolloutStatus,
    expected: StartSpec | None,
    on_branch: Callable[[str], bool],
) -> tuple[str, ...]:
    """The fields of a started ``status`` that the verified spec at its
    ``startCommit`` (``expected``; None: no verified spec there) does not
    back, as written in the status file; () when it agrees.

    ``on_branch(commit)``: is the commit in the branch's first-parent
    history? A ``startCommit`` elsewhere (an unmerged branch, an unverified
    commit) would let a status name its own spec.
    """
    if not status.started or status.frozen is None:
        return ()
    start = status.start_commit
    assert start is not None
    if not on_branch(start):
        return ("startCommit",)
    if expected is None:
        return ("startCommit",)
    wrong = [
        f"frozen.{name}"
        for name, get in _FROZEN_FIELDS
        if get(status.frozen) != get(expected.frozen)
    ]
    names = [n.name for n in status.nodes]
    if not _in_order_within(names, expected.nodes):
        wrong.append("frozen.nodes")
    size = status.frozen.batch_size
    for i, node in enumerate(status.nodes):
        where = f"nodes[{node.name}]"
        if size > 0 and node.batch != i // size + 1:
            wrong.append(f"{where}.batch")
        if node.job_id is not None and node.job_id != job_id(
            status.name, start, node.name, node.attempt, "apply"
        ):
            wrong.append(f"{where}.jobId")
        if node.source_commit is not None and not on_branch(node.source_commit):
            wrong.append(f"{where}.sourceCommit")
        restore = node.restore
        if restore is not None:
            if restore.job_id != job_id(
                status.name, start, node.name, restore.attempt, "restore", restore.request
            ):
                wrong.append(f"{where}.restore.jobId")
            if not on_branch(restore.source_commit):
                wrong.append(f"{where}.restore.sourceCommit")
    return tuple(wrong)


def _in_order_within(names: list[str], selected: tuple[str, ...]) -> bool:
    """Are ``names`` distinct and a subsequence of ``selected``? Not equal:
    a node whose file changed after ``startCommit`` may have left the
    selection the daemon saw at start, never joined it (its change would
    have moved ``startCommit``)."""
    if len(set(names)) != len(names):
        return False
    position = {name: i for i, name in enumerate(selected)}
    last = -1
    for name in names:
        i = position.get(name)
        if i is None or i <= last:
            return False
        last = i
    return True
