"""An exhaustive bounded model check of the engine: every sequence of
events up to a depth, breadth first, from a fresh rollout over three nodes,
with the engine's promises checked after every pass.

World: one live rollout over nodes n1..n3, batch size 1 or 2, one of the five
failure policies, ``healthTimeout`` 120 s and ``offlineAfter`` 60 s. One
more setup, ``capacity`` (docs/capacity.md), is observe with two values of a
label (n1 and n2 in zone a, n3 in zone b), ``spreadBy: {label: zone,
maxPerBatch: 1}`` and ``failureBudget: 1``. Another, ``staging``
(docs/rollouts.md), is retry_once with one artifact, ``stage: {ahead: 1,
maxConcurrent: 1, timeout: 120s}``: every node is staged before its apply,
and stage jobs are answered like apply jobs. Another, ``baseline``
(docs/evals.md), is pause with one eval whose suite holds a
``matchesBaseline`` case (timeout 1 s, so its eval job's deadline is 121 s
after it is sent): n3 answers an ``eval`` job before the first batch, and
eval jobs are answered like apply jobs (a succeeded one with an answer).
Two more, ``standby`` (rollback,
``standby: {keepPrevious: untilSoaked}``) and ``standby_end`` (pause,
``untilCompleted``) (docs/rollouts.md#warm-standby): a succeeded apply's
answer names slot ``a`` kept warm, and release jobs are answered like apply
jobs. Each transition is one event followed by one reconcile pass through the real
``step_fleet`` with the world's clock:

    observations  a job in flight succeeded, failed, or its answer is unknown
                  (the agent's answer could not be read); a node's heartbeat
                  shows the target (matching), the old model (drifting), or
                  none (missing), a new heartbeat replacing an older one even
                  if it shows the same model; an agent goes unreachable or
                  comes back
    intents       pause, unpause, resume (a new token), skip a node, abort,
                  rollback request for every node
    clock         1 s (before any deadline) or 121 s (past every deadline
                  and past offlineAfter)

Checked at every transition (the invariants of docs/architecture.md):

    gate          no apply to a node of batch k+1 while a node of an earlier
                  batch is unsettled, and none while a restore is in flight
    unknown       a node whose verdict is `unknown` is never retried, stopped
                  or restored by the engine (only a person's resume, skip or
                  rollback request moves it)
    terminal      a terminal phase stays
    attempts      never decrease; a recorded verdict is never rewritten
    payload       one payload per job id: what is sent equals what status
                  rebuilds for that id, before and after the pass
    policy        every hold is the one the policy table gives
    spread        (capacity) no batch holds two nodes of one zone
    staged        (staging) no apply to a node that is not staged; never
                  more than maxConcurrent nodes staging, nor more than
                  one before a node was staged; none staging beyond
                  the current batch (the first not done) plus ahead; the
                  node's stage attempts never decrease; a stage failure
                  holds what the stage table gives
    baseline      (baseline) no apply before every baseline job is recorded,
                  and every apply carries the recorded answers; a failed
                  baseline job holds ``eval_baseline_failed``; baseline
                  attempts never decrease and recorded answers stay
    released      (standby) a release goes only to a node whose apply kept a
                  slot, never while its apply or a restore is in flight
                  or decided, and only when the rule of the interface
                  says (untilSoaked: the node passed, and its operator
                  does not pause the rollout, or the rollout ended;
                  untilCompleted: the rollout ended); after every
                  pass no release so due is left unsent; a release's job
                  id never changes; an answer to a release changes
                  nothing but standby records (no phase, hold or state)
    budget        (capacity) a node that ends failed, timed out or unknown
                  while more than the budget have is held
                  failure_budget_exceeded (unless the same pass ended the
                  rollout, skipped it, or a resume let it carry on), and
                  only nodes with such a verdict are held for it

States are deduplicated by a canonical hash. Unreduced (``reduced=False``):
BLAKE2b of the repr of the state's frozen values (clock, intents, status,
observations). Reduced (the default, ``abstract_key``): BLAKE2b of the
state's abstraction, which merges only states the engine cannot tell apart
now or later; see "Reductions" below. The search is breadth first, so the
first violation found comes with a shortest sequence of events that leads
to it.

Reductions (each loses no behaviour; ``tests/test_engine_model_check.py``
holds them to it: at a small depth the reduced and the unreduced search
reach the same set of abstract states and find the same violations, and
every counterexample the reduced search prints replays, event by event, in
the unreduced world). ``abstract_key`` keeps everything the engine reads
and every invariant reads, and drops or condenses only this:

    history      the status's ``transitions`` and ``conditions``, and the
                 times it only records (when the rollout started or
                 finished, a hold began, a verdict or a rollback request was
                 recorded): the engine writes them and never decides by them
                 (it reads a condition only to keep its own ``since``), and
                 no invariant reads them. Kept as "set" or "unset".
    commits      a commit is named by the intents it carries (the engine
                 only asks whether the next commit is the one it last
                 handled); a job's source commit is only copied into its
                 payload (the payload invariant compares a job's payloads
                 with each other), kept as "set".
    time         the clock and every time the engine compares are replaced
                 by the facts it can see about them. In this world it
                 compares times three ways: ``now >= deadline`` (deadline =
                 dispatch + 120 s, asserted), ``now - max(unreachable
                 since, dispatch) >= 60 s``, and a heartbeat's time after a
                 job's finish. Clock steps are 1 s and 121 s, so two events
                 are under 60 s apart (the 1 s steps of a sequence add up to
                 under 60 s, asserted) or at least 120 s: both tests ask "has
                 a 121 s step come since". So a dispatch or an outage keeps
                 that one fact; a heartbeat keeps whether it is ahead of the
                 clock (sent at this instant: the agent's clock is a second
                 ahead, so it is after any answer at this instant) and
                 whether it is after the node's answer in hand. Every later
                 comparison follows from these facts: a step of either size
                 leaves no heartbeat ahead; a 121 s step passes every
                 deadline; a new event is stamped with the clock.
    heartbeats   one that is neither ahead of the clock nor after a
                 succeeded answer in hand can never count (answers come at
                 the clock or later), so it is as if the node sent none;
                 and an outage's length counts only for a dispatched node
                 (a later dispatch measures from itself).

Not reduced: symmetry. With batch size 2, n1 and n2 share a batch, but the
engine does not treat them alike: when both are held for different reasons
in one pass, the rollout's hold takes the first node's reason in frozen
order (``settle_hold``), and messages list nodes in that order. Merging a
state with its n1/n2 mirror image therefore loses states (the comparison
test found 22 at depth 3: "n1 unknown, n2 timed out" holds as
``health_unknown``, its mirror as ``retry_exhausted``), so the search keeps
node names as they are.

Must not: change the engine. A broken rule is tested by handing the engine a
different policy table for the duration of a check (``injected_rules``).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from reconciler.engine import policy as policy_table
from reconciler.engine import releases as release_table
from reconciler.engine import staging as stage_table
from reconciler.engine.baselines import answers_for_applies
from reconciler.engine.policy import Rule, decide
from reconciler.engine.releases import ReleaseRule, waiting_on_slot
from reconciler.engine.staging import StageRule, stage_failure
from reconciler.engine.staging import decide as decide_stage
from reconciler.engine.step import RolloutInput, Transition, in_flight, step_fleet
from reconciler.protocol.effects import SendJob
from reconciler.protocol.job_ids import job_id as derived_job_id
from reconciler.protocol.observations import Heartbeat, JobObservation, Observations, RuntimeReport
from reconciler.spec.artifacts import Artifact, Stage
from reconciler.spec.evals import Eval, EvalCase, EvalSuite
from reconciler.spec.model import (
    Fleet,
    Node,
    RollbackRequest,
    RolloutSpec,
    Settings,
    SpreadBy,
    Target,
)
from reconciler.spec.rollout_status import TERMINAL_PHASES, NodeRecord, RolloutStatus
from reconciler.spec.times import format_time

POLICIES = ("observe", "pause", "retry_once", "stop", "rollback")
# Setups beyond the policies: name -> the policy it runs under.
CAPACITY = "capacity"
STAGING = "staging"
BASELINE = "baseline"
STANDBY = "standby"
STANDBY_END = "standby_end"
SETUPS = (*POLICIES, CAPACITY, STAGING, BASELINE, STANDBY, STANDBY_END)
KEEP_PREVIOUS = {STANDBY: "untilSoaked", STANDBY_END: "untilCompleted"}
KEPT_SLOT = {"slot": "a", "serving": "b"}  # what a succeeded standby apply answers
ARTIFACT = Artifact("weights", "http://127.0.0.1:8080/w.gguf", "0f" * 32, 1024)
STAGE = Stage(ahead=1, max_concurrent=1, timeout_seconds=120)
BATCH_SIZES = (1, 2)
GOLDEN = Eval(
    "golden",
    "golden",
    "http://127.0.0.1:8080",
    timeout=1,
    suite=EvalSuite(
        "golden", "ab" * 32, (EvalCase("same", "matchesBaseline", "true", prompt="Hi"),)
    ),
)
BASELINE_ANSWER = "Hello from the old model"
ZONES = {"n1": "a", "n2": "a", "n3": "b"}
BUDGET = 1
COUNTED = ("failed", "timed_out", "unknown")
NODES = ("n1", "n2", "n3")
T0 = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC)
TARGET = Target(runtime="hermes", provider="ollama", model="llama3.1-8b", profile="default")
OLD_MODEL = "llama3-8b"
HEALTH_TIMEOUT = 120
OFFLINE_AFTER = 60
CLOCK_STEPS = {"1s": 1, "121s": HEALTH_TIMEOUT + 1}
ROLLOUT = "r"
# the daemon waits on the agent
WAITING = ("dispatched", "staging", "rollback_pending", "restoring")
FINAL = ("succeeded", "skipped")
FLEET = Fleet(
    tuple(Node(name=n, agent=f"http://127.0.0.1:{8711 + i}") for i, n in enumerate(NODES))
)
ZONED_FLEET = Fleet(
    tuple(replace(node, labels=(("zone", ZONES[node.name]),)) for node in FLEET.nodes)
)
SETTINGS = Settings(offline_after=OFFLINE_AFTER)


def policy_of(setup: str) -> str:
    """The failure policy a setup runs under."""
    return {
        CAPACITY: "observe",
        STAGING: "retry_once",
        BASELINE: "pause",
        STANDBY: "rollback",
        STANDBY_END: "pause",
    }.get(setup, setup)


@dataclass(frozen=True)
class Intents:
    paused: bool = False
    abort: bool = False
    resumes: int = 0
    skip: tuple[str, ...] = ()
    rollback: bool = False


@dataclass(frozen=True)
class State:
    """Everything the next pass depends on, as frozen values."""

    clock: int  # seconds after T0
    intents: Intents
    status: RolloutStatus | None
    jobs: tuple[tuple[str, str, int], ...]  # (job id, state, finished at) of jobs in flight
    heartbeats: tuple[tuple[str, str, int], ...]  # (node, model, time) per node with one
    unreachable: tuple[tuple[str, int], ...]  # (node, since) per unreachable node

    def key(self) -> bytes:
        return hashlib.blake2b(repr(self).encode(), digest_size=16).digest()


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str
    events: tuple[str, ...]  # a shortest sequence of events from the start


@dataclass(frozen=True)
class Level:
    """The search after all sequences of ``depth`` events: distinct states
    and transitions so far, and the seconds spent."""

    depth: int
    states: int
    transitions: int
    seconds: float


@dataclass
class Report:
    policy: str
    batch_size: int
    depth: int
    reduced: bool = True
    states: int = 0
    transitions: int = 0
    seconds: float = 0.0
    violations: list[Violation] = field(default_factory=list)
    levels: list[Level] = field(default_factory=list)


class _Broken(Exception):
    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message


@contextlib.contextmanager
def injected_rules(rules: Sequence[Rule]) -> Iterator[None]:
    """The engine decides with ``rules`` instead of the documented table while inside."""
    saved = policy_table.RULES
    policy_table.RULES = tuple(rules)
    try:
        yield
    finally:
        policy_table.RULES = saved


@contextlib.contextmanager
def injected_stage_rules(rules: Sequence[StageRule]) -> Iterator[None]:
    """The engine decides stage verdicts with ``rules`` while inside."""
    saved = stage_table.STAGE_RULES
    stage_table.STAGE_RULES = tuple(rules)
    try:
        yield
    finally:
        stage_table.STAGE_RULES = saved


@contextlib.contextmanager
def injected_release_rules(rules: Sequence[ReleaseRule]) -> Iterator[None]:
    """The engine decides releases with ``rules`` while inside."""
    saved = release_table.RELEASE_RULES
    release_table.RELEASE_RULES = tuple(rules)
    try:
        yield
    finally:
        release_table.RELEASE_RULES = saved


# -- the world ---------------------------------------------------------------------


def _spec(policy: str, batch_size: int, intents: Intents) -> RolloutSpec:
    capacity = policy == CAPACITY
    return RolloutSpec(
        name=ROLLOUT,
        target=TARGET,
        node_ids=NODES,
        batch_size=batch_size,
        health_timeout=HEALTH_TIMEOUT,
        live=True,
        on_failure=policy_of(policy),
        spread_by=SpreadBy("zone", 1) if capacity else None,
        failure_budget=BUDGET if capacity else None,
        artifacts=(ARTIFACT,) if policy == STAGING else (),
        stage=STAGE if policy == STAGING else None,
        evals=(GOLDEN,) if policy == BASELINE else (),
        standby=KEEP_PREVIOUS.get(policy),
        paused=intents.paused,
        abort=intents.abort,
        resume_request=f"resume-{intents.resumes}" if intents.resumes else "",
        skip_nodes=intents.skip,
        rollback_request=RollbackRequest("rb1", None) if intents.rollback else None,
    )


def _commit(intents: Intents) -> str:
    # The commit that last changed the file: the same intents, the same commit.
    commit = hashlib.sha1(repr(intents).encode()).hexdigest()
    _COMMITTED[commit] = intents
    return commit


# The intents each commit above stands for: the abstraction names a commit
# by what it says, so that swapping two nodes renames it too.
_COMMITTED: dict[str, Intents] = {}


def _at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _observations(state: State, standby: bool = False) -> Observations:
    jobs = {
        job_id: JobObservation(
            job_id=job_id,
            state=answer,
            error="" if answer == "succeeded" else f"{answer}: model check",
            backup_id=f"bk-{job_id[-12:]}" if answer in ("succeeded", "failed") else None,
            finished_at=format_time(_at(at)) if answer in ("succeeded", "failed") else None,
            evals=_baseline_result()
            if answer == "succeeded" and job_id.startswith("eval-")
            else None,
            standby=KEPT_SLOT
            if standby and answer == "succeeded" and job_id.startswith("apply-")
            else None,
        )
        for job_id, answer, at in state.jobs
    }
    heartbeats = {
        node: Heartbeat(
            node=node,
            time=format_time(_at(at)),
            runtimes=(RuntimeReport("hermes", TARGET.provider, model, TARGET.profile),),
        )
        for node, model, at in state.heartbeats
    }
    return Observations(
        jobs=jobs,
        heartbeats=heartbeats,
        unreachable_since={node: _at(since) for node, since in state.unreachable},
    )


def _baseline_result() -> tuple[dict[str, object], ...]:
    case = {"name": "same", "ok": True, "answer": BASELINE_ANSWER, "detail": "", "seconds": 0.1}
    return (
        {"name": "golden", "suiteSha256": "ab" * 32, "passed": 1, "total": 1, "passRate": 100.0,
         "cases": [case]},
    )  # fmt: skip


def _asking(status: RolloutStatus | None) -> set[str]:
    """Nodes with a baseline eval job in flight: the daemon waits on them."""
    return {j.node for j in status.eval_baseline if j.state == "running"} if status else set()


def _pass(
    policy: str, batch_size: int, state: State
) -> tuple[State, tuple[SendJob, ...], tuple[Transition, ...]]:
    """One reconcile pass at the state's clock: the new state, the jobs sent
    and the transitions the engine reported."""
    intents = state.intents
    commit = _commit(intents)
    rollout = RolloutInput(
        name=ROLLOUT,
        spec=_spec(policy, batch_size, intents),
        file_present=True,
        problems=(),
        status=state.status,
        spec_commit=commit,
        first_seen_commit="0" * 40,
        queue_key=0,
        author="Ops <ops@example.org>",
    )
    fleet = ZONED_FLEET if policy == CAPACITY else FLEET
    observed = _observations(state, standby=policy in KEEP_PREVIOUS)
    result = step_fleet([rollout], fleet, SETTINGS, observed, _at(state.clock), unreadable={})
    status = result.statuses.get(ROLLOUT, state.status)
    # Answers of jobs no longer in flight change nothing (a verdict belongs to
    # one attempt), so they are dropped: fewer states, the same behaviour.
    open_ids = {job.job_id for job in in_flight([status] if status else [])}
    jobs = tuple(j for j in state.jobs if j[0] in open_ids)
    return replace(state, status=status, jobs=jobs), tuple(result.effects), result.transitions


def _events(state: State) -> Iterator[tuple[str, State]]:
    now = state.clock
    status = state.status
    open_jobs = in_flight([status]) if status else ()
    answered = {j[0]: j for j in state.jobs}
    for job in open_jobs:
        for answer, label in (
            ("succeeded", "succeeded"),
            ("failed", "failed"),
            ("unreachable", "unknown"),
        ):
            if answered.get(job.job_id, (None, None))[1] == answer:
                continue
            others = tuple(j for j in state.jobs if j[0] != job.job_id)
            entry = (job.job_id, answer, now)
            yield (
                f"{job.node}: {job.kind} job attempt {job.attempt} {label}",
                replace(state, jobs=tuple(sorted((*others, entry)))),
            )
    states = {n.name: n.state for n in status.nodes} if status else {}
    beats = {b[0]: b for b in state.heartbeats}
    down = {u[0]: u for u in state.unreachable}
    for node in NODES:
        # Heartbeats decide only a dispatched node's health; an agent's
        # reachability matters only while the daemon waits on it.
        if states.get(node) == "dispatched":
            for model, label in ((TARGET.model, "matching"), (OLD_MODEL, "drifting")):
                # The agent's clock is a second ahead: the heartbeat is
                # after any job it finished at this instant. A new one
                # replaces an older one, even showing the same model.
                beat = (node, model, now + 1)
                if beats.get(node) != beat:
                    others = tuple(b for b in state.heartbeats if b[0] != node)
                    yield (
                        f"{node}: heartbeat {label}",
                        replace(state, heartbeats=tuple(sorted((*others, beat)))),
                    )
            if node in beats:
                yield (
                    f"{node}: heartbeat missing",
                    replace(state, heartbeats=tuple(b for b in state.heartbeats if b[0] != node)),
                )
        if node in down:
            yield (
                f"{node}: agent reachable again",
                replace(state, unreachable=tuple(u for u in state.unreachable if u[0] != node)),
            )
        elif states.get(node) in WAITING or node in _asking(status):
            yield (
                f"{node}: agent unreachable",
                replace(state, unreachable=tuple(sorted((*state.unreachable, (node, now))))),
            )
    intents = state.intents
    phase = status.phase if status else "pending"
    if phase not in TERMINAL_PHASES:
        if not intents.paused:
            yield "intent: pause", replace(state, intents=replace(intents, paused=True))
        else:
            yield "intent: unpause", replace(state, intents=replace(intents, paused=False))
        if phase == "paused":  # a resume when nothing is held only records itself
            resumed = replace(intents, resumes=intents.resumes + 1)
            yield "intent: resume", replace(state, intents=resumed)
        for node in NODES:
            if node not in intents.skip and states.get(node) not in FINAL:
                skip = tuple(sorted((*intents.skip, node)))
                yield f"intent: skip {node}", replace(state, intents=replace(intents, skip=skip))
        if not intents.abort:
            yield "intent: abort", replace(state, intents=replace(intents, abort=True))
    if not intents.rollback:
        yield "intent: rollback all", replace(state, intents=replace(intents, rollback=True))
    for label, seconds in CLOCK_STEPS.items():
        yield f"clock: +{label}", replace(state, clock=now + seconds)


# -- the invariants ----------------------------------------------------------------


def _settled(node: NodeRecord, policy: str) -> bool:
    if node.held is not None:
        return False
    if node.state in ("succeeded", "skipped", "rolled_back", "rollback_failed"):
        return True
    return node.state in ("failed", "timed_out", "unknown") and policy == "observe"


def _check(
    setup: str,
    event: str,
    before: State,
    after: State,
    sent: tuple[SendJob, ...],
    transitions: tuple[Transition, ...],
) -> None:
    old, new = before.status, after.status
    if new is None:
        return
    policy = policy_of(setup)
    if setup == CAPACITY:
        _check_capacity(old, new, transitions)
    if setup == STAGING:
        _check_staging(old, new, sent)
    if setup == BASELINE:
        _check_baseline(old, new, sent)
    if setup in KEEP_PREVIOUS:
        _check_releases(KEEP_PREVIOUS[setup], event, old, new, sent)
    # terminal phases stay
    if old is not None and old.phase in TERMINAL_PHASES and new.phase != old.phase:
        raise _Broken("terminal", f"terminal phase {old.phase} became {new.phase}")
    old_nodes = {n.name: n for n in old.nodes} if old else {}
    for node in new.nodes:
        previous = old_nodes.get(node.name)
        if previous is not None and node.attempt < previous.attempt:
            raise _Broken(
                "attempts", f"{node.name}: attempt {previous.attempt} became {node.attempt}"
            )
        if (
            previous is not None
            and previous.attempt == node.attempt
            and previous.verdict is not None
            and node.verdict != previous.verdict
        ):
            raise _Broken(
                "verdict",
                f"{node.name} attempt {node.attempt}: verdict {previous.verdict} "
                f"became {node.verdict}",
            )
    # `unknown` never retried, stopped or restored by the engine: follow each
    # node through the pass's transitions, from the state it was in before.
    resumed = old is not None and old.last_handled_resume != new.last_handled_resume
    current = {name: node.state for name, node in old_nodes.items()}
    for t in transitions:
        if t.node is None:
            continue
        if current.get(t.node) == "unknown" and t.to_state != "unknown":
            by_person = (
                (resumed and t.to_state in ("dispatched", "staging", "skipped"))
                or (t.to_state == "skipped" and t.node in after.intents.skip)
                or (after.intents.rollback and t.to_state in ("restoring", "rollback_pending"))
            )
            if not by_person:
                raise _Broken(
                    "unknown",
                    f"{t.node}: unknown became {t.to_state} ({t.reason}) "
                    f"after '{event}', which is no person's answer",
                )
        current[t.node] = t.to_state
    # the batch gate, for every apply sent
    frozen = new.frozen
    assert frozen is not None
    by_name = {n.name: n for n in new.nodes}
    for job in sent:
        if job.kind != "apply":
            continue
        target = by_name[job.node]
        for other in new.nodes:
            if other.batch < target.batch and not _settled(other, frozen.on_failure):
                raise _Broken(
                    "gate",
                    f"{job.node} (batch {target.batch}) got a job while {other.name} "
                    f"(batch {other.batch}) is {other.state}, held {other.held}",
                )
            if other.state in ("rollback_pending", "restoring"):
                raise _Broken("gate", f"apply to {job.node} while {other.name} is being restored")
    # one payload per job id
    recorded_before = {j.job_id: j for j in (in_flight([old]) if old else ())}
    recorded_after = {j.job_id: j for j in in_flight([new])}
    for job in sent:
        for recorded in (recorded_before.get(job.job_id), recorded_after.get(job.job_id)):
            if recorded is not None and recorded != job:
                raise _Broken("payload", f"job {job.job_id} sent with two payloads")
    for job_id, job in recorded_after.items():
        earlier = recorded_before.get(job_id)
        if earlier is not None and earlier != job:
            raise _Broken("payload", f"job {job_id} is rebuilt with another payload")
    # every hold is the policy table's
    if new.phase in TERMINAL_PHASES:
        return
    for node in new.nodes:
        held = node.held
        if held in (None, "dispatch_refused", "rolled_back", "rollback_failed"):
            continue
        if held == "failure_budget_exceeded":
            continue  # checked by _check_capacity
        if node.state == "rollback_pending" or held in ("rollback_pending", "rollback_unavailable"):
            if not (policy == "rollback" and node.verdict == "failed"):
                raise _Broken("policy", f"{node.name}: {held} under {policy}, {node.verdict}")
            continue
        if node.state == "stopped":
            if not (policy == "stop" and held == "stopped"):
                raise _Broken("policy", f"{node.name}: stopped under {policy}, held {held}")
            continue
        stage_verdict = stage_failure(node)
        if stage_verdict is not None:
            expected_stage = decide_stage(policy, stage_verdict, auto_retried=node.auto_retried)
            if expected_stage.hold != held:
                raise _Broken(
                    "policy", f"{node.name}: held {held}, the stage table says {expected_stage}"
                )
            continue
        if node.verdict is None:
            raise _Broken("policy", f"{node.name}: held {held} without a verdict")
        backup = node.first_backup_id is not None or not node.first_backup_known
        expected = decide(
            policy, node.verdict, auto_retried=node.auto_retried, backup_available=backup
        ).hold
        if expected != held:
            raise _Broken(
                "policy", f"{node.name}: held {held}, the table says {expected} ({node.verdict})"
            )


def _check_staging(
    old: RolloutStatus | None, new: RolloutStatus, sent: tuple[SendJob, ...]
) -> None:
    """The staging pipeline of the staging setup."""
    by_name = {n.name: n for n in new.nodes}
    for job in sent:
        if job.kind == "apply":
            stage = by_name[job.node].stage
            if stage is None or stage.state != "staged":
                raise _Broken("staged", f"apply to {job.node}, whose stage is {stage}")
    staging = [n for n in new.nodes if n.state == "staging"]
    if len(staging) > STAGE.max_concurrent:
        raise _Broken("staged", f"{len(staging)} nodes staging at once: {staging}")
    proven = any(n.stage is not None and n.stage.state == "staged" for n in new.nodes)
    if not proven and len(staging) > 1:
        raise _Broken("staged", f"{len(staging)} nodes staging before any was staged: {staging}")
    current = next((b.index for b in new.batches if b.state != "done"), len(new.batches) + 1)
    for node in staging:
        if node.batch > current + STAGE.ahead:
            raise _Broken(
                "staged", f"{node.name} of batch {node.batch} staging while batch {current} is due"
            )
    for node in old.nodes if old is not None else ():
        stage = by_name[node.name].stage
        if node.stage is not None and (stage is None or stage.attempt < node.stage.attempt):
            raise _Broken("staged", f"{node.name}: stage attempt went back to {stage}")


def _check_baseline(
    old: RolloutStatus | None, new: RolloutStatus, sent: tuple[SendJob, ...]
) -> None:
    """The eval baseline of the baseline setup."""
    answers = answers_for_applies(new.eval_baseline)
    for job in sent:
        if job.kind != "apply":
            continue
        if not new.eval_baseline or any(j.state != "recorded" for j in new.eval_baseline):
            raise _Broken("baseline", f"apply to {job.node} before the baseline was recorded")
        if job.baseline_answers != answers or not answers:
            raise _Broken("baseline", f"apply to {job.node} carries {job.baseline_answers}")
    failed = any(j.state == "failed" for j in new.eval_baseline)
    if (
        failed
        and new.phase not in TERMINAL_PHASES
        and (new.hold is None or new.hold.reason != "eval_baseline_failed")
    ):
        raise _Broken("baseline", f"a baseline job failed and the hold is {new.hold}")
    before = {j.node: j for j in old.eval_baseline} if old is not None else {}
    for job in new.eval_baseline:
        was = before.get(job.node)
        if was is None:
            continue
        if job.attempt < was.attempt:
            raise _Broken("baseline", f"{job.node}: baseline attempt went back to {job.attempt}")
        if was.state == "recorded" and job != was:
            raise _Broken("baseline", f"{job.node}: recorded baseline became {job}")
    if old is not None and old.eval_baseline and not new.eval_baseline:
        raise _Broken("baseline", "the baseline records were dropped")


def _check_releases(
    keep: str,
    event: str,
    old: RolloutStatus | None,
    new: RolloutStatus,
    sent: tuple[SendJob, ...],
) -> None:
    """The releases of the standby setups, by the interface's words (not the
    engine's table, so a broken table is caught)."""
    ended = new.phase in TERMINAL_PHASES
    by_name = {n.name: n for n in new.nodes}

    def due(node: NodeRecord) -> bool:
        passed = node.state == "succeeded" and node.verdict == "passed"
        # A running rollout its operator paused sends no release.
        return ended or (keep == "untilSoaked" and passed and not new.operator_paused)

    for job in sent:
        if job.kind != "release":
            continue
        node = by_name[job.node]
        standby = node.standby
        if standby is None or standby.release_job_id != job.job_id:
            raise _Broken("released", f"release to {job.node}, whose record is {standby}")
        expected = derived_job_id(
            ROLLOUT, new.start_commit or "", job.node, node.attempt, "release"
        )
        if job.job_id != expected:
            raise _Broken("released", f"release {job.job_id} to {job.node} is not {expected}")
        if waiting_on_slot(node):
            raise _Broken("released", f"release to {job.node} while it is {node.state}")
        if not due(node):
            raise _Broken(
                "released", f"release to {job.node} ({node.state}) under {keep} in {new.phase}"
            )
    for node in new.nodes:
        standby = node.standby
        unsent = standby is not None and standby.release_job_id is None
        if unsent and due(node) and not waiting_on_slot(node):
            raise _Broken("released", f"{node.name}: release due under {keep}, not sent")
    for node in old.nodes if old is not None else ():
        before = node.standby
        after = by_name[node.name].standby
        if before is None or before.release_job_id is None:
            continue
        if after is None or after.release_job_id != before.release_job_id:
            raise _Broken("released", f"{node.name}: release {before} became {after}")
    if old is not None and " release job " in event:
        same = old.phase == new.phase and old.hold == new.hold
        states = [(n.state, n.held, n.verdict) for n in old.nodes]
        if not same or states != [(n.state, n.held, n.verdict) for n in new.nodes]:
            raise _Broken("released", f"'{event}' changed more than standby records")


def _check_capacity(
    old: RolloutStatus | None, new: RolloutStatus, transitions: tuple[Transition, ...]
) -> None:
    """The spread and the budget of the capacity setup."""
    zones = [(node.batch, ZONES[node.name]) for node in new.nodes]
    if len(set(zones)) != len(zones):
        raise _Broken("spread", f"a batch holds two nodes of one zone: {zones}")
    by_name = {n.name: n for n in new.nodes}
    for node in new.nodes:
        # Held for the budget only on a verdict (a rollback request may be
        # restoring it since: the hold stays until the restore's outcome).
        if node.held == "failure_budget_exceeded" and node.verdict not in ("failed", "unknown"):
            raise _Broken("budget", f"{node.name} held for the budget with verdict {node.verdict}")
    if new.phase in TERMINAL_PHASES or old is None:
        return
    resumed = old.last_handled_resume != new.last_handled_resume
    states = {n.name: n.state for n in old.nodes}
    count = sum(1 for state in states.values() if state in COUNTED)
    for t in transitions:
        if t.node is None:
            continue
        entered = t.to_state in COUNTED and states.get(t.node) not in COUNTED
        states[t.node] = t.to_state
        if not entered:
            continue
        count += 1
        node = by_name[t.node]
        if count > BUDGET and node.state == t.to_state and node.held is None and not resumed:
            raise _Broken(
                "budget",
                f"{t.node} ended {t.to_state} as failure {count} of a budget of "
                f"{BUDGET} and is not held",
            )


# -- the abstraction (reduced search) ------------------------------------------------

# Times the engine only writes: kept as "set" (T0) or None, never compared.
_RECORDED = T0
# A job's source commit: copied into its payload, never compared (the payload
# invariant compares a job id's payloads with each other, not with a commit).
_COPIED = "copied"


def _seconds(at: datetime) -> int:
    return int((at - T0).total_seconds())


def _fields(value: object, **changes: object) -> tuple[object, ...]:
    """A frozen value's fields in order, some changed: what ``replace``
    would give, as a plain tuple (cheaper, and only hashed)."""
    fields = vars(value)
    assert changes.keys() <= fields.keys()
    return (type(value).__name__, *(changes.get(k, v) for k, v in fields.items()))


def abstract_key(state: State) -> bytes:
    """The canonical hash of what the engine can tell about ``state`` now
    and in every future (module docstring, "Reductions")."""
    status = state.status
    if status is None:
        return state.key()
    now = state.clock

    def passed(at: datetime) -> bool:
        """Whether a 121 s step came since ``at`` (every deadline and
        offlineAfter measured from it has passed)."""
        gap = now - _seconds(at)
        # The time facts are exact only while 1 s steps add up to under 60 s.
        assert gap < OFFLINE_AFTER or gap >= HEALTH_TIMEOUT, f"gap of {gap} s"
        return gap >= HEALTH_TIMEOUT

    hold = status.hold
    assert hold is None or hold.until is None, "timed holds are outside this world"
    assert status.waiting is None and status.scheduled_for is None
    assert status.frozen is not None and status.frozen.node_ids == NODES
    intents = state.intents
    # Field by field (``vars``), not ``replace``: this runs once per transition.
    rollout = _fields(
        status,
        nodes=(),
        conditions=(),
        transitions=(),
        frozen=None,  # the same in every state
        # The engine only compares the commit it last handled with the next
        # one: what that commit says is what counts, not its hash.
        spec_commit=_COMMITTED[status.spec_commit],
        started_at=_RECORDED if status.started_at is not None else None,
        finished_at=_RECORDED if status.finished_at is not None else None,
        hold=None if hold is None else _fields(hold, since=_RECORDED),
        rollbacks=tuple(_fields(r, time=_RECORDED) for r in status.rollbacks),
        # A baseline job's deadline is 121 s after it was sent: one fact, as
        # for an apply; only a running one's is ever compared.
        eval_baseline=tuple(
            _fields(
                j,
                sent_at=j.state == "running" and passed(j.sent_at),
                deadline=_RECORDED,
                finished_at=_RECORDED if j.finished_at is not None else None,
            )
            for j in status.eval_baseline
        ),
    )
    owner = {job.job_id: job.node for job in in_flight([status])}
    asking = _asking(status)
    beats = {b[0]: b for b in state.heartbeats}
    down = dict(state.unreachable)
    texts: list[str] = []
    for node in status.nodes:
        name = node.name
        facts: list[object] = []
        if node.dispatched_at is not None:
            assert node.deadline is not None
            assert node.deadline - node.dispatched_at == timedelta(seconds=HEALTH_TIMEOUT)
            facts.append(passed(node.dispatched_at))
        stage = node.stage
        if stage is not None:
            # The stage's deadline is 120 s after it started, as an apply's.
            facts.append(passed(stage.started_at))
            stage = _fields(
                stage,
                started_at=_RECORDED,
                finished_at=_RECORDED if stage.finished_at is not None else None,
            )
        restore = node.restore
        if restore is not None:
            assert restore.deadline - restore.dispatched_at == timedelta(seconds=HEALTH_TIMEOUT)
            facts.append(passed(restore.dispatched_at))
            restore = _fields(
                restore,
                source_commit=_COPIED,
                dispatched_at=_RECORDED,
                deadline=_RECORDED,
                finished_at=_RECORDED if restore.finished_at is not None else None,
            )
        standby = node.standby
        if standby is not None and standby.release_deadline is not None:
            # The release's deadline is 120 s after it was sent, as an apply's.
            facts.append(passed(standby.release_deadline - timedelta(seconds=HEALTH_TIMEOUT)))
            standby = _fields(
                standby,
                release_deadline=_RECORDED,
                released_at=_RECORDED if standby.released_at is not None else None,
            )
        record = _fields(
            node,
            standby=standby,
            source_commit=_COPIED if node.source_commit is not None else None,
            dispatched_at=_RECORDED if node.dispatched_at is not None else None,
            deadline=_RECORDED if node.deadline is not None else None,
            finished_at=_RECORDED if node.finished_at is not None else None,
            restore=restore,
            stage=stage,
        )
        answers = [(job, answer, at) for job, answer, at in state.jobs if owner.get(job) == name]
        beat = beats.get(name)
        # A heartbeat counts only after the node's succeeded answer; answers
        # come at the clock or later, so one not ahead of the clock and not
        # after a succeeded answer in hand never counts again: as if none.
        if beat is not None and not (
            beat[2] > now or any(a == "succeeded" and beat[2] > at for _, a, at in answers)
        ):
            beat = None
        since = down.get(name)
        text = repr(
            (
                record,
                tuple(facts),
                tuple(
                    (job, answer, answer == "succeeded" and beat is not None and beat[2] > at)
                    for job, answer, at in answers
                ),
                None if beat is None else (beat[1], beat[2] > now),
                # An outage's length counts only for a dispatched node: a
                # later dispatch measures it from that dispatch.
                None
                if since is None
                else (node.state in ("dispatched", "staging") or name in asking)
                and passed(_at(since)),
            )
        )
        texts.append(text)
    assert len(owner) == len(set(owner)) and all(j[0] in owner for j in state.jobs)
    text = repr((rollout, intents)) + "".join(texts)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


# -- the search --------------------------------------------------------------------


def initial_state() -> State:
    return State(0, Intents(), None, (), (), ())


def check(
    policy: str,
    batch_size: int,
    depth: int,
    stop_at_first: bool = True,
    reduced: bool = True,
    reached: set[bytes] | None = None,
    on_level: Callable[[Level], None] | None = None,
) -> Report:
    """Every event sequence up to ``depth`` from a fresh rollout, breadth
    first. ``reduced``: states deduplicated by ``abstract_key`` (else by the
    concrete state). ``reached``, if given, collects the abstract key of
    every state visited, to compare the two searches; ``on_level`` is told
    each depth's figures as soon as that depth is done."""
    report = Report(policy, batch_size, depth, reduced)
    key_of = abstract_key if reduced else State.key
    started = time.monotonic()
    first, _, _ = _pass(policy, batch_size, initial_state())
    parents: dict[bytes, tuple[bytes | None, str]] = {key_of(first): (None, "start")}
    if reached is not None:
        reached.add(abstract_key(first))
    labels: dict[str, str] = {}  # one string per event label: millions of parents share them
    level = [(key_of(first), first)]
    for number in range(1, depth + 1):
        following: list[tuple[bytes, State]] = []
        for key, state in level:
            for event, changed in _events(state):
                report.transitions += 1
                after, sent, moves = _pass(policy, batch_size, changed)
                try:
                    _check(policy, event, state, after, sent, moves)
                except _Broken as broken:
                    path = (*_path(parents, key), event)
                    report.violations.append(Violation(broken.rule, broken.message, path))
                    if stop_at_first:
                        report.states = len(parents)
                        report.seconds = time.monotonic() - started
                        return report
                    continue
                new_key = key_of(after)
                if new_key not in parents:
                    parents[new_key] = (key, labels.setdefault(event, event))
                    if number < depth:  # the last level is counted, not expanded
                        following.append((new_key, after))
                    if reached is not None:
                        reached.add(new_key if reduced else abstract_key(after))
        level = following
        seconds = time.monotonic() - started
        report.levels.append(Level(number, len(parents), report.transitions, seconds))
        if on_level is not None:
            on_level(report.levels[-1])
    report.states = len(parents)
    report.seconds = time.monotonic() - started
    return report


def concrete_states(policy: str, batch_size: int, depth: int) -> list[State]:
    """Every concrete state within ``depth`` events (the unreduced search's)."""
    first, _, _ = _pass(policy, batch_size, initial_state())
    seen = {first.key(): first}
    level = [first]
    for _ in range(depth):
        following = []
        for state in level:
            for _, changed in _events(state):
                after, _, _ = _pass(policy, batch_size, changed)
                if seen.setdefault(after.key(), after) is after:
                    following.append(after)
        level = following
    return list(seen.values())


def futures(policy: str, batch_size: int, state: State) -> dict[str, tuple[bytes, str | None]]:
    """Per event from ``state``: the abstract key after the pass, and the
    rule the transition breaks (None: none)."""
    found: dict[str, tuple[bytes, str | None]] = {}
    for event, changed in _events(state):
        after, sent, moves = _pass(policy, batch_size, changed)
        try:
            _check(policy, event, state, after, sent, moves)
            broken = None
        except _Broken as caught:
            broken = caught.rule
        found[event] = (abstract_key(after), broken)
    return found


def replay(policy: str, batch_size: int, events: Sequence[str]) -> str | None:
    """Run ``events`` (labels as a counterexample prints them) in the
    unreduced world from the start; the rule the last one breaks, or None.
    Raises KeyError if an event is not possible where the sequence has it."""
    state, _, _ = _pass(policy, batch_size, initial_state())
    for number, event in enumerate(events, 1):
        changed = dict(_events(state))[event]
        after, sent, moves = _pass(policy, batch_size, changed)
        try:
            _check(policy, event, state, after, sent, moves)
        except _Broken as broken:
            return broken.rule if number == len(events) else f"early: {broken.rule}"
        state = after
    return None


def _path(parents: dict[bytes, tuple[bytes | None, str]], key: bytes) -> tuple[str, ...]:
    events: list[str] = []
    current: bytes | None = key
    while current is not None:
        parent, event = parents[current]
        if parent is not None:
            events.append(event)
        current = parent
    return tuple(reversed(events))


def check_all(depth: int, reduced: bool = True) -> list[Report]:
    return [check(p, b, depth, reduced=reduced) for p in SETUPS for b in BATCH_SIZES]
