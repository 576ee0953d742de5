"""The web page, rendered by the server (docs/web.md): the rollouts table,
one rollout in full (``web_rollout``) and the fleet, as HTML that holds
the data at load. The page's script then reloads the same HTML from the
event stream, so what a plain ``chromium --screenshot`` captures and what
a live page shows come from this one renderer.

Every text from a status file or the fleet goes through ``html.escape``.
Pure: status values in, HTML text out; no Git, files or clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape
from typing import Any
from urllib.parse import quote

from reconciler.spec.rollout_status import RolloutStatus, to_record
from reconciler.spec.times import format_time
from reconciler.text.web_rollout import cell, mode_of, phase_badge, rollout_section, state_badge

# Progress bar segments, by node state: (CSS class, shown in the bar).
_BAR_STATES = (
    "succeeded", "failed", "timed_out", "rollback_failed", "unknown", "stopped",
    "rollback_pending", "restoring", "dispatched", "staging", "staged", "skipped", "rolled_back",
)  # fmt: skip

ROLLOUT_COLUMNS = ("Rollout", "Phase", "Mode", "Progress", "Hold", "Waiting", "Target", "Updated")


def when(text: str | None) -> str:
    return text.replace("T", " ").replace("Z", " UTC") if text else "—"


def target_words(target: Mapping[str, Any] | None) -> str:
    if not target:
        return "—"
    return f"{target['runtime']}: {target['provider']}/{target['model']}/{target['profile']}"


def progress_cell(progress: Mapping[str, int], status: RolloutStatus) -> str:
    """``3 of 10 succeeded`` with a bar; before start, why it has no nodes yet."""
    total = sum(progress.values())
    if total == 0:
        words = "waiting for approval" if status.reason == "unverified" else "not started"
        return f'<span class="quiet">{words}</span>'
    done = progress.get("succeeded", 0)
    parts = [(s, progress[s]) for s in _BAR_STATES if progress.get(s)]
    counts = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in parts)
    svg = "".join(
        f'<rect class="fill-{s}" x="{100 * sum(n for _, n in parts[:i]) / total:.2f}%" y="0" '
        f'width="{100 * n / total:.2f}%" height="100%"/>'
        for i, (s, n) in enumerate(parts)
    )
    return (
        f"<span>{done} of {total} succeeded</span>"
        f'<span class="visually-hidden"> ({escape(counts)})</span>'
        f'<svg class="bar" aria-hidden="true" width="100%" height="10">{svg}</svg>'
    )


def waiting_cell(status: RolloutStatus, record: Mapping[str, Any]) -> str:
    """What a rollout waits for that is not a hold: a window, a freeze, its
    alerts, or approval (the rules and approvals still missing)."""
    if status.phase == "pending" and status.reason == "unverified":
        wants = [w for w in status.message.removeprefix("not verified: ").split("; ") if w]
        items = "".join(f"<li>{escape(w)}</li>" for w in wants)
        return f'approval<ul class="wants">{items}</ul>'
    waiting = record.get("waiting")
    if not waiting:
        return "—"
    words = waiting["reason"]
    if waiting.get("until"):
        words += f" until {when(waiting['until'])}"
    alerts = ", ".join(a.get("alertname", "") for a in waiting.get("alerts", ()))
    return escape(words + (f": {alerts}" if alerts else ""))


def rollout_row(status: RolloutStatus) -> str:
    """One row of the rollouts table."""
    record = to_record(status, inline_nodes=False)
    name = escape(status.name)
    link = f'<a href="?rollout={quote(status.name)}">{name}</a>'
    hold = record["hold"]
    hold_html = (
        f"{state_badge(hold['reason'])}"
        f'<span class="visually-hidden"> {escape(hold["message"])}</span>'
        if hold
        else "—"
    )
    frozen = record["frozen"]
    updated = format_time(status.transitions[-1].time) if status.transitions else None
    cells = (
        cell("Rollout", link),
        cell("Phase", phase_badge(status.phase)),
        cell("Mode", mode_of(frozen)),
        cell("Progress", progress_cell(record["progress"], status)),
        cell("Hold", hold_html),
        cell("Waiting", waiting_cell(status, record)),
        cell("Target", escape(target_words(frozen["target"] if frozen else None))),
        cell("Updated", when(updated)),
    )
    return f'<tr data-rollout="{name}">{"".join(cells)}</tr>'


def rollouts_section(rows: Iterable[str]) -> str:
    body = "".join(rows)
    heads = "".join(f'<th scope="col">{c}</th>' for c in ROLLOUT_COLUMNS)
    empty = "" if body else '<p id="no-rollouts">No rollout has a status yet.</p>'
    return (
        '<section id="rollouts" aria-labelledby="rollouts-title" tabindex="-1">'
        '<h2 id="rollouts-title">Rollouts</h2><div class="scroll"><table id="rollout-table">'
        '<caption class="visually-hidden">Every rollout with a status, by name</caption>'
        f"<thead><tr>{heads}</tr></thead><tbody>{body}</tbody></table></div>{empty}</section>"
    )


def fleet_section(fleet: Mapping[str, Any] | None) -> str:
    """The fleet's counts, and its nodes that are not ok."""
    if not fleet or fleet.get("nodes") is None:
        counts = "No fleet status yet (the daemon writes it after its first sweep)."
        rows: list[str] = []
    else:
        counts = ", ".join(f"{n} {s}" for s, n in (fleet.get("counts") or {}).items())
        rows = [_fleet_row(n) for n in fleet["nodes"] if n["state"] != "ok"]
    heads = "".join(
        f'<th scope="col">{c}</th>' for c in ("Node", "State", "Since", "Runs", "Should run")
    )
    table = (
        '<div class="scroll"><table id="fleet-table"><caption>Nodes that are offline, drifted '
        f"or unverified</caption><thead><tr>{heads}</tr></thead><tbody>{''.join(rows)}"
        "</tbody></table></div>"
        if rows
        else ""
    )
    return (
        '<section id="fleet" aria-labelledby="fleet-title"><h2 id="fleet-title">Fleet</h2>'
        f'<p id="fleet-counts">{escape(counts)}</p>{table}</section>'
    )


def _fleet_row(node: Mapping[str, Any]) -> str:
    def runs(r: Mapping[str, Any]) -> str:
        if not r.get("provider"):
            return f"{r['type']}: (not reported)"
        return f"{r['type']}: {r['provider']}/{r['model']}/{r['profile']}"

    def should(r: Mapping[str, Any]) -> str:
        d = r.get("desired")
        if not d:
            return f"{r['type']}: —"
        return f"{r['type']}: {d['provider']}/{d['model']}/{d['profile']} ({d['rollout']})"

    runtimes = node.get("runtimes") or []
    name = escape(node["name"])
    return (
        f'<tr data-node="{name}">{cell("Node", name)}{cell("State", state_badge(node["state"]))}'
        f"{cell('Since', when(node.get('since')))}"
        f"{cell('Runs', escape('; '.join(runs(r) for r in runtimes) or '—'))}"
        f"{cell('Should run', escape('; '.join(should(r) for r in runtimes) or '—'))}</tr>"
    )


def render_page(
    *,
    commit: str | None,
    rows: Iterable[str],
    fleet: Mapping[str, Any] | None,
    selected: RolloutStatus | None = None,
    selected_name: str | None = None,
    node_limit: int = 500,
) -> str:
    """The whole page: the rollouts, the one ``selected`` (or a line saying
    ``selected_name`` has no status), the fleet, and the status commit."""
    if selected is not None:
        detail = rollout_section(selected, node_limit)
    elif selected_name:
        detail = (
            '<section id="detail" tabindex="-1"><h2 id="detail-title">No such rollout</h2>'
            f"<p>No rollout named {escape(selected_name)} has a status.</p></section>"
        )
    else:
        detail = ""
    shown = escape(commit) if commit else "none yet"
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>reconciler: rollouts</title>"
        '<link rel="stylesheet" href="/page.css"><script src="/page.js" defer></script>'
        '</head><body><a class="skip" href="#rollouts">Skip to the rollouts</a>'
        '<header><h1>reconciler</h1><p id="live" role="status">'
        f"As of status commit {shown[:12]}; live updates need JavaScript.</p>"
        '<p class="note">Read only: to act, commit a change (each hold shows the command).</p>'
        f'</header><main id="main">{rollouts_section(rows)}{detail}{fleet_section(fleet)}'
        f'</main><footer><p id="commit">Status commit: {shown}</p></footer></body></html>\n'
    )


__all__ = [
    "ROLLOUT_COLUMNS",
    "fleet_section",
    "render_page",
    "rollout_row",
    "rollouts_section",
    "target_words",
    "when",
]
