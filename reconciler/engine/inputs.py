"""The values a fleet step takes and gives back: one rollout's input, a
transition for the commit message, and the step's result. Plain data, so
that the step, its caches and its callers share them without importing
each other. No rule lives here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from reconciler.protocol.effects import SendJob
from reconciler.spec.model import Problem, RolloutSpec
from reconciler.spec.rollout_status import ApprovalRecord, NodeRecord, OperatorAct, RolloutStatus


@dataclass(frozen=True)
class RolloutInput:
    name: str
    spec: RolloutSpec | None  # None: file removed, or present but invalid
    file_present: bool
    problems: tuple[Problem, ...]  # why a present file is unusable (phase pending)
    status: RolloutStatus | None  # recorded status; None if it has no status file yet
    spec_commit: str  # newest commit that changed the file, its node files or reconciler.yaml
    first_seen_commit: str  # first-parent commit that added the file
    queue_key: int  # order of first_seen_commit in first-parent history, oldest smallest
    author: str = ""  # author of spec_commit ("Name <email>"), recorded with rollback requests
    refusal: str | None = None  # the newest spec change was not verified (docs/trust.md)
    # approvals of the verified commit acted on, under --require-approvals (docs/trust.md)
    approved_by: tuple[ApprovalRecord, ...] = ()
    # who set spec.paused / spec.abort to true, while it is true (None: unknown)
    paused_by: OperatorAct | None = None
    aborted_by: OperatorAct | None = None


@dataclass(frozen=True)
class Transition:
    rollout: str
    node: str | None  # None: the rollout's phase
    from_state: str
    to_state: str
    reason: str


@dataclass(frozen=True)
class FleetStep:
    statuses: Mapping[str, RolloutStatus] = field(default_factory=dict)  # changed only
    effects: tuple[SendJob, ...] = ()  # jobs recorded in this step, to send after the commit
    transitions: tuple[Transition, ...] = ()  # for the commit message and logs


@dataclass(frozen=True)
class NodeChange:
    """A new record for the node at ``index`` of a rollout's frozen list,
    and why: what the helper rules return for the step to apply."""

    index: int
    node: NodeRecord
    reason: str
