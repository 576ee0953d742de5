"""The exhaustive bounded check of the engine (``modelcheck``) at a small
depth: every policy and batch size, no violation; a broken rule handed to
the engine is caught with a shortest counterexample; and the reduced search
(``abstract_key``) loses nothing the unreduced one finds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconciler.engine import baselines
from reconciler.engine.baselines import GATE_RULES
from reconciler.engine.policy import RULES, Decision, Rule
from reconciler.engine.releases import RELEASE_RULES
from reconciler.engine.staging import STAGE_RULES
from tests.modelcheck import (
    BASELINE,
    BATCH_SIZES,
    CAPACITY,
    SETUPS,
    STAGING,
    STANDBY,
    STANDBY_END,
    State,
    abstract_key,
    check,
    concrete_states,
    futures,
    injected_release_rules,
    injected_rules,
    injected_stage_rules,
    replay,
)

DEPTH = 3


def _retrying_unknown() -> tuple[Rule, ...]:
    return tuple(
        replace(rule, decision=Decision("retry"))
        if (rule.verdict, rule.policy) == ("unknown", "retry_once")
        else rule
        for rule in RULES
    )


def test_retrying_unknown_is_caught_with_a_shortest_counterexample() -> None:
    with injected_rules(_retrying_unknown()):
        report = check("retry_once", 1, 4)

    assert [v.rule for v in report.violations] == ["unknown"]
    violation = report.violations[0]
    # The job's answer cannot be read until past the deadline: `unknown`; the
    # broken rule sends the node a second attempt in that same pass.
    assert violation.message.startswith("n1: unknown became dispatched (automatic retry")
    assert violation.events == ("n1: apply job attempt 1 unknown", "clock: +121s")


def test_the_real_table_is_back_after_an_injection() -> None:
    with injected_rules(()):
        pass
    assert check("retry_once", 1, 2).violations == []


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("policy", SETUPS)
def test_every_sequence_of_events_keeps_the_invariants_reduced_or_not(
    policy: str, batch_size: int
) -> None:
    # No violation either way. The reductions merge only states the engine cannot tell apart, so the
    # unreduced search, mapped through the abstraction, reaches exactly the
    # same set at every depth; with fewer states to visit.
    full: set[bytes] = set()
    reduced: set[bytes] = set()
    unreduced_report = check(policy, batch_size, DEPTH, reduced=False, reached=full)
    reduced_report = check(policy, batch_size, DEPTH, reduced=True, reached=reduced)

    assert reduced_report.violations == unreduced_report.violations == []
    assert reduced_report.states > 100  # the search went somewhere: batches, holds, intents
    assert reduced_report.transitions >= reduced_report.states - 1
    assert reduced == full
    assert reduced_report.states == len(reduced) < unreduced_report.states


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
def test_the_reduced_search_finds_every_violation_the_full_one_does(batch_size: int) -> None:
    # All violations of the broken rule within DEPTH events, not just the
    # first: the same rules broken, the same shortest length, and each
    # counterexample the reduced search prints replays in the unreduced world.
    with injected_rules(_retrying_unknown()):
        full = check("retry_once", batch_size, DEPTH, stop_at_first=False, reduced=False)
        reduced = check("retry_once", batch_size, DEPTH, stop_at_first=False, reduced=True)
        replayed = {replay("retry_once", batch_size, v.events) for v in reduced.violations}

    assert reduced.violations and full.violations
    assert {v.rule for v in reduced.violations} == {v.rule for v in full.violations} == {"unknown"}
    assert min(len(v.events) for v in reduced.violations) == min(
        len(v.events) for v in full.violations
    )
    assert {v.message for v in reduced.violations} <= {v.message for v in full.violations}
    assert replayed == {"unknown"}


@pytest.mark.parametrize(("policy", "batch_size"), [("retry_once", 1), ("rollback", 2)])
def test_states_the_abstraction_merges_have_the_same_futures(policy: str, batch_size: int) -> None:
    # The soundness of the reductions, one step at a time: concrete states
    # with one abstract key (different clocks, stale heartbeats, recorded
    # times, commits) answer every event alike, breaking the same rule or
    # none and landing on one abstract key. An event only one of them has (a
    # stale heartbeat going missing) changes nothing the engine can see.
    classes: dict[bytes, list[State]] = {}
    for state in concrete_states(policy, batch_size, 2):
        classes.setdefault(abstract_key(state), []).append(state)
    merged = [(key, states) for key, states in classes.items() if len(states) > 1]
    assert len(merged) > 20  # the abstraction does merge: clocks, heartbeats, history

    for key, states in merged:
        answers = [futures(policy, batch_size, state) for state in states]
        shared = set.intersection(*(set(a) for a in answers))
        for event in shared:
            assert len({a[event] for a in answers}) == 1, (event, states[0], states[1])
        for a in answers:
            for event in set(a) - shared:
                assert a[event] == (key, None), event


def test_the_capacity_setup_reaches_budget_holds_and_spreads_its_batches() -> None:
    # Its search goes where the rules are: a second failure held for the
    # budget, naming both failures, and batches of one node per zone.
    states = concrete_states(CAPACITY, 2, 4)
    held = [
        s
        for s in states
        if s.status is not None
        and s.status.hold is not None
        and s.status.hold.reason == "failure_budget_exceeded"
    ]
    assert held
    assert any(len(s.status.hold.nodes) == 2 for s in held if s.status and s.status.hold)
    batches = {(n.name, n.batch) for s in states if s.status for n in s.status.nodes}
    assert batches == {("n1", 1), ("n3", 1), ("n2", 2)}  # one node of each zone per batch


def test_the_staging_setup_stages_applies_and_holds_stage_failed() -> None:
    states = [s.status for s in concrete_states(STAGING, 2, 4) if s.status is not None]
    holds = {s.hold.reason for s in states if s.hold is not None}
    nodes = {n.state for s in states for n in s.nodes}

    assert {"stage_failed", "health_unknown"} <= holds
    assert {"staging", "staged", "dispatched"} <= nodes


def test_restaging_an_unknown_stage_by_itself_is_caught() -> None:
    broken = tuple(
        replace(rule, decision=Decision("restage"))
        if (rule.verdict, rule.policy) == ("unknown", "retry_once")
        else rule
        for rule in STAGE_RULES
    )
    with injected_stage_rules(broken):
        report = check(STAGING, 1, 4)

    assert [v.rule for v in report.violations] == ["unknown"]
    assert report.violations[0].message.startswith("n1: unknown became staging")


def test_the_baseline_setup_records_answers_dispatches_and_holds_eval_baseline_failed() -> None:
    states = [s.status for s in concrete_states(BASELINE, 1, 4) if s.status is not None]
    holds = {s.hold.reason for s in states if s.hold is not None}
    asked = {j.state for s in states for j in s.eval_baseline}

    assert "eval_baseline_failed" in holds
    assert asked == {"running", "recorded", "failed"}
    assert any(n.state == "dispatched" for s in states for n in s.nodes)


def test_dispatching_while_the_baseline_is_asked_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tuple(
        replace(rule, action="go") if rule.stands == "asking" else rule for rule in GATE_RULES
    )
    monkeypatch.setattr(baselines, "GATE_RULES", broken)

    report = check(BASELINE, 1, 3)

    # The first pass sends n1's apply without answers; once they are
    # recorded, status rebuilds that apply with them: one id, two payloads.
    assert [v.rule for v in report.violations] == ["payload"]
    assert report.violations[0].events == ("n3: eval job attempt 1 succeeded",)


def test_the_standby_setup_sends_releases_and_records_their_answers() -> None:
    states = [s.status for s in concrete_states(STANDBY, 1, 4) if s.status is not None]
    kept = [n.standby for s in states for n in s.nodes if n.standby is not None]

    assert any(k.release_job_id is None for k in kept)  # kept warm, not yet due
    assert any(k.released_at is not None for k in kept)
    assert any(k.release_error.startswith("release failed") for k in kept)
    assert any(n.state == "rollback_pending" for s in states for n in s.nodes)


@pytest.mark.parametrize(
    ("moment", "release", "message", "events"),
    [
        (
            "ended",
            False,
            "n1: release due under untilCompleted, not sent",
            ("n1: apply job attempt 1 succeeded", "n1: heartbeat matching", "intent: abort"),
        ),
        (
            "passed",
            True,
            "release to n1 (succeeded) under untilCompleted in running",
            ("n1: apply job attempt 1 succeeded", "n1: heartbeat matching"),
        ),
    ],
)
def test_a_broken_release_rule_is_caught_with_a_shortest_counterexample(
    moment: str, release: bool, message: str, events: tuple[str, ...]
) -> None:
    broken = tuple(
        replace(rule, release=release)
        if (rule.keep_previous, rule.moment) == ("untilCompleted", moment)
        else rule
        for rule in RELEASE_RULES
    )
    with injected_release_rules(broken):
        report = check(STANDBY_END, 1, 4)

    assert [(v.rule, v.message, v.events) for v in report.violations] == [
        ("released", message, events)
    ]


def test_states_with_releases_the_abstraction_merges_have_the_same_futures() -> None:
    # As above, where release records (their deadlines, when they were
    # answered) are among what the abstraction condenses.
    classes: dict[bytes, list[State]] = {}
    for state in concrete_states(STANDBY, 1, 3):
        classes.setdefault(abstract_key(state), []).append(state)
    merged = [(key, states) for key, states in classes.items() if len(states) > 1]
    with_releases = [
        states
        for _, states in merged
        if states[0].status is not None
        and any(n.standby and n.standby.release_job_id for n in states[0].status.nodes)
    ]
    assert with_releases

    for key, states in merged:
        answers = [futures(STANDBY, 1, state) for state in states]
        shared = set.intersection(*(set(a) for a in answers))
        for event in shared:
            assert len({a[event] for a in answers}) == 1, (event, states[0], states[1])
        for a in answers:
            for event in set(a) - shared:
                assert a[event] == (key, None), event
