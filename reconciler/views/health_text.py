"""Health checks for people (docs/health.md): the frozen checks and
soak of a rollout, and the checks that failed on its decided nodes, as
lines for ``status NAME``, the dashboard and ``plan``. Pure: statuses and
specs in, text out."""

from __future__ import annotations

from collections.abc import Sequence

from reconciler.spec.health import Health
from reconciler.spec.rollout_status import NodeRecord, RolloutStatus

FAILING_LISTED = 10  # nodes with failing checks shown before "and N more"


def health_lines(health: Health, live: bool, indent: str = "  ") -> list[str]:
    """The soak and one line per check; a dry run says it ignores them."""
    head = health.describe()
    if not live:
        head += " (ignored: a dry run applies nothing)"
    return [head] + [f"{indent}{check.describe()}" for check in health.checks]


def failing_checks(nodes: Sequence[NodeRecord]) -> list[tuple[str, str, str]]:
    """(node, check, detail) of every recorded check outcome that did not hold."""
    return [(n.name, c.name, c.detail) for n in nodes for c in n.checks if not c.ok]


def failing_summary(status: RolloutStatus, limit: int = FAILING_LISTED) -> str:
    """One sentence naming the failing checks, or empty."""
    failing = failing_checks(status.nodes)
    if not failing:
        return ""
    shown = "; ".join(f"{node} {check} ({detail})" for node, check, detail in failing[:limit])
    more = f" and {len(failing) - limit} more" if len(failing) > limit else ""
    return f"failing checks: {shown}{more}"
