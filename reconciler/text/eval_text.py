"""The evals of a rollout's nodes for people (``status NAME``): each
node's suites with how many cases held, then every case with the node's
answer, cut to a line. Nodes whose evals did not all hold come first, and
only the first few nodes are shown in full, so a fleet of thousands does
not bury the rest of the page. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from reconciler.spec.rollout_status import NodeRecord

NODES_SHOWN = 10
ANSWER_WIDTH = 60


def eval_lines(nodes: Sequence[NodeRecord], shown: int = NODES_SHOWN) -> list[str]:
    """``gpu-1 golden: 3 of 4 cases held (75%), suite 3f2a9c1e`` and a line
    per case; empty when no node ran evals."""
    ran = [n for n in nodes if n.evals]
    ran.sort(key=lambda n: all(r["passed"] == r["total"] for r in n.evals or ()))
    out: list[str] = []
    for node in ran[:shown]:
        for result in node.evals or ():
            out.append(
                f"{node.name} {result['name']}: {result['passed']} of {result['total']} cases "
                f"held ({result['passRate']:g}%), suite {str(result['suiteSha256'])[:8]}"
            )
            for case in result["cases"]:
                mark = "held" if case["ok"] else "FAILED"
                answer = " ".join(str(case["answer"]).split())
                if len(answer) > ANSWER_WIDTH:
                    answer = answer[: ANSWER_WIDTH - 3] + "..."
                why = f" ({case['detail']})" if case["detail"] and not case["ok"] else ""
                out.append(f"  {case['name']}  {mark}  {answer!r}{why}")
    if len(ran) > shown:
        out.append(f"... and {len(ran) - shown} more node(s) with evals (status -o json shows all)")
    return out
