"""The failure-policy table against docs/rollouts.md, cell by cell."""

from __future__ import annotations

import itertools

import pytest

from reconciler.engine.policy import POLICIES, VERDICTS, Decision, decide, matching_rules

# docs/rollouts.md, written out as (verdict, policy, auto_retried, backup) -> decision.
# None in a key column means "either".
EXPECTED: list[tuple[str, str, bool | None, bool | None, Decision]] = [
    ("passed", "observe", None, None, Decision("next")),
    ("passed", "pause", None, None, Decision("next")),
    ("passed", "retry_once", None, None, Decision("next")),
    ("passed", "stop", None, None, Decision("next")),
    ("passed", "rollback", None, None, Decision("next")),
    ("failed", "observe", None, None, Decision("continue")),
    ("failed", "pause", None, None, Decision("hold", "health_failed")),
    ("failed", "retry_once", False, None, Decision("retry")),
    ("failed", "retry_once", True, None, Decision("hold", "retry_exhausted")),
    ("failed", "stop", None, None, Decision("stop", "stopped")),
    ("failed", "rollback", None, True, Decision("rollback", "rollback_pending")),
    ("failed", "rollback", None, False, Decision("hold", "rollback_unavailable")),
    ("unknown", "observe", None, None, Decision("continue")),
    ("unknown", "pause", None, None, Decision("hold", "health_unknown")),
    ("unknown", "retry_once", None, None, Decision("hold", "health_unknown")),
    ("unknown", "stop", None, None, Decision("hold", "health_unknown")),
    ("unknown", "rollback", None, None, Decision("hold", "health_unknown")),
]


@pytest.mark.parametrize(("verdict", "policy", "retried", "backup", "expected"), EXPECTED)
def test_decision_matches_design(
    verdict: str, policy: str, retried: bool | None, backup: bool | None, expected: Decision
) -> None:
    for r in [False, True] if retried is None else [retried]:
        for b in [False, True] if backup is None else [backup]:
            assert decide(policy, verdict, auto_retried=r, backup_available=b) == expected


def test_every_case_has_exactly_one_rule() -> None:
    for verdict, policy, retried, backup in itertools.product(
        VERDICTS, POLICIES, [False, True], [False, True]
    ):
        rules = matching_rules(policy, verdict, auto_retried=retried, backup_available=backup)
        assert len(rules) == 1, (verdict, policy, retried, backup, rules)


def test_unknown_never_retries_stops_or_rolls_back() -> None:
    for policy, retried, backup in itertools.product(POLICIES, [False, True], [False, True]):
        decision = decide(policy, "unknown", auto_retried=retried, backup_available=backup)
        assert decision.action in ("continue", "hold")


def test_unknown_policy_or_verdict_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="observe"):
        decide("yolo", "failed", auto_retried=False, backup_available=False)
    with pytest.raises(ValueError, match="passed"):
        decide("pause", "meh", auto_retried=False, backup_available=False)
