"""An ``eval`` job on the node (docs/evals.md): the runtime, as it serves
now, answers the ``matchesBaseline`` cases of the job's evals, and the
answers go in the signed job record, from which the daemon records the
rollout's baseline. Nothing on the node changes: no config is written, no
backup taken, no command run, no drain.

A job that did not get an answer to every such case fails, naming each
case and why, so the rollout holds before any node is applied to.
"""

from __future__ import annotations

from collections.abc import Sequence

from reconciler.node.eval_runs import EvalResult, run_baseline
from reconciler.node.journal import Journal
from reconciler.node.state_dir import JobRecord
from reconciler.spec.times import format_time

FAILED = "eval_baseline_failed"


def run_eval_job(journal: Journal, record: JobRecord) -> JobRecord:
    """Run an accepted eval job and record its outcome."""
    results = run_baseline(record.job.evals)
    records = [r.record() for r in results]
    problem = missing(results)
    if problem:
        return journal.failed(record, error=f"{FAILED}: {problem}", evals=records)
    return journal.update(
        record,
        state="succeeded",
        detail=f"{sum(r.total for r in results)} baseline answers; nothing was changed",
        finished_at=format_time(journal.clock()),
        evals=records,
    )


def missing(results: Sequence[EvalResult]) -> str:
    """Each case without an answer, and why ("" when every case answered)."""
    said = []
    for result in results:
        for case in result.cases:
            if not case.ok:
                said.append(f"{result.name} case {case.name}: {case.detail}")
        if len(result.cases) < result.total or result.timed_out:
            said.append(f"{result.name}: the suite ran past its timeout")
    return "; ".join(said)
