"""What the daemon saw for a rollout's comparisons and alerts
(docs/health.md), as values handed to the engine: the verdicts of a node's
comparisons, judged by the daemon once its soak had elapsed, and the alerts
Alertmanager showed for a rollout's matchers. The engine decides what they
mean for the node and the rollout.

Times here are the daemon's clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from reconciler.spec.compare import FiringAlert, Measured

__all__ = ["AlertAnswer", "CanaryWatch", "ComparisonVerdict", "FiringAlert"]


@dataclass(frozen=True)
class ComparisonVerdict:
    """One comparison of one node's job: passed, failed or unknown
    (inconclusive), with what decided it."""

    name: str
    verdict: str
    detail: str
    measured: Measured | None = None


@dataclass(frozen=True)
class CanaryWatch:
    """One live node's soak for its comparisons and alerts: since when
    (the pass that first saw its apply succeed with a heartbeat naming the
    target), and the comparisons judged once it had elapsed, by name."""

    job_id: str
    soak_since: datetime
    verdicts: Mapping[str, ComparisonVerdict] = field(default_factory=dict)


@dataclass(frozen=True)
class AlertAnswer:
    """Alertmanager's answer for one rollout's matchers: the active alerts
    neither silenced nor inhibited; ``error`` when it could not be asked
    (no evidence), ``rejected`` when it refused the matchers."""

    alerts: tuple[FiringAlert, ...] = ()
    error: str = ""
    rejected: str = ""

    @property
    def answered(self) -> bool:
        return not self.error and not self.rejected
