"""Agents that misbehave, each against every failure policy, on the
simulated fleet: every rollout ends as docs/rollouts.md say
(failed verdict -> the policy; no evidence past offlineAfter -> hold
health_unknown, observe carries on), with the daemon still running and
committing nothing while idle."""

from __future__ import annotations

from pathlib import Path

from . import scenarios


def test_faults_that_give_a_failed_verdict_end_as_each_policy_says(tmp_path: Path) -> None:
    # hang, slow past the timeout, 403, another node's name, drift, clocks an hour off
    faults = scenarios.FAULTS_FAILED

    result = scenarios.fault_scenario(tmp_path, faults, "failed-verdict faults")

    assert result.ok, result.explain()
    assert result.faults == len(faults) * len(scenarios.POLICIES)


def test_faults_that_leave_no_evidence_hold_health_unknown_whatever_the_policy(
    tmp_path: Path,
) -> None:
    # nothing listening, 500, garbage instead of JSON, a stalled connection
    faults = scenarios.FAULTS_UNKNOWN

    result = scenarios.fault_scenario(tmp_path, faults, "no-evidence faults")

    assert result.ok, result.explain()
    assert result.faults == len(faults) * len(scenarios.POLICIES)


def test_agents_down_mid_batch_hold_until_a_person_resumes_after_they_are_back(
    tmp_path: Path,
) -> None:
    result = scenarios.outage_scenario(tmp_path)

    assert result.ok, result.explain()
    assert result.faults == len(scenarios.POLICIES)


def test_a_short_outage_and_clocks_90s_off_need_no_person(tmp_path: Path) -> None:
    result = scenarios.blip_scenario(tmp_path)

    assert result.ok, result.explain()
