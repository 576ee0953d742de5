"""The exhaustive bounded check of the engine (``modelcheck``) at a small
depth: every policy and batch size, no violation; and a broken rule handed
to the engine is caught with a shortest counterexample."""

from __future__ import annotations

from dataclasses import replace

import pytest
from modelcheck import BATCH_SIZES, POLICIES, check, injected_rules

from reconciler.engine.policy import RULES, Decision

DEPTH = 3


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("policy", POLICIES)
def test_every_sequence_of_events_keeps_the_invariants(policy: str, batch_size: int) -> None:
    report = check(policy, batch_size, DEPTH)

    assert report.violations == []
    assert report.states > 100  # the search went somewhere: batches, holds, intents
    assert report.transitions >= report.states - 1


def test_retrying_unknown_is_caught_with_a_shortest_counterexample() -> None:
    broken = tuple(
        replace(rule, decision=Decision("retry"))
        if (rule.verdict, rule.policy) == ("unknown", "retry_once")
        else rule
        for rule in RULES
    )
    with injected_rules(broken):
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
