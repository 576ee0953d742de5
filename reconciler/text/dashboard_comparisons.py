"""The dashboard's view of comparisons and alerts (docs/health.md): a table
of the decided comparisons of each active rollout's current batch, passed
and failed alike, with the numbers each verdict rests on (both sides'
medians or rates and samples, the change, the p-value), and the line under
"Needs attention" of a rollout whose next batch waits for its alerts,
naming them.

Text from Alertmanager (alert names, times) goes through ``markdown.text``.
Deterministic and pure like the dashboard: statuses in, lines out; must
not read Git, files or the clock.
"""

from __future__ import annotations

from collections.abc import Iterable

from reconciler.spec.compare import Measured
from reconciler.spec.rollout_status import (
    ALERT_WAITING_REASONS,
    CheckOutcome,
    NodeRecord,
    RolloutStatus,
)
from reconciler.text import markdown
from reconciler.text.status_text import current_batch

SHOWN = 20  # comparisons listed per rollout; failed ones first
ALERT_WAITS = ALERT_WAITING_REASONS

_HEAD = (
    "| Rollout | Node | Comparison | Verdict | Node's | Baseline's | Change | p-value |",
    "|---|---|---|---|---|---|---|---|",
)


def comparison_section(active: Iterable[RolloutStatus]) -> list[str]:
    """``## Comparisons``: the table, or nothing when no active rollout's
    current batch has a decided comparison."""
    rows: list[str] = []
    for status in active:
        rows += _rollout_rows(status)
    if not rows:
        return []
    return ["", "## Comparisons", "", *_HEAD, *rows]


def _rollout_rows(status: RolloutStatus) -> list[str]:
    batch = current_batch(status)
    if batch is None:
        return []
    found = [(n, c) for n in status.nodes if n.batch == batch for c in n.checks if c.measured]
    if not found:
        return []
    found.sort(key=lambda nc: nc[1].ok)  # failed first, else in the batch's order
    name = markdown.text(status.name)
    rows = [_row(name, node, check) for node, check in found[:SHOWN]]
    if len(found) > SHOWN:
        rows.append(
            f"| **{name}** | and {len(found) - SHOWN} more of batch {batch} "
            "(`reconciler status` lists them all) | | | | | | |"
        )
    return rows


def _row(name: str, node: NodeRecord, check: CheckOutcome) -> str:
    m = check.measured
    assert m is not None
    verdict = "✅ passed" if check.ok else "❌ failed" if m.p_value is not None else "❔ unknown"
    if m.own_window:
        nodes = "own window before dispatch"
    else:
        nodes = f"{len(m.baseline_nodes)} node" + ("" if len(m.baseline_nodes) == 1 else "s")
    p_value = "" if m.p_value is None else f"{m.p_value:.3g}"
    return (
        f"| **{name}** | {markdown.text(node.name)} | {markdown.text(check.name)} | {verdict} "
        f"| {_side(m, m.canary, m.canary_samples)} "
        f"| {_side(m, m.baseline, m.baseline_samples)}, {nodes} | {_change(m)} | {p_value} |"
    )


def _side(m: Measured, value: float | None, samples: int) -> str:
    unit = "samples" if m.kind == "median" else "steps"
    if value is None:
        return f"none ({samples} {unit})"
    shown = f"median {value:g}" if m.kind == "median" else f"rate {value:.3%}"
    return f"{shown} ({samples} {unit})"


def _change(m: Measured) -> str:
    """How much worse: relative for a median, in percentage points for a rate."""
    if m.change is None:
        return ""
    if m.kind == "median":
        return f"{m.change:+.1%}"
    return f"{m.change * 100:+.3g} points"


def alert_wait_line(status: RolloutStatus) -> str:
    """The "Needs attention" line of a rollout whose next batch waits for
    its alerts, or empty."""
    waiting = status.waiting
    if waiting is None or waiting.reason not in ALERT_WAITS or status.terminal:
        return ""
    name = markdown.text(status.name)
    if waiting.reason == "alertmanager_unreachable":
        return (
            f"- ⏳ **{name}** waiting `alertmanager_unreachable`: no new batch until "
            "Alertmanager answers (no answer is no evidence)."
        )
    firing = ", ".join(
        f"{markdown.text(a.alertname)} (firing since {markdown.text(a.starts_at)})"
        for a in waiting.alerts
    )
    return (
        f"- ⏳ **{name}** waiting `alert_firing`: {firing or 'a fleet-wide alert'}; "
        "the next batch starts by itself once the alert resolves or is silenced."
    )
