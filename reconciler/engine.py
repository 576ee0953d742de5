"""The rollout engine: a pure stepper (DESIGN.md sections 3 to 5).

``step_fleet`` takes every rollout's spec and recorded status, the fleet,
what the daemon observed and one ``now``, and returns the statuses that
changed, the jobs to send once they are committed, and the transitions.

Must not: read the clock, touch Git, HTTP, files or randomness, or log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from reconciler.effects import SendJob
from reconciler.model import Fleet, Problem, RolloutSpec, Settings
from reconciler.observations import Observations
from reconciler.status import RolloutStatus


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
    refusal: str | None = None  # the newest spec change was not verified (DESIGN.md section 8)


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


def step_fleet(
    rollouts: Sequence[RolloutInput],
    fleet: Fleet,
    settings: Settings,
    observations: Observations,
    now: datetime,
) -> FleetStep:
    """Step every rollout to a fixed point with one ``now``."""
    raise NotImplementedError


def resolve_nodes(spec: RolloutSpec, fleet: Fleet) -> tuple[str, ...]:
    """The rollout's node selection, ordered (selector: by name; nodeIds: order kept)."""
    raise NotImplementedError


def in_flight(statuses: Iterable[RolloutStatus]) -> tuple[SendJob, ...]:
    """Every recorded job not finished, payload rebuilt from status alone."""
    raise NotImplementedError


def wanted_heartbeats(statuses: Iterable[RolloutStatus]) -> tuple[str, ...]:
    raise NotImplementedError


def wanted_backups(statuses: Iterable[RolloutStatus]) -> tuple[str, ...]:
    raise NotImplementedError


def next_wakeup(statuses: Iterable[RolloutStatus], settings: Settings) -> datetime | None:
    raise NotImplementedError


def is_active(status: RolloutStatus) -> bool:
    raise NotImplementedError
