"""The web page's plots, as inline SVG with no external asset (docs/web.md):
a decided comparison's canary and baseline, each side's median or rate
with its sample count, and each batch's out-of-service times, one dot per
node with the batch's median marked.

Each plot carries its numbers as ``data-`` attributes (the values of the
status file) and in words (``<title>``, labels rounded for people), so a
screen reader and a test read what the picture shows.

Pure: records in, SVG text out.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from reconciler.text.web_numbers import percent, rounded, seconds

WIDTH = 460
ROW = 26
LEFT = 70  # room for a side's name
RIGHT = 110  # room for the value's words


def _attr(value: object) -> str:
    return escape(str(value), quote=True)


def _side_value(side: Mapping[str, Any] | None, kind: str) -> float | None:
    if not isinstance(side, Mapping):
        return None
    value = side.get(kind)
    return float(value) if isinstance(value, int | float) else None


def _spread(side: Mapping[str, Any] | None) -> list[float] | None:
    spread = side.get("spread") if isinstance(side, Mapping) else None
    if isinstance(spread, list) and len(spread) == 4:
        return [float(v) for v in spread]
    return None


def comparison_plot(check: Mapping[str, Any]) -> str:
    """A decided comparison (a check record with ``canary`` and
    ``baseline``): one row per side, its samples as a box (quartiles) and
    whiskers (smallest to largest) when recorded, its median (or rate) as
    a bar and a mark, and the value and sample count in words."""
    canary, baseline = check.get("canary"), check.get("baseline")
    kind = "rate" if isinstance(canary, Mapping) and "rate" in canary else "median"
    sides = [("canary", canary), ("baseline", baseline)]
    values = [_side_value(side, kind) for _, side in sides]
    spreads = [_spread(side) for _, side in sides]
    reach = [abs(v) for v in values if v is not None]
    reach += [abs(s[3]) for s in spreads if s is not None]
    top = max(reach, default=0.0) or 1.0
    span = WIDTH - LEFT - RIGHT
    unit = "steps" if kind == "rate" else "samples"
    name = str(check.get("name", ""))
    words = []
    rows = []
    for i, ((label, side), value, spread) in enumerate(zip(sides, values, spreads, strict=True)):
        samples = side.get("samples", 0) if isinstance(side, Mapping) else 0
        shown = percent(value) if kind == "rate" else rounded(value)
        said = f"{label} {kind} {shown} ({samples} {unit})"
        if spread is not None:
            said += f", from {rounded(spread[0])} to {rounded(spread[3])}"
        words.append(said)
        y = 6 + i * ROW
        length = 0.0 if value is None else span * abs(value) / top
        box = ""
        if spread is not None:
            x0, x1, x3, x4 = (LEFT + span * abs(v) / top for v in spread)
            box = (
                f'<line class="whisker" x1="{x0:.1f}" x2="{x4:.1f}" y1="{y + 9}" y2="{y + 9}"/>'
                f'<rect class="box" x="{x1:.1f}" y="{y + 2}" width="{max(x3 - x1, 1):.1f}" '
                'height="14" rx="1"/>'
            )
        rows.append(
            f'<g class="side side-{label}" data-side="{label}" data-{kind}="{_attr(value)}" '
            f'data-samples="{_attr(samples)}">'
            f'<text x="0" y="{y + 13}">{label}</text>'
            f'<rect class="value" x="{LEFT}" y="{y + 6}" width="{length:.1f}" height="6" rx="2"/>'
            f"{box}"
            f'<line class="median" x1="{LEFT + length:.1f}" x2="{LEFT + length:.1f}" '
            f'y1="{y}" y2="{y + 18}"/>'
            f'<text x="{WIDTH - RIGHT + 6}" y="{y + 13}">{escape(shown)} · n={samples}</text>'
            "</g>"
        )
    verdict = "held" if check.get("ok") else "failed"
    title = f"{name}: {verdict}; " + "; ".join(words)
    height = 6 + 2 * ROW
    return (
        f'<svg class="plot comparison-plot" data-check="{_attr(name)}" data-kind="{kind}" '
        f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
        f'aria-label="{_attr(title)}"><title>{escape(title)}</title>{"".join(rows)}</svg>'
    )


def out_of_service_plot(by_batch: Mapping[int, Sequence[tuple[str, float]]]) -> str:
    """Each batch's out-of-service times: a column per batch, a dot per
    node (its name and time in the dot's title), a bar at the median."""
    batches = sorted(b for b, times in by_batch.items() if times)
    if not batches:
        return ""
    top = max(t for b in batches for _, t in by_batch[b]) or 1.0
    column = max(18, min(60, (WIDTH - 50) // len(batches)))
    plot_height = 120
    width = 50 + column * len(batches)
    parts = [
        f'<text x="0" y="12">{escape(seconds(top))}</text>',
        f'<text x="0" y="{plot_height + 4}">0 s</text>',
        f'<line class="axis" x1="46" x2="{width}" y1="{plot_height}" y2="{plot_height}"/>',
    ]
    for i, batch in enumerate(batches):
        times = by_batch[batch]
        middle = statistics.median(t for _, t in times)
        x = 50 + i * column + column / 2
        dots = "".join(
            f'<circle cx="{x:.1f}" cy="{plot_height - (plot_height - 8) * t / top:.1f}" r="3" '
            f'data-node="{_attr(node)}" data-seconds="{_attr(t)}">'
            f"<title>{escape(node)}: {escape(seconds(t))}</title></circle>"
            for node, t in times
        )
        y = plot_height - (plot_height - 8) * middle / top
        parts.append(
            f'<g class="batch-times" data-batch="{batch}" data-median="{_attr(middle)}">{dots}'
            f'<line class="median" x1="{x - column / 3:.1f}" x2="{x + column / 3:.1f}" '
            f'y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text x="{x:.1f}" y="{plot_height + 16}" text-anchor="middle">{batch}</text></g>'
        )
    title = "Out of service by batch: " + "; ".join(
        f"batch {b} median {seconds(statistics.median(t for _, t in by_batch[b]))}" for b in batches
    )
    height = plot_height + 22
    return (
        f'<svg class="plot oos-plot" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{_attr(title)}">'
        f"<title>{escape(title)}</title>{''.join(parts)}</svg>"
    )


__all__ = ["comparison_plot", "out_of_service_plot"]
