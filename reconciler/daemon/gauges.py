"""The rollouts-by-phase, holds-by-reason and waits-by-reason gauges,
counted again only for the rollouts whose status changed since the last
count; and, from the rollouts a step changed, each node's out-of-service
time, each decided comparison and each node attempt's eval results,
observed once.

Keeps the counts between passes (a cache of the statuses: forgetting it
changes nothing but the cost). Must not: read Git or decide anything.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from prometheus_client import Gauge

from reconciler.daemon.metrics import WAIT_REASONS, Metrics
from reconciler.engine.step import FleetStep
from reconciler.spec import rollout_status as status_values
from reconciler.spec.evals import check_outcomes
from reconciler.spec.rollout_status import CheckOutcome, RolloutStatus


class PhaseGauges:
    """``reconciler_rollouts{phase}`` and ``reconciler_holds{reason}``, kept
    up to date pass by pass."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        # rollout: (phase, hold reason, wait reason)
        self.phases: dict[str, tuple[str, str | None, str | None]] = {}
        self.counts: Counter[str] = Counter()  # how many in each phase
        self.held: Counter[str] = Counter()  # how many held for each reason
        self.waiting: Counter[str] = Counter()  # how many wait for each reason
        self.shown: dict[str, int] = {}  # what the gauges were set to
        self.shown_holds: dict[str, int] = {}
        self.shown_waits: dict[str, int] = {}
        # per rollout, what was observed already: node names (out of
        # service), (node, attempt, comparison) decided, ("evals", node, attempt)
        self.observed: dict[str, frozenset[object]] = {}
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
            self.counts = Counter(phase for phase, _, _ in self.phases.values())
            self.held = Counter(reason for _, reason, _ in self.phases.values() if reason)
            self.waiting = Counter(wait for _, _, wait in self.phases.values() if wait)
            # What a status already held when the daemon started is not observed again.
            self.observed = {name: _observable(status) for name, status in merged.items()}
        else:
            for name in set(changed).union(self._step, step.statuses):
                self._count(name, merged.get(name))
        self._observe(merged, step.statuses)
        self._step = frozenset(step.statuses)
        self.shown = _set(self.metrics.rollouts, "phase", status_values.PHASES, self.counts,
                          self.shown)  # fmt: skip
        self.shown_holds = _set(self.metrics.holds, "reason", status_values.HOLD_REASONS,
                                self.held, self.shown_holds)  # fmt: skip
        self.shown_waits = _set(self.metrics.waits, "reason", WAIT_REASONS, self.waiting,
                                self.shown_waits)  # fmt: skip

    def _count(self, name: str, status: RolloutStatus | None) -> None:
        old = self.phases.pop(name, None)
        if old is not None:
            self.counts[old[0]] -= 1
            if old[1]:
                self.held[old[1]] -= 1
            if old[2]:
                self.waiting[old[2]] -= 1
        if status is not None:
            self.phases[name] = new = _shown(status)
            self.counts[new[0]] += 1
            if new[1]:
                self.held[new[1]] += 1
            if new[2]:
                self.waiting[new[2]] += 1

    def _observe(self, merged: Mapping[str, RolloutStatus], names: Iterable[str]) -> None:
        """Out-of-service times, decided comparisons and eval results new in
        the statuses this step changed, each observed once."""
        for name in names:
            status = merged.get(name)
            if status is None:
                self.observed.pop(name, None)
                continue
            before = self.observed.get(name, frozenset())
            now = _observable(status)
            for node in status.nodes:
                if node.out_of_service is not None and node.name not in before:
                    self.metrics.out_of_service.observe(node.out_of_service)
                for check in node.checks:
                    key = (node.name, node.attempt, check.name)
                    if check.measured is not None and key not in before:
                        self.metrics.comparisons.labels(outcome=_outcome(check)).inc()
                if node.evals and ("evals", node.name, node.attempt) not in before:
                    frozen = status.frozen.evals if status.frozen is not None else ()
                    for _, held, _ in check_outcomes(node.evals, frozen):
                        self.metrics.evals.labels(outcome="passed" if held else "failed").inc()
            self.observed[name] = now


def _observable(status: RolloutStatus) -> frozenset[object]:
    """What a status holds that is observed once: nodes with an
    out-of-service time, decided comparisons, node attempts with evals."""
    found: set[object] = set()
    for node in status.nodes:
        if node.out_of_service is not None:
            found.add(node.name)
        if node.evals:
            found.add(("evals", node.name, node.attempt))
        found.update(
            (node.name, node.attempt, c.name) for c in node.checks if c.measured is not None
        )
    return frozenset(found)


def _outcome(check: CheckOutcome) -> str:
    if check.ok:
        return "passed"
    measured = check.measured
    return "failed" if measured is not None and measured.p_value is not None else "unknown"


def _shown(status: RolloutStatus) -> tuple[str, str | None, str | None]:
    """A rollout's phase, its hold's reason while it is not over, and what
    it waits for that is no hold (a window, a freeze, alerts, approval)."""
    held = status.hold is not None and status.phase not in status_values.TERMINAL_PHASES
    wait = status.waiting.reason if status.waiting is not None else None
    if status.phase == "pending" and status.reason == "unverified":
        wait = "approval"
    if status.phase in status_values.TERMINAL_PHASES:
        wait = None
    return status.phase, status.hold.reason if held and status.hold else None, wait


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
