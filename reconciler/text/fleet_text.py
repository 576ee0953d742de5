"""The fleet watch for people (docs/operating.md): the dashboard's fleet
section, and what ``reconciler fleet`` prints (text or JSON).

Deterministic: the text depends only on the fleet status given (no clock,
no environment), so the dashboard changes only when the fleet status does.
Must not read Git, files or the clock.
"""

from __future__ import annotations

import json

from reconciler.engine.fleet import drift_text
from reconciler.spec.fleet_status import FleetNode, FleetStatus, fleet_to_record
from reconciler.spec.times import format_time
from reconciler.text import markdown

_ICONS = {"ok": "✅", "offline": "🔌", "drift": "🔀", "unverified": "⚠️"}
_TABLE_LIMIT = 200  # rows of the dashboard's table of nodes not ok


def fleet_line(fleet: FleetStatus) -> str:
    """``12 nodes: 10 ok, 1 offline, 1 drift, 0 unverified``."""
    counts = fleet.counts()
    parts = ", ".join(f"{n} {state}" for state, n in counts.items())
    return f"{len(fleet.nodes)} nodes: {parts}"


def _detail(node: FleetNode) -> str:
    if node.state == "drift":
        return drift_text(node)
    if node.state == "offline":
        return "unreachable; runtimes as last reported"
    if node.state == "unverified":
        return "answers fail the node's agentKey check"
    return ""


def fleet_dashboard_section(fleet: FleetStatus) -> str:
    """The dashboard's ``## Fleet`` section: the fleet line, then a table of
    the nodes that are not ``ok``."""
    out = ["## Fleet", "", fleet_line(fleet), ""]
    bad = [n for n in fleet.nodes if n.state != "ok"]
    if bad:
        out += ["| node | state | since | what |", "|---|---|---|---|"]
        for node in bad[:_TABLE_LIMIT]:
            what = markdown.text(_detail(node))  # quotes what the agent reports
            out.append(
                f"| `{node.name}` | {_ICONS.get(node.state, '')} {node.state} "
                f"| {format_time(node.since)} | {what} |"
            )
        if len(bad) > _TABLE_LIMIT:
            out.append(f"\n... and {len(bad) - _TABLE_LIMIT} more: `reconciler fleet` lists all")
        out.append("")
    return "\n".join(out)


def render_fleet_text(fleet: FleetStatus) -> str:
    """Every node, one line per runtime: what it runs and what it should."""
    lines = [f"fleet: {fleet_line(fleet)}"]
    rows = [("NODE", "STATE", "SINCE", "RUNTIME", "RUNNING", "DESIRED")]
    for node in fleet.nodes:
        runtimes = node.runtimes or ()
        if not runtimes:
            rows.append((node.name, node.state, format_time(node.since), "-", "-", "-"))
        for i, r in enumerate(runtimes):
            desired = f"{r.desired.text} ({r.desired.rollout})" if r.desired else "(none)"
            mark = " *" if r.differs else ""
            first = i == 0
            rows.append(
                (
                    node.name if first else "",
                    node.state if first else "",
                    format_time(node.since) if first else "",
                    r.type,
                    r.text + mark,
                    desired,
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if any(r.differs for n in fleet.nodes for r in n.runtimes):
        lines.append("* differs from the desired state: a new rollout corrects it")
    return "\n".join(lines) + "\n"


def render_fleet_json(fleet: FleetStatus) -> str:
    """The fleet status record with the counts, as JSON."""
    record = fleet_to_record(fleet)
    record["counts"] = fleet.counts()
    return json.dumps(record, indent=2, ensure_ascii=False) + "\n"


__all__ = [
    "fleet_dashboard_section",
    "fleet_line",
    "render_fleet_json",
    "render_fleet_text",
]
