"""The rollouts-by-phase gauges, counted again only for the rollouts whose
status changed since the last count.

Keeps the counts between passes (a cache of the statuses: forgetting it
changes nothing but the cost). Must not: read Git or decide anything.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from reconciler.daemon.metrics import Metrics
from reconciler.engine.step import FleetStep
from reconciler.spec import rollout_status as status_values
from reconciler.spec.rollout_status import RolloutStatus


class PhaseGauges:
    """``reconciler_rollouts{phase}``, kept up to date pass by pass."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.phases: dict[str, str] = {}  # the gauges' rollouts and phases
        self.counts: Counter[str] = Counter()  # how many in each phase
        self.shown: dict[str, int] = {}  # what the gauges were set to
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
            self.phases = {name: status.phase for name, status in merged.items()}
            self.counts = Counter(self.phases.values())
        else:
            phases, counts = self.phases, self.counts
            for name in set(changed).union(self._step, step.statuses):
                old = phases.pop(name, None)
                if old is not None:
                    counts[old] -= 1
                status = merged.get(name)
                if status is not None:
                    phases[name] = status.phase
                    counts[status.phase] += 1
        self._step = frozenset(step.statuses)
        shown = dict.fromkeys(status_values.PHASES, 0)
        shown.update((phase, n) for phase, n in self.counts.items() if n)
        for phase, count in shown.items():
            if self.shown.get(phase) != count:  # the gauge holds it already
                self.metrics.rollouts.labels(phase=phase).set(count)
        self.shown = shown
