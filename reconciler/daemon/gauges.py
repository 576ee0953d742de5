"""The rollouts-by-phase and holds-by-reason gauges, counted again only for
the rollouts whose status changed since the last count.

Keeps the counts between passes (a cache of the statuses: forgetting it
changes nothing but the cost). Must not: read Git or decide anything.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from prometheus_client import Gauge

from reconciler.daemon.metrics import Metrics
from reconciler.engine.step import FleetStep
from reconciler.spec import rollout_status as status_values
from reconciler.spec.rollout_status import RolloutStatus


class PhaseGauges:
    """``reconciler_rollouts{phase}`` and ``reconciler_holds{reason}``, kept
    up to date pass by pass."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.phases: dict[str, tuple[str, str | None]] = {}  # rollout: (phase, hold reason)
        self.counts: Counter[str] = Counter()  # how many in each phase
        self.held: Counter[str] = Counter()  # how many held for each reason
        self.shown: dict[str, int] = {}  # what the gauges were set to
        self.shown_holds: dict[str, int] = {}
        self._step: frozenset[str] = frozenset()  # the rollouts the counted step changed

    def update(
        self,
        merged: Mapping[str, RolloutStatus],
        step: FleetStep,
        changed: Iterable[str] | None,
    ) -> None:
        """Count again the rollouts whose recorded status ``changed`` since
        the last pass (None: every one), and those this step or the one
        before (whose statuses that count included) changed."""
        if changed is None:
            self.phases = {name: _shown(status) for name, status in merged.items()}
            self.counts = Counter(phase for phase, _ in self.phases.values())
            self.held = Counter(reason for _, reason in self.phases.values() if reason)
        else:
            phases, counts, held = self.phases, self.counts, self.held
            for name in set(changed).union(self._step, step.statuses):
                old = phases.pop(name, None)
                if old is not None:
                    counts[old[0]] -= 1
                    if old[1]:
                        held[old[1]] -= 1
                status = merged.get(name)
                if status is not None:
                    phases[name] = new = _shown(status)
                    counts[new[0]] += 1
                    if new[1]:
                        held[new[1]] += 1
        self._step = frozenset(step.statuses)
        self.shown = _set(self.metrics.rollouts, "phase", status_values.PHASES, self.counts,
                          self.shown)  # fmt: skip
        self.shown_holds = _set(self.metrics.holds, "reason", status_values.HOLD_REASONS,
                                self.held, self.shown_holds)  # fmt: skip


def _shown(status: RolloutStatus) -> tuple[str, str | None]:
    """A rollout's phase, and its hold's reason while it is not over."""
    held = status.hold is not None and status.phase not in status_values.TERMINAL_PHASES
    return status.phase, status.hold.reason if held and status.hold else None


def _set(
    gauge: Gauge, label: str, known: Iterable[str], counts: Counter[str], before: dict[str, int]
) -> dict[str, int]:
    """Each known label value's count (0 when none), and any other counted;
    a gauge is set only when its value changed."""
    shown = dict.fromkeys(known, 0)
    shown.update((value, n) for value, n in counts.items() if n)
    for value, count in shown.items():
        if before.get(value) != count:  # the gauge holds it already
            gauge.labels(**{label: value}).set(count)
    return shown
