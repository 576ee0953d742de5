"""Eval baselines (docs/evals.md): before the first batch of a live rollout
whose evals hold ``matchesBaseline`` cases, nodes still on the old target
answer those cases, and their answers are recorded; every later apply
carries them. As tables and pure rules.

Theory of operation. ``GATE_RULES`` say what the first batch waits for,
from where the baseline stands: nothing (no such case, or all answers
recorded), eval jobs to send, answers to come, or a person (a baseline job
failed: the rollout holds ``eval_baseline_failed``, and a resume sends each
failed job again as a new attempt). ``OUTCOME_RULES`` judge one eval job in
flight from what the daemon saw, first match wins. Baseline nodes are each
eval's ``baseline.nodeIds``, else its ``baseline.count`` nodes last in
frozen order that the rollout has not applied to. One eval job per node
carries every eval it gives a baseline for.

Values in, values out: must not read the clock, do IO, or know about
status files.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from reconciler.protocol.effects import SendJob
from reconciler.protocol.job_ids import job_id
from reconciler.protocol.observations import NO_EVIDENCE, JobObservation, Observations
from reconciler.spec.baseline_records import Answers, BaselineJob, baseline_answers
from reconciler.spec.durations import format_duration
from reconciler.spec.evals import Eval, uses_baseline
from reconciler.spec.rollout_status import FrozenSpec, NodeRecord

HOLD = "eval_baseline_failed"
MATCHES_BASELINE = "matchesBaseline"
# Node states of a node the rollout has not applied to: still on the old target.
ON_OLD_TARGET = frozenset({"pending", "staging", "staged"})


# -- what the first batch waits for ----------------------------------------------


@dataclass(frozen=True)
class GateRule:
    stands: str  # where the baseline stands (``stands``)
    action: str  # go | send | wait | hold
    says: str  # as docs/evals.md words it


GATE_RULES: tuple[GateRule, ...] = (
    GateRule("not needed", "go", "no matchesBaseline case, or not live: the batch goes"),
    GateRule("not asked", "send", "send an eval job to each baseline node"),
    GateRule("failed", "hold", f"a baseline job failed: hold `{HOLD}`"),
    GateRule("asking", "wait", "an eval job is in flight: the first batch waits"),
    GateRule("recorded", "go", "every baseline answer is recorded: the batch goes"),
)
assert len({r.stands for r in GATE_RULES}) == len(GATE_RULES)


def stands(frozen: FrozenSpec | None, jobs: Sequence[BaselineJob]) -> str:
    """Where a rollout's baseline stands: a ``GateRule.stands``."""
    if frozen is None or not frozen.live or not uses_baseline(frozen.evals):
        return "not needed"
    if not jobs:
        return "not asked"
    if any(j.state == "failed" for j in jobs):
        return "failed"
    if any(j.state == "running" for j in jobs):
        return "asking"
    return "recorded"


def gate(frozen: FrozenSpec | None, jobs: Sequence[BaselineJob]) -> str:
    """The ``GATE_RULES`` action for the baseline as it stands."""
    where = stands(frozen, jobs)
    return next(r.action for r in GATE_RULES if r.stands == where)


# -- which nodes answer ----------------------------------------------------------


def baseline_evals(evals: Sequence[Eval]) -> tuple[Eval, ...]:
    """The evals that hold a matchesBaseline case."""
    return tuple(e for e in evals if uses_baseline((e,)))


def choose(evals: Sequence[Eval], nodes: Sequence[NodeRecord]) -> dict[str, tuple[str, ...]]:
    """Node -> the evals it gives a baseline for, in the order the nodes
    answer (each eval's first baseline node first). Without ``nodeIds``:
    the eval's ``count`` nodes last in frozen order still on the old
    target, in frozen order."""
    chosen: dict[str, list[str]] = {}
    for e in baseline_evals(evals):
        if e.baseline_node_ids:
            picked = list(e.baseline_node_ids)
        else:
            tail = [n.name for n in reversed(nodes) if n.state in ON_OLD_TARGET]
            picked = list(reversed(tail[: e.baseline_count]))
        for name in picked:
            chosen.setdefault(name, []).append(e.name)
    return {name: tuple(names) for name, names in chosen.items()}


def planned_nodes(e: Eval, nodes: Sequence[NodeRecord]) -> tuple[str, ...]:
    """The baseline nodes of one eval, as ``plan`` shows them before start."""
    return tuple(name for name, names in choose((e,), nodes).items() if e.name in names)


# -- sending ---------------------------------------------------------------------


def new_job(
    node: str,
    evals: tuple[str, ...],
    attempt: int,
    *,
    rollout: str,
    start_commit: str,
    now: datetime,
    frozen: FrozenSpec,
    health_timeout: int,
) -> BaselineJob:
    """The record of a baseline eval job sent now: past its deadline (the
    rollout's healthTimeout, plus the timeouts of the suites it runs)
    without an answer, it failed."""
    seconds = health_timeout + sum(e.timeout for e in frozen.evals if e.name in evals)
    return BaselineJob(
        node=node,
        job_id=job_id(rollout, start_commit, node, attempt, "eval"),
        attempt=attempt,
        state="running",
        sent_at=now,
        deadline=now + timedelta(seconds=seconds),
        evals=evals,
    )


def eval_job(rollout: str, frozen: FrozenSpec, start_commit: str, job: BaselineJob) -> SendJob:
    """The eval job of a baseline record, rebuilt from status alone."""
    return SendJob(
        job_id=job.job_id,
        kind="eval",
        node=job.node,
        rollout=rollout,
        attempt=job.attempt,
        mode="live",
        target=frozen.target,
        source_commit=start_commit,
        evals=tuple(e for e in frozen.evals if e.name in job.evals),
    )


def answers_for_applies(jobs: Sequence[BaselineJob]) -> Answers:
    """What every later live apply carries as its cases' ``baselineAnswer``."""
    return baseline_answers(jobs)


# -- judging a job in flight -----------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """What one pass knows about one baseline job."""

    job: JobObservation | None
    in_fleet: bool
    unreachable_for: timedelta | None  # since max(first failed contact, sent)
    health_timeout: timedelta
    past_deadline: bool


@dataclass(frozen=True)
class OutcomeRule:
    code: str  # names the rule in errors
    when: Callable[[Facts], bool]
    state: str  # recorded | failed | running (wait)
    says: str  # as docs/evals.md words it


OUTCOME_RULES: tuple[OutcomeRule, ...] = (
    OutcomeRule(
        "answered",
        lambda f: f.job is not None and f.job.state == "succeeded",
        "recorded",
        "the job succeeded: its answers are recorded (failed if a case gave none)",
    ),
    OutcomeRule(
        "failed",
        lambda f: f.job is not None and f.job.state in ("failed", "refused"),
        "failed",
        "the agent failed or refused the job",
    ),
    OutcomeRule("removed", lambda f: not f.in_fleet, "failed", "the node was removed from nodes/"),
    OutcomeRule(
        "unreachable",
        lambda f: f.unreachable_for is not None and f.unreachable_for >= f.health_timeout,
        "failed",
        "the node's agent was unreachable for healthTimeout",
    ),
    OutcomeRule("deadline", lambda f: f.past_deadline, "failed", "no answer by the job's deadline"),
    OutcomeRule("wait", lambda f: True, "running", "otherwise: wait"),
)


def judge(
    job: BaselineJob,
    frozen: FrozenSpec,
    obs: Observations,
    now: datetime,
    *,
    in_fleet: bool,
    health_timeout: int,
    first_of: Mapping[str, str],
) -> BaselineJob:
    """The record of a running baseline job once this pass's facts are
    judged by ``OUTCOME_RULES`` (the same record while it waits).
    ``first_of``: eval -> its first baseline node, whose answers are kept."""
    seen = obs.jobs.get(job.job_id)
    since = obs.unreachable_since.get(job.node)
    facts = Facts(
        job=seen,
        in_fleet=in_fleet,
        unreachable_for=None if since is None else now - max(since, job.sent_at),
        health_timeout=timedelta(seconds=health_timeout),
        past_deadline=now >= job.deadline,
    )
    rule = next(r for r in OUTCOME_RULES if r.when(facts))
    if rule.state == "running":
        return job
    if rule.state == "recorded":
        assert seen is not None
        answers, missing = read_answers(seen, frozen, job.evals)
        if missing:
            return _failed(job, now, f"{HOLD}: {missing}")
        kept = tuple((name, cases) for name, cases in answers if first_of.get(name) == job.node)
        return replace(job, state="recorded", finished_at=now, answers=kept)
    return _failed(job, now, _why(rule, facts, seen, health_timeout))


def _failed(job: BaselineJob, now: datetime, error: str) -> BaselineJob:
    return replace(job, state="failed", finished_at=now, error=error)


def _why(rule: OutcomeRule, facts: Facts, seen: JobObservation | None, seconds: int) -> str:
    """The error of a failed baseline job, for the hold message."""
    if rule.code == "failed" and seen is not None:
        what = "eval job failed" if seen.state == "failed" else "eval job refused"
        return f"{what}: {seen.error}" if seen.error else what
    if rule.code == "removed":
        return "node removed from nodes/"
    lasted = format_duration(seconds)
    if rule.code == "unreachable":
        if seen is not None and seen.error.startswith(NO_EVIDENCE):
            return f"{seen.error} (for {lasted} or more)"
        return f"agent unreachable for {lasted} or more"
    state = "no answer" if seen is None else f"job still {seen.state}"
    return f"no baseline answers by the job's deadline ({state})"


def read_answers(
    seen: JobObservation, frozen: FrozenSpec, names: Sequence[str]
) -> tuple[Answers, str]:
    """(eval -> case -> answer) of a succeeded eval job for the evals
    ``names``, and what is missing ("" when every matchesBaseline case
    answered)."""
    results = {r.get("name"): r for r in seen.evals or ()}
    out = []
    for e in frozen.evals:
        if e.name not in names or e.suite is None:
            continue
        result = results.get(e.name)
        if result is None:
            return (), f"the job record has no results for eval {e.name}"
        cases = {c.get("name"): c for c in result.get("cases", ())}
        answers = []
        for case in e.suite.cases:
            if case.expect_kind != MATCHES_BASELINE:
                continue
            got = cases.get(case.name)
            if got is None or not got.get("ok") or not isinstance(got.get("answer"), str):
                detail = "not run" if got is None else got.get("detail") or "no answer"
                return (), f"{e.name} case {case.name} gave no baseline answer: {detail}"
            answers.append((case.name, got["answer"]))
        out.append((e.name, tuple(answers)))
    return tuple(out), ""


def render_gate_table() -> str:
    """``GATE_RULES`` and ``OUTCOME_RULES`` as docs/evals.md shows them."""
    lines = ["| the baseline | the first batch |", "|---|---|"]
    lines += [f"| {r.stands} | {r.says} |" for r in GATE_RULES]
    lines += ["", "| an eval job in flight, first match | becomes |", "|---|---|"]
    lines += [f"| {r.says} | {r.state} |" for r in OUTCOME_RULES]
    return "\n".join(lines) + "\n"
