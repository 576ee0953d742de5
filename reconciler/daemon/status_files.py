"""What the ``commit`` step writes: the files of every changed status, the
dashboard when its text changed, and the commit message listing the
transitions.

``StatusFiles`` keeps, between passes, only what spares work: the node
texts written last and the dashboard's row order, and the rollouts the
last drawing's step changed. Forgetting it changes nothing but the cost.

Must not: commit (the caller does, with the store), or read Git but
through the reader's cached dashboard text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.engine import fleet as fleet_rules
from reconciler.engine.step import FleetStep
from reconciler.spec import rollout_status as status_values
from reconciler.spec.fleet_status import FleetStatus
from reconciler.spec.model import Node
from reconciler.spec.paths import DASHBOARD_PATH
from reconciler.spec.rollout_status import RolloutStatus
from reconciler.spec.status_texts import StatusTexts
from reconciler.text.dashboard import DashboardOrder, DashboardParts, dashboard_parts
from reconciler.text.evidence_marks import evidence_dashboard_section
from reconciler.text.fleet_text import fleet_dashboard_section

MESSAGE_LINES = 60  # transitions listed in one commit message


@dataclass(frozen=True)
class Written:
    """The files one pass would commit, and what they were made from."""

    changes: dict[str, bytes | None]  # path -> content (None: deleted); empty: nothing
    written: dict[str, Any]  # status path -> the plain data written there
    pieces: dict[str, tuple[bytes, ...]]  # the dashboard's text in pieces, for the store


class StatusFiles:
    """Turns one step's statuses into the files to commit."""

    def __init__(self) -> None:
        self.texts = StatusTexts()  # node texts written last
        self.order = DashboardOrder()  # the dashboard rows' order
        self._drawn_step: frozenset[str] = frozenset()  # what the last drawing's step changed

    def files(
        self,
        old: Mapping[str, RolloutStatus],
        step: FleetStep,
        merged: Mapping[str, RolloutStatus],
        broken: Mapping[str, str],
        ignored: Mapping[str, str],
        changed: Iterable[str] | None,
        fleet: FleetStatus | None,
        nodes: Sequence[Node],
        current_dashboard: Callable[[], bytes | None],
    ) -> Written:
        """The files of every changed status, and the dashboard if its text
        differs from ``current_dashboard()``; empty when nothing changed,
        so an idle pass commits nothing. ``changed``: the rollouts whose
        recorded statuses changed since the last pass (None: any)."""
        changes: dict[str, bytes | None] = {}
        written: dict[str, Any] = {}
        for name, new in step.statuses.items():
            write, gone = status_values.changed_files(old.get(name), new)
            for path, data in write.items():
                changes[path] = self.texts.write(new, path, data)
                written[path] = data
            for path in gone:
                changes[path] = None
        # Only the rollouts whose status may differ from the last drawing
        # are looked at: read again, or changed by this step or that one.
        names = set(changed).union(self._drawn_step, step.statuses) if changed is not None else None
        dashboard = _dashboard(merged, broken, fleet, self.order, nodes, names, ignored=ignored)
        self._drawn_step = frozenset(step.statuses)
        # Encoded in pieces: the table's unchanged blocks are kept encoded.
        parts = dashboard.pieces()
        text = b"".join(parts)
        pieces: dict[str, tuple[bytes, ...]] = {}
        if current_dashboard() != text:
            changes[DASHBOARD_PATH] = text
            pieces[DASHBOARD_PATH] = parts
        return Written(changes, written, pieces)


def _dashboard(
    statuses: Mapping[str, RolloutStatus],
    broken: Mapping[str, str],
    fleet: FleetStatus | None = None,
    order: DashboardOrder | None = None,
    nodes: Sequence[Node] = (),
    changed: Iterable[str] | None = None,
    *,
    ignored: Mapping[str, str] | None = None,
) -> DashboardParts:
    """The dashboard, with the fleet watch's section when there is a fleet
    status, the evidence marks of the nodes (docs/trust.md) when any applies,
    and the status files that cannot be read listed last, since those
    rollouts are held until a person repairs them; then the files under
    status/ that no rollout can own."""
    text = dashboard_parts(statuses, order, changed)
    if fleet is not None:
        text = text.extended("\n\n" + fleet_dashboard_section(fleet))
    marks = evidence_dashboard_section(nodes)
    if marks:
        text = text.extended("\n\n" + marks)
    if broken:
        lines = ["", "## Status files that cannot be read or are not verified", ""]
        lines += [
            f"- `{name}`: {reason} (held until repaired)" for name, reason in sorted(broken.items())
        ]
        text = text.extended("\n" + "\n".join(lines) + "\n")
    if ignored:
        lines = ["", "## Files under status/ that are ignored", ""]
        lines += [f"- `{path}`: {reason}" for path, reason in sorted(ignored.items())]
        text = text.extended("\n" + "\n".join(lines) + "\n")
    return text


def commit_message(
    step: FleetStep,
    spec_commit: str | None,
    broken: Mapping[str, str] | None = None,
    fleet_changes: Sequence[fleet_rules.FleetChange] = (),
) -> str:
    """``status: web running, db: 2 succeeded`` and one line a transition."""
    rollouts = sorted({t.rollout for t in step.transitions} | set(step.statuses))
    head = ", ".join(_summary(step, name) for name in rollouts[:3])
    if len(rollouts) > 3:
        head += f" and {len(rollouts) - 3} more"
    if not head and fleet_changes:
        head = fleet_summary(fleet_changes)
    if not head and broken:
        head = "unreadable status of " + ", ".join(sorted(broken)[:3])
    lines = [f"status: {head}", ""]
    for t in step.transitions[:MESSAGE_LINES]:
        who = f"{t.rollout}/{t.node}" if t.node else t.rollout
        lines.append(
            f"{who}: {t.from_state} -> {t.to_state}" + (f" ({t.reason})" if t.reason else "")
        )
    if len(step.transitions) > MESSAGE_LINES:
        lines.append(f"... and {len(step.transitions) - MESSAGE_LINES} more transitions")
    lines += fleet_lines(fleet_changes, MESSAGE_LINES)
    if step.effects:
        lines.append(f"jobs recorded: {len(step.effects)}")
    if spec_commit:
        lines += ["", f"Spec-Commit: {spec_commit}"]
    return "\n".join(lines) + "\n"


def fleet_summary(changes: Sequence[fleet_rules.FleetChange]) -> str:
    """``fleet: gpu-a1 drift, gpu-a2 offline`` (the first three)."""
    named = [f"{c.node} {c.to_state or 'gone'}" for c in changes[:3]]
    more = f" and {len(changes) - 3} more" if len(changes) > 3 else ""
    return "fleet: " + ", ".join(named) + more


def fleet_lines(changes: Sequence[fleet_rules.FleetChange], limit: int) -> list[str]:
    """One commit message line per node state change, up to ``limit``."""
    lines = [
        f"fleet/{c.node}: {c.from_state or 'new'} -> {c.to_state or 'gone'}"
        + (f" ({c.detail})" if c.detail else "")
        for c in changes[:limit]
    ]
    if len(changes) > limit:
        lines.append(f"... and {len(changes) - limit} more fleet changes")
    return lines


def _summary(step: FleetStep, rollout: str) -> str:
    """``web running`` for a phase change, else ``web: 2 succeeded, 1 dispatched``."""
    phases = [t.to_state for t in step.transitions if t.rollout == rollout and t.node is None]
    if phases:
        return f"{rollout} {phases[-1]}"
    counts: dict[str, int] = {}
    for t in step.transitions:
        if t.rollout == rollout and t.node is not None:
            counts[t.to_state] = counts.get(t.to_state, 0) + 1
    detail = ", ".join(f"{n} {state}" for state, n in counts.items())
    return f"{rollout}: {detail}" if detail else rollout
