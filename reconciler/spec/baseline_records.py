"""Eval baselines in a rollout's status (docs/evals.md): the ``eval`` jobs
that ask nodes still on the old target for the answers of the rollout's
``matchesBaseline`` cases, and the answers recorded.

Two fields of the status file, both absent when the rollout has no
``matchesBaseline`` case, so such a status reads and writes as before:

- ``evalBaselineJobs``: one record per baseline node, the eval job in
  flight or ended (``running``, ``recorded`` or ``failed``);
- ``evalBaseline``: ``{EVAL: {node, jobId, answers: {CASE: text}}}``, the
  answers of each eval's first baseline node, once its job recorded them.
  Later live applies carry these answers as each case's ``baselineAnswer``.

Pure: values and their plain-data forms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from reconciler.spec.times import format_time, parse_time

BASELINE_STATES = ("running", "recorded", "failed")

# eval name -> ((case name, answer), ...)
Answers = tuple[tuple[str, tuple[tuple[str, str], ...]], ...]


@dataclass(frozen=True)
class BaselineJob:
    """One node's eval job. ``evals``: the evals whose baseline it gives,
    in frozen order; ``answers``: those of the evals it is the first
    baseline node of, once recorded."""

    node: str
    job_id: str
    attempt: int
    state: str  # one of BASELINE_STATES
    sent_at: datetime
    deadline: datetime
    evals: tuple[str, ...]
    finished_at: datetime | None = None
    error: str = ""
    answers: Answers = ()

    def answers_of(self, eval_name: str) -> tuple[tuple[str, str], ...] | None:
        return next((cases for name, cases in self.answers if name == eval_name), None)


def first_nodes(jobs: Sequence[BaselineJob]) -> dict[str, BaselineJob]:
    """Eval name -> the job of its first baseline node (the first job naming it)."""
    found: dict[str, BaselineJob] = {}
    for job in jobs:
        for name in job.evals:
            found.setdefault(name, job)
    return found


def baseline_answers(jobs: Sequence[BaselineJob]) -> Answers:
    """The answers later applies carry: each eval's first baseline node's."""
    out = []
    for name, job in first_nodes(jobs).items():
        cases = job.answers_of(name)
        if job.state == "recorded" and cases is not None:
            out.append((name, cases))
    return tuple(out)


def jobs_record(jobs: Sequence[BaselineJob]) -> list[dict[str, Any]]:
    out = []
    for job in jobs:
        record: dict[str, Any] = {
            "node": job.node,
            "jobId": job.job_id,
            "attempt": job.attempt,
            "state": job.state,
            "sentAt": format_time(job.sent_at),
            "deadline": format_time(job.deadline),
            "evals": list(job.evals),
        }
        if job.finished_at is not None:
            record["finishedAt"] = format_time(job.finished_at)
        if job.error:
            record["error"] = job.error
        out.append(record)
    return out


def answers_record(jobs: Sequence[BaselineJob]) -> dict[str, Any]:
    """``evalBaseline``: the recorded answers of each eval's first baseline node."""
    out: dict[str, Any] = {}
    for name, job in first_nodes(jobs).items():
        cases = job.answers_of(name)
        if job.state == "recorded" and cases is not None:
            out[name] = {"node": job.node, "jobId": job.job_id, "answers": dict(cases)}
    return out


def jobs_from(
    jobs: Sequence[Mapping[str, Any]], answers: Mapping[str, Mapping[str, Any]]
) -> tuple[BaselineJob, ...]:
    """The inverse of ``jobs_record`` and ``answers_record``."""
    out = []
    for r in jobs:
        finished = r.get("finishedAt")
        job = BaselineJob(
            node=r["node"],
            job_id=r["jobId"],
            attempt=r["attempt"],
            state=r["state"],
            sent_at=parse_time(r["sentAt"]),
            deadline=parse_time(r["deadline"]),
            evals=tuple(r["evals"]),
            finished_at=None if finished is None else parse_time(finished),
            error=r.get("error", ""),
        )
        kept = tuple(
            (name, tuple(entry["answers"].items()))
            for name, entry in answers.items()
            if entry["jobId"] == job.job_id and name in job.evals
        )
        out.append(replace(job, answers=kept) if kept else job)
    return tuple(out)
