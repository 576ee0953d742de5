"""The dashboard's view of evals (docs/evals.md): for each active rollout,
a table of the cases its nodes ran, failed ones first: case, expected, the
node's answer, the baseline's answer and whether it held; and each eval's
baseline node and where its eval job stands. Answers are the runtime's
text: they go through ``markdown.text``, clipped to a cell.

Deterministic and pure like the dashboard: statuses in, lines out.
"""

from __future__ import annotations

from collections.abc import Iterable

from reconciler.spec.baseline_records import first_nodes
from reconciler.spec.rollout_status import RolloutStatus
from reconciler.text import markdown
from reconciler.text.eval_text import baseline_answers

NODES_SHOWN = 5  # nodes with evals listed per rollout; failed ones first
CELL = 60  # characters of an answer in a cell

_HEAD = (
    "| Rollout | Node | Eval | Case | Expected | Node's answer | Baseline's answer | Held |",
    "|---|---|---|---|---|---|---|---|",
)


def eval_section(active: Iterable[RolloutStatus]) -> list[str]:
    """``## Evals``: the baselines and the table; nothing when no active
    rollout has a baseline or a node that ran evals."""
    lines: list[str] = []
    rows: list[str] = []
    for status in active:
        name = markdown.text(status.name)
        for eval_name, job in first_nodes(status.eval_baseline).items():
            error = f": {_cell(job.error)}" if job.error else ""
            lines.append(
                f"- **{name}** `{eval_name}` baseline from {markdown.text(job.node)}: "
                f"{job.state} (attempt {job.attempt}){error}"
            )
        rows += _rows(status, name)
    if not lines and not rows:
        return []
    out = ["", "## Evals", ""]
    out += [*lines, ""] if lines else []
    return out + ([*_HEAD, *rows] if rows else [])


def _rows(status: RolloutStatus, name: str) -> list[str]:
    expected = {
        (e.name, c.name): f"{c.expect_kind} {c.expect_json}"
        for e in (status.frozen.evals if status.frozen is not None else ())
        if e.suite is not None
        for c in e.suite.cases
    }
    baseline = baseline_answers(status.eval_baseline)
    ran = [n for n in status.nodes if n.evals]
    ran.sort(key=lambda n: all(r["passed"] == r["total"] for r in n.evals or ()))
    rows = []
    for node in ran[:NODES_SHOWN]:
        for result in node.evals or ():
            for case in result["cases"]:
                given = baseline.get(result["name"], {}).get(case["name"])
                cells = (
                    name,
                    markdown.text(node.name),
                    markdown.text(str(result["name"])),
                    markdown.text(str(case["name"])),
                    _cell(expected.get((result["name"], case["name"]), "")),
                    _cell(str(case["answer"])),
                    "—" if given is None else _cell(given),
                    "yes" if case["ok"] else "**no**",
                )
                rows.append("| " + " | ".join(cells) + " |")
    return rows


def _cell(value: str) -> str:
    return markdown.text(markdown.clip(value, CELL))
