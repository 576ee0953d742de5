"""The evals of a rollout's nodes for people (``status NAME``): each
node's suites with how many cases held, then every case with the node's
answer, cut to a line. Nodes whose evals did not all hold come first, and
only the first few nodes are shown in full, so a fleet of thousands does
not bury the rest of the page. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from reconciler.spec.baseline_records import BaselineJob, first_nodes
from reconciler.spec.rollout_status import NodeRecord

NODES_SHOWN = 10
ANSWER_WIDTH = 60


def eval_lines(
    nodes: Sequence[NodeRecord],
    shown: int = NODES_SHOWN,
    baseline: Mapping[str, Mapping[str, str]] | None = None,
) -> list[str]:
    """``gpu-1 golden: 3 of 4 cases held (75%), suite 3f2a9c1e`` and a line
    per case (with the baseline's answer, for a case that has one in
    ``baseline``: eval -> case -> answer); empty when no node ran evals."""
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
                answer = _line(case["answer"])
                why = f" ({case['detail']})" if case["detail"] and not case["ok"] else ""
                given = (baseline or {}).get(result["name"], {}).get(case["name"])
                against = f"  baseline {_line(given)!r}" if given is not None else ""
                out.append(f"  {case['name']}  {mark}  {answer!r}{why}{against}")
    if len(ran) > shown:
        out.append(f"... and {len(ran) - shown} more node(s) with evals (status -o json shows all)")
    return out


def _line(text: object) -> str:
    """An answer on one line, cut to ``ANSWER_WIDTH``."""
    answer = " ".join(str(text).split())
    return answer if len(answer) <= ANSWER_WIDTH else answer[: ANSWER_WIDTH - 3] + "..."


def baseline_answers(jobs: Sequence[BaselineJob]) -> dict[str, dict[str, str]]:
    """Eval -> case -> the recorded baseline answer."""
    return {
        name: dict(cases)
        for name, job in first_nodes(jobs).items()
        if job.state == "recorded" and (cases := job.answers_of(name)) is not None
    }


def baseline_lines(jobs: Sequence[BaselineJob]) -> list[str]:
    """``golden baseline from gpu-3: recorded (eval job eval-1a2b3c4d, attempt 1)``
    and a line per recorded answer; for a job not recorded, where it stands."""
    out: list[str] = []
    for name, job in first_nodes(jobs).items():
        out.append(
            f"{name} baseline from {job.node}: {job.state} "
            f"(eval job {job.job_id[:13]}, attempt {job.attempt})"
            + (f": {job.error}" if job.error else "")
        )
        for case, answer in job.answers_of(name) or ():
            out.append(f"  {case}  {_line(answer)!r}")
    for job in jobs:
        if job.state == "failed" and job not in first_nodes(jobs).values():
            out.append(f"baseline node {job.node}: failed: {job.error}")
    return out
