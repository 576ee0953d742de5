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
    lines = [head] + [f"{indent}{check.describe()}" for check in health.checks]
    lines += [f"{indent}{c.describe()}" for c in health.compare]
    if health.alerts is not None:
        label = health.alerts.node_label
        shown = ", ".join(health.alerts.matchers)
        lines.append(f"{indent}alerts: Alertmanager alerts matching {shown} (node label {label})")
    return lines


def comparison_lines(nodes: Sequence[NodeRecord]) -> list[str]:
    """One line per decided comparison of every node: the verdict, what
    decided it, and the baseline's nodes."""
    out = []
    for n in nodes:
        for c in n.checks:
            m = c.measured
            if m is None:
                continue
            base = (
                f"{n.name}'s own window before its dispatch"
                if m.own_window
                else ", ".join(m.baseline_nodes)
            )
            verdict = "passed" if c.ok else "failed"
            out.append(f"{n.name} {c.name} {verdict}: {c.detail}; baseline {base}")
    return out


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
