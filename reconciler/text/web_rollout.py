"""One rollout on the web page (docs/web.md): its facts, the hold and what
to do, its batches in their real state, its nodes (state, soak, checks,
staging and switch times, evals, signer, standby) and the plots of its
comparisons and out-of-service times.

Node records are rendered from their plain data, as the API serves them,
so a field a newer daemon writes (``evals``, ``signature``, ``standby``)
shows as soon as it is recorded; sections with nothing to show are left out.
Pure: status values in, HTML text out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape
from typing import Any

from reconciler.spec.rollout_status import RolloutStatus, to_record
from reconciler.spec.times import parse_time
from reconciler.text.web_numbers import percent, rounded, seconds, signed_percent, time_of_day
from reconciler.text.web_plots import comparison_plot, out_of_service_plot

NODE_COLUMNS = (
    "Node", "Batch", "State", "Attempt", "Error", "Checks", "Evidence", "Staging and switch",
    "Out of service",
)  # fmt: skip

# A command a hold message offers: "...; to WHY: reconciler VERB ...".
_OFFERED = re.compile(r"(?:^|; |, then )(?:to )?([^;:(]*?): (reconciler [^;(]+?)(?=\s*\(|; |$)")

# What to do about a hold whose message offers no command (an older status).
_FALLBACK = {
    "operator_paused": ("to carry on", "reconciler resume {name} --push"),
}


def cell(label: str, html: str) -> str:
    return f'<td data-label="{label}">{html}</td>'


def state_badge(state: str) -> str:
    s = escape(state)
    return f'<span class="state state-{s}">{s}</span>'


def phase_badge(phase: str) -> str:
    p = escape(phase)
    return f'<span class="phase phase-{p}">{p}</span>'


def mode_of(frozen: Mapping[str, Any] | None) -> str:
    if not frozen:
        return "—"
    return (
        '<span class="mode mode-live">live</span>'
        if frozen.get("live")
        else ('<span class="mode mode-dry">dry run</span>')
    )


def hold_commands(name: str, hold: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(command, why) for each command the hold's own message offers, in
    its order: resume, skip, the rollback of a failed live node, abort."""
    found = [(cmd.strip(), why.strip()) for why, cmd in _OFFERED.findall(hold["message"])]
    if not found and hold["reason"] in _FALLBACK:
        why, command = _FALLBACK[hold["reason"]]
        found = [(command.format(name=name), why)]
    return found


def _facts(status: RolloutStatus, record: Mapping[str, Any]) -> str:
    frozen = record["frozen"]
    hold = record["hold"]
    # A hold's reason is its message's first clause; the commands follow in the hold box.
    why = (
        f"{hold['reason']}: {hold['message'].split('; ')[0]}"
        if hold
        else (status.message or status.reason or "—")
    )
    spec_commit = escape((status.spec_commit or "—")[:12])
    facts = [
        ("Phase", phase_badge(status.phase)),
        ("Why", escape(why)),
        ("Target", escape(_target(frozen))),
        ("Mode", mode_of(frozen)),
        ("On failure", escape(frozen["onFailure"]) if frozen else "—"),
        ("Spec commit", f"<code>{spec_commit}</code>"),
        ("Started", _when(record["startedAt"])),
        ("Finished", _when(record["finishedAt"])),
    ]
    return "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)


def _target(frozen: Mapping[str, Any] | None) -> str:
    if not frozen:
        return "—"
    t = frozen["target"]
    return f"{t['runtime']}: {t['provider']}/{t['model']}/{t['profile']}"


def _when(text: str | None) -> str:
    return text.replace("T", " ").replace("Z", " UTC") if text else "—"


def _hold(name: str, hold: Mapping[str, Any] | None) -> str:
    if not hold:
        return ""
    items = "".join(
        f"<li><code>{escape(cmd)}</code> — {escape(why)}</li>"
        for cmd, why in hold_commands(name, hold)
    )
    return (
        f'<div id="hold"><h3>Hold</h3><p id="hold-message">{state_badge(hold["reason"])} '
        f'{escape(hold["message"])}</p><h4>What to do</h4><ul id="hold-actions">{items}</ul></div>'
    )


def _batches(record: Mapping[str, Any]) -> str:
    items = (
        "".join(
            f'<li class="batch-{escape(b["state"])}">batch {b["index"]}: {escape(b["state"])}</li>'
            for b in record["batches"]
        )
        or "<li>no batches yet</li>"
    )
    return f'<h3>Batches</h3><ol id="batches" class="batches">{items}</ol>'


def _soaking(node: Mapping[str, Any], frozen: Mapping[str, Any] | None) -> str:
    """``soaking, judged at 14:03:07`` and the comparisons still pending,
    for a live node sent and waiting for its health verdict."""
    health = (frozen or {}).get("health")
    if node["state"] != "dispatched" or not health or not (frozen or {}).get("live"):
        return ""
    deadline = node.get("deadline")
    judged = time_of_day(parse_time(deadline)) if deadline else "—"
    decided = {c["name"] for c in node.get("checks", ())}
    pending = [c["name"] for c in health.get("compare", ()) if c.get("name") not in decided]
    text = f"soaking, judged at {judged}"
    if pending:
        text += "; pending: " + ", ".join(pending)
    return f'<div class="soak">{escape(text)}</div>'


def _check_words(check: Mapping[str, Any]) -> str:
    ok = "ok" if check.get("ok") else "failed"
    return f'<li class="check-{ok}">{escape(check_text(check))}</li>'


def check_text(check: Mapping[str, Any]) -> str:
    """A check in words, a comparison's numbers rounded: ``p95: failed —
    canary median 412 (30 samples), baseline 250 (90), change +64.8%, p 0.00123``."""
    ok = "ok" if check.get("ok") else "failed"
    text = f"{check['name']}: {ok}"
    if check.get("detail"):
        text += f" — {check['detail']}"
    canary, baseline = check.get("canary"), check.get("baseline")
    if isinstance(canary, Mapping) and isinstance(baseline, Mapping):
        kind = "rate" if "rate" in canary else "median"
        show = percent if kind == "rate" else rounded
        text += (
            f" (canary {kind} {show(canary.get(kind))}, {canary.get('samples', 0)} samples; "
            f"baseline {show(baseline.get(kind))}, {baseline.get('samples', 0)} samples"
        )
        change = check.get("change")
        if change is not None:
            text += f"; change {signed_percent(change)}"
        if check.get("pValue") is not None:
            text += f"; p {rounded(check['pValue'])}"
        text += ")"
    return text


def _staging(node: Mapping[str, Any]) -> str:
    """The node's stage job and its switch: drain and warm-up times."""
    parts = []
    stage = node.get("stage")
    if stage:
        parts.append(
            f"stage {stage['state']}" + (f" ({stage['error']})" if stage.get("error") else "")
        )
    timings = node.get("timings") or {}
    for label, start, end in (
        ("drain", "drainStartedAt", "drainedAt"),
        ("warm-up", "activatedAt", "warmedAt"),
    ):
        took = _between(timings.get(start), timings.get(end))
        if took is not None:
            parts.append(f"{label} {seconds(took)}")
    return escape("; ".join(parts)) if parts else "—"


def _between(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    begun: datetime = parse_time(start)
    return (parse_time(end) - begun).total_seconds()


def _node_row(node: Mapping[str, Any], held: set[str], frozen: Mapping[str, Any] | None) -> str:
    name = escape(node["name"])
    checks = node.get("checks") or []
    check_html = (
        f'<ul class="checks">{"".join(_check_words(c) for c in checks)}</ul>' if checks else "—"
    )
    if node.get("evidence"):
        evidence = '<span class="mark mark-signed">signed</span>'
    elif node.get("verdict"):
        evidence = '<span class="mark mark-unsigned">unsigned</span>'
    else:
        evidence = "—"
    oos = node.get("outOfService")
    cells = (
        cell("Node", name + (" (held)" if node["name"] in held else "")),
        cell("Batch", str(node["batch"])),
        cell("State", state_badge(node["state"]) + _soaking(node, frozen)),
        cell("Attempt", str(node["attempt"])),
        cell("Error", escape(node.get("error") or "—")),
        cell("Checks", check_html),
        cell("Evidence", evidence),
        cell("Staging and switch", _staging(node)),
        cell("Out of service", seconds(oos) if oos is not None else "—"),
    )
    return f'<tr data-node="{name}">{"".join(cells)}</tr>'


def _comparisons(nodes: Sequence[Mapping[str, Any]]) -> str:
    body = "".join(
        f'<figure data-node="{escape(n["name"])}">{comparison_plot(c)}'
        f"<figcaption>{escape(n['name'])}: {escape(check_text(c))}</figcaption></figure>"
        for n in nodes
        for c in n.get("checks", ())
        if isinstance(c.get("canary"), Mapping)
    )
    if not body:
        return ""
    return (
        f'<section id="comparisons"><h3>Comparisons</h3><div class="plots">{body}</div></section>'
    )


def _out_of_service(nodes: Sequence[Mapping[str, Any]]) -> str:
    by_batch: dict[int, list[tuple[str, float]]] = {}
    for n in nodes:
        if n.get("outOfService") is not None:
            by_batch.setdefault(n["batch"], []).append((n["name"], float(n["outOfService"])))
    plot = out_of_service_plot(by_batch)
    return f'<section id="out-of-service"><h3>Out of service</h3>{plot}</section>' if plot else ""


def eval_section(status_record: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> str:
    """A table per eval of each node that ran one: case, expected, the
    canary's answer, the baseline's, and whether it held."""
    expected = {
        (e.get("name"), c.get("name")): c.get("expect", c.get("expected", ""))
        for e in (status_record["frozen"] or {}).get("evals", ())
        for c in e.get("cases", ())
    }
    baseline = status_record.get("evalBaseline") or {}
    tables = []
    for n in nodes:
        for e in n.get("evals") or ():
            answers = (baseline.get(e.get("name")) or {}).get("answers") or {}
            rows = "".join(
                f'<tr class="check-{"ok" if c.get("ok") else "failed"}">'
                f"{cell('Case', escape(str(c.get('name', ''))))}"
                f"{cell('Expected', escape(str(expected.get((e.get('name'), c.get('name')), '—'))))}"
                f"{cell('Canary', escape(str(c.get('answer', '—'))))}"
                f"{cell('Baseline', escape(str(answers.get(c.get('name'), '—'))))}"
                f"{cell('Held', 'yes' if c.get('ok') else 'no')}</tr>"
                for c in e.get("cases", ())
            )
            asked = (baseline.get(e.get("name")) or {}).get("node")
            caption = (
                f"{n['name']}: {e.get('name')} — {e.get('passed')} of {e.get('total')} held "
                f"({_share(e.get('passRate'))})" + (f"; baseline from {asked}" if asked else "")
            )
            tables.append(
                f'<table class="eval" data-node="{escape(n["name"])}"><caption>{escape(caption)}'
                '</caption><thead><tr><th scope="col">Case</th><th scope="col">Expected</th>'
                '<th scope="col">Canary\'s answer</th><th scope="col">Baseline\'s answer</th>'
                f'<th scope="col">Held</th></tr></thead><tbody>{rows}</tbody></table>'
            )
    if not tables:
        return ""
    return (
        f'<section id="evals"><h3>Evals</h3><div class="scroll">{"".join(tables)}</div></section>'
    )


def _share(rate: Any) -> str:
    """An eval's ``passRate``, which its record keeps in percent."""
    return percent(rate / 100) if isinstance(rate, int | float) else "—"


def model_facts_section(nodes: Sequence[Mapping[str, Any]]) -> str:
    """Who signed each node's model, and its standby slot, when recorded."""
    rows = []
    for n in nodes:
        signature, standby = n.get("signature"), n.get("standby")
        if not signature and not standby:
            continue
        signed = (
            f"{signature.get('signer', '—')} (sha256 {str(signature.get('sha256', ''))[:12]})"
            if signature
            else "—"
        )
        slot = "—"
        if standby:
            slot = f"slot {standby.get('slot', '—')}"
            if standby.get("releasedAt"):
                slot += f", released {_when(standby['releasedAt'])}"
            elif standby.get("releaseError"):
                slot += f": {standby['releaseError']}"
            else:
                slot += ", release sent" if standby.get("releaseJobId") else ", kept warm"
            if standby.get("releaseJobId"):
                slot += f" (job {standby['releaseJobId']})"
        rows.append(
            f'<tr data-node="{escape(n["name"])}">{cell("Node", escape(n["name"]))}'
            f"{cell('Signed by', escape(signed))}{cell('Standby', escape(slot))}</tr>"
        )
    if not rows:
        return ""
    return (
        '<section id="model-facts"><h3>Signer and standby</h3><div class="scroll"><table>'
        '<thead><tr><th scope="col">Node</th><th scope="col">Signed by</th>'
        f'<th scope="col">Standby</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
        "</div></section>"
    )


def rollout_section(status: RolloutStatus, limit: int) -> str:
    """The rollout in full: facts, hold, batches, nodes (the first
    ``limit``), then the plots and the node sections that have content."""
    record = to_record(status)
    nodes = record["nodes"][:limit]
    frozen = record["frozen"]
    name = escape(status.name)
    held = set((record["hold"] or {}).get("nodes", ()))
    heads = "".join(f'<th scope="col">{c}</th>' for c in NODE_COLUMNS)
    rows = "".join(_node_row(n, held, frozen) for n in nodes)
    total = len(record["nodes"])
    more = (
        f'<p id="more-nodes">Showing the first {len(nodes)} of {total} nodes (the API pages '
        "them: ?offset=&amp;limit=).</p>"
        if total > len(nodes)
        else ""
    )
    return (
        '<section id="detail" aria-labelledby="detail-title" tabindex="-1">'
        f'<h2 id="detail-title">Rollout {name}</h2>'
        '<p><a href="./" id="back">Back to every rollout</a></p>'
        f'<dl id="facts">{_facts(status, record)}</dl>{_hold(status.name, record["hold"])}'
        f"{_batches(record)}{_out_of_service(nodes)}"
        '<h3>Nodes</h3><div class="scroll"><table id="node-table">'
        '<caption class="visually-hidden">The rollout\'s nodes in their frozen order</caption>'
        f"<thead><tr>{heads}</tr></thead><tbody>{rows}</tbody></table></div>{more}"
        f"{_comparisons(nodes)}{eval_section(record, nodes)}{model_facts_section(nodes)}</section>"
    )


__all__ = [
    "NODE_COLUMNS",
    "cell",
    "check_text",
    "eval_section",
    "hold_commands",
    "mode_of",
    "model_facts_section",
    "phase_badge",
    "rollout_section",
    "state_badge",
]
