"""``status/README.md``: the dashboard the daemon commits next to the status
files, so the forge's file view of ``status/`` shows the fleet at a glance.

One table row per rollout (phase, progress bar, current batch, hold), a list
of what needs a person (holds and conditions), and a Mermaid flowchart of the
active rollouts' batches coloured by state. Consecutive batches in the same
state are drawn as one box, so a rollout of 10,000 batches is still a
handful of boxes.

Deterministic: the text depends only on the statuses given (no clock, no
environment, no dict order), so the daemon can compare bytes and write the
file only when a status changed. Must not read Git, files or the clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from reconciler.spec.batch_shapes import describe_sizes
from reconciler.spec.paths import DASHBOARD_PATH
from reconciler.spec.rollout_status import RolloutStatus
from reconciler.views.health_text import failing_summary
from reconciler.views.status_text import (
    batch_groups,
    batch_text,
    ordered,
    progress_text,
    summarize,
)

PATH = DASHBOARD_PATH

_PHASE_ICONS = {
    "paused": "⏸️",
    "running": "▶️",
    "scheduled": "🕒",
    "pending": "⏳",
    "completed": "✅",
    "failed": "❌",
    "aborted": "⛔",
}

# Mermaid classes, one per batch state as drawn.
_CLASSES = (
    ("done", "fill:#dafbe1,stroke:#1a7f37,color:#1a7f37"),
    ("running", "fill:#ddf4ff,stroke:#0969da,color:#0969da"),
    ("held", "fill:#fff8c5,stroke:#9a6700,color:#7d4e00"),
    ("failed", "fill:#ffebe9,stroke:#cf222e,color:#a40e26"),
    ("pending", "fill:#f6f8fa,stroke:#8c959f,color:#57606a"),
)

_MESSAGE_LIMIT = 160
_NODES_LISTED = 10
# How a refusal for missing approvals reads (``git.approval_notes.Approvals.summary``).
_APPROVAL_MISSING = re.compile(r"\bneeds \d+ approvals? (?:besides \S.*?'s)?; has \d+")


def waits_for_approval(status: RolloutStatus) -> bool:
    """Is the rollout held back only for reviewers' approvals (DESIGN.md section 17)?"""
    condition = status.condition("unverified")
    return (
        status.phase == "pending"
        and condition is not None
        and bool(_APPROVAL_MISSING.search(condition.message))
    )


def render_dashboard(statuses: Mapping[str, RolloutStatus]) -> str:
    """The Markdown text of ``status/README.md`` for these statuses."""
    rollouts = ordered(statuses)
    out = [
        "# Rollouts",
        "",
        "<!-- Written by the reconciler daemon from the status files in this folder. "
        "Edits are overwritten. -->",
        "",
    ]
    if not rollouts:
        out += ["No rollouts yet: add a file under `rollouts/` to start one.", ""]
        return "\n".join(out)
    out += [_counts(rollouts), ""]
    out += _table(rollouts)
    attention = _attention(rollouts)
    if attention:
        out += ["", "## Needs attention", "", *attention]
    active = [s for s in rollouts if s.phase in ("running", "paused") and s.batches]
    if active:
        out += ["", "## Active rollouts", "", *_diagram(active)]
    return "\n".join(out) + "\n"


def _counts(rollouts: list[RolloutStatus]) -> str:
    by_phase: dict[str, int] = {}
    for s in rollouts:
        by_phase[s.phase] = by_phase.get(s.phase, 0) + 1
    parts = [f"{n} {phase}" for phase, n in by_phase.items()]
    noun = "rollout" if len(rollouts) == 1 else "rollouts"
    return f"{len(rollouts)} {noun}: " + ", ".join(parts) + "."


def _table(rollouts: list[RolloutStatus]) -> list[str]:
    lines = [
        "| Rollout | Phase | Progress | Batch | Hold / reason | Since |",
        "|---|---|---|---|---|---|",
    ]
    global _rows
    seen: dict[int, tuple[RolloutStatus, str]] = {}
    for status in rollouts:
        cached = _rows.get(id(status))
        text = cached[1] if cached is not None and cached[0] is status else _row(status)
        seen[id(status)] = (status, text)
        lines.append(text)
    # Keep the rows of the statuses just drawn (and of other recent callers'),
    # but never more than a few tables' worth.
    _rows.update(seen)
    if len(_rows) > 2 * len(seen) + 20_000:
        _rows = seen
    return lines


# Row text by the identity of the status it was drawn from: a row depends
# only on its (immutable) status, and the daemon keeps the same status
# objects from pass to pass, so an unchanged rollout's row is not drawn
# again. The status is kept with its text so a recycled id() never matches.
_rows: dict[int, tuple[RolloutStatus, str]] = {}


def _row(status: RolloutStatus) -> str:
    s = summarize(status)
    icon = _PHASE_ICONS.get(s.phase, "")
    since = s.since.strftime("%Y-%m-%d %H:%MZ") if s.since else ""
    why = f"`{s.why}`" if s.why else ""
    if waits_for_approval(status):
        why = "⏳ waiting for approval"
    mode = ""
    if status.frozen is not None:
        mode = " · live" if status.frozen.live else " · dry-run"
    return (
        f"| [{s.name}]({s.name}.yaml) | {icon} {s.phase}{mode} | `{progress_text(s)}` "
        f"| {batch_text(s)} | {why} | {since} |"
    )


def _attention(rollouts: list[RolloutStatus]) -> list[str]:
    lines: list[str] = []
    for status in rollouts:
        if status.hold is not None:
            hold = status.hold
            nodes = ", ".join(hold.nodes[:_NODES_LISTED])
            more = max(hold.node_count, len(hold.nodes)) - min(len(hold.nodes), _NODES_LISTED)
            if more > 0:
                nodes += f" and {more} more"
            text = f"- **{status.name}** `{hold.reason}`: {_sentence(hold.message)}"
            failing = failing_summary(status)
            lines.append(
                text
                + (f" Nodes: {nodes}." if nodes else "")
                + (f" {_sentence(failing[0].upper() + failing[1:])}" if failing else "")
            )
        for condition in status.conditions:
            if condition.type == "unverified" and waits_for_approval(status):
                lines.append(
                    f"- **{status.name}** waiting for approval: {_sentence(condition.message)}"
                )
                continue
            lines.append(
                f"- **{status.name}** condition `{condition.type}`: {_sentence(condition.message)}"
            )
    return lines


def _diagram(active: list[RolloutStatus]) -> list[str]:
    lines = ["```mermaid", "flowchart LR"]
    for i, status in enumerate(active, start=1):
        rid = f"r{i}"
        title = f"{status.name}: {status.phase}"
        if status.hold is not None:
            title += f" ({status.hold.reason})"
        lines.append(f'  subgraph {rid}["{_label(title)}"]')
        lines.append("    direction LR")
        groups = batch_groups(status)
        ids = [f"{rid}b{group.first}" for group in groups]
        sizes = _sizes(status)
        for group, bid in zip(groups, ids, strict=True):
            which = (
                f"batch {group.first}"
                if group.first == group.last
                else f"batches {group.first}-{group.last}"
            )
            label = f"{which}<br/>{group.ok}/{group.total} ok · {group.state}"
            if sizes:
                label = f"{which} · {_group_sizes(sizes, group.first, group.last)}<br/>" + (
                    f"{group.ok}/{group.total} ok · {group.state}"
                )
            lines.append(f'    {bid}["{label}"]:::{group.state}')
        if len(ids) > 1:
            lines.append("    " + " --> ".join(ids))
        lines.append("  end")
    for name, style in _CLASSES:
        lines.append(f"  classDef {name} {style}")
    lines.append("```")
    return lines


def _sizes(status: RolloutStatus) -> tuple[int, ...]:
    """Batch sizes of a rollout cut by ``batches`` (empty for ``batchSize``,
    whose boxes keep their version 1 labels)."""
    if status.frozen is None or not status.frozen.batches:
        return ()
    return status.frozen.batch_sizes(len(status.nodes))


def _group_sizes(sizes: tuple[int, ...], first: int, last: int) -> str:
    chunk = sizes[first - 1 : last]
    if len(chunk) == 1:
        return f"{chunk[0]} node{'s' if chunk[0] != 1 else ''}"
    if len(set(chunk)) == 1:
        return f"{chunk[0]} nodes each"
    return "sizes " + describe_sizes(chunk)


def _label(text: str) -> str:
    """Text safe inside a quoted Mermaid label."""
    return text.replace('"', "#quot;").replace("<", "&lt;").replace(">", "&gt;")


def _cell(text: str) -> str:
    """Text safe inside one Markdown table cell or list item: one line,
    no pipes or HTML, bounded length."""
    text = " ".join(text.split())
    if len(text) > _MESSAGE_LIMIT:
        text = text[: _MESSAGE_LIMIT - 1] + "…"
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _sentence(text: str) -> str:
    text = _cell(text)
    return text if not text or text[-1] in ".!?…" else text + "."
