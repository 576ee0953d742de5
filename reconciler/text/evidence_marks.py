"""The dashboard's marks on evidence (docs/trust.md): nodes without
``spec.agentKey`` give "unsigned evidence" (their answers are believed as
in version 1, unchecked), and agents reached over plain ``http://``.

Each mark appears once the fleet has started to use what it marks the
absence of: "unsigned evidence" once at least one node has an
``agentKey``, "plain http" once at least one node's agent is ``https://``.
A repository written for version 1 (no keys, no TLS) gets no section at
all, so its dashboard stays as it was (such a repository behaves exactly
as before).

Deterministic: the text depends only on the nodes given. Must not read
Git, files or the clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reconciler.spec.model import Node

UNSIGNED = "unsigned evidence"
PLAIN_HTTP = "plain http"
_TABLE_LIMIT = 200  # rows, as the fleet section's table of nodes not ok


@dataclass(frozen=True)
class EvidenceMarks:
    """The marks of each marked node, in name order; a mark whose rule is
    not in force (nobody uses keys, or nobody TLS) marks nobody."""

    total: int
    marked: tuple[tuple[str, tuple[str, ...]], ...]  # (node name, its marks)

    def count(self, mark: str) -> int:
        return sum(1 for _, marks in self.marked if mark in marks)


def evidence_marks(nodes: Sequence[Node]) -> EvidenceMarks:
    keys_in_use = any(n.agent_key is not None for n in nodes)
    tls_in_use = any(_https(n) for n in nodes)
    marked = []
    if keys_in_use or tls_in_use:
        for node in sorted(nodes, key=lambda n: n.name):
            marks: tuple[str, ...] = (UNSIGNED,) if keys_in_use and node.agent_key is None else ()
            if tls_in_use and not _https(node):
                marks += (PLAIN_HTTP,)
            if marks:
                marked.append((node.name, marks))
    return EvidenceMarks(len(nodes), tuple(marked))


def _https(node: Node) -> bool:
    return node.agent[:8].lower() == "https://"


def evidence_dashboard_section(nodes: Sequence[Node]) -> str:
    """The dashboard's ``## Evidence`` section: a count per mark and a table
    of the marked nodes; "" when no node is marked."""
    return _section(evidence_marks(nodes))


def _section(found: EvidenceMarks) -> str:
    if not found.marked:
        return ""
    out = ["## Evidence", ""]
    unsigned, plain = found.count(UNSIGNED), found.count(PLAIN_HTTP)
    if unsigned:
        out.append(
            f"{unsigned} of {found.total} nodes give {UNSIGNED}: without "
            "`spec.agentKey` their answers are believed unchecked."
        )
    if plain:
        out.append(
            f"{plain} of {found.total} nodes are reached over plain "
            "`http://`, without a pinned certificate."
        )
    out += ["", "| node | marks |", "|---|---|"]
    for name, marks in found.marked[:_TABLE_LIMIT]:
        out.append(f"| `{name}` | {' · '.join(marks)} |")
    if len(found.marked) > _TABLE_LIMIT:
        out.append(f"\n... and {len(found.marked) - _TABLE_LIMIT} more")
    out.append("")
    return "\n".join(out)


__all__ = [
    "PLAIN_HTTP",
    "UNSIGNED",
    "EvidenceMarks",
    "evidence_dashboard_section",
    "evidence_marks",
]
