"""The daemon SIGKILLed at its named crash points (RECONCILER_CRASH_AT):
after stepping and before the commit, after the commit and before the
push, after the push and before any job is sent, after some of a batch's
jobs are sent. Restarted without the crash point each time, it ends the
rollout exactly as an uninterrupted run does: same phase, same node states
and attempts, no job executed twice or sent with two payloads, nothing
sent that no committed status records, batches in order, every status
commit parsing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import scenarios


def test_killed_once_at_every_point_early_in_a_rollout_it_ends_as_if_never_killed(
    tmp_path: Path, reference: tuple[Any, ...]
) -> None:
    points = ["after_step:1", "after_commit:1", "after_push:1", "mid_send:1"]

    result = scenarios.crash_scenario(tmp_path, points, reference)

    assert result.ok, result.explain()
    assert result.crashes == len(points)


def test_killed_halfway_through_sending_each_batch_every_job_still_runs_once(
    tmp_path: Path, reference: tuple[Any, ...]
) -> None:
    points = ["mid_send:1", "mid_send:1", "mid_send:1"]  # batch 1, then 2, then 3

    result = scenarios.crash_scenario(tmp_path, points, reference)

    assert result.ok, result.explain()
    assert result.crashes == 3 and result.executed_twice == 0


def test_killed_after_later_commits_and_pushes_it_ends_as_if_never_killed(
    tmp_path: Path, reference: tuple[Any, ...]
) -> None:
    # after_step first: a point counted in passes is reached only while the rollout is active
    points = ["after_step:3", "after_commit:2", "after_push:1"]

    result = scenarios.crash_scenario(tmp_path, points, reference)

    assert result.ok, result.explain()
    assert result.crashes == len(points)


def test_killed_between_commit_and_push_to_a_remote_it_ends_as_if_never_killed(
    tmp_path: Path, reference: tuple[Any, ...]
) -> None:
    points = ["after_commit:1", "after_commit:2", "after_push:2"]

    result = scenarios.crash_scenario(tmp_path, points, reference, remote=True)

    assert result.ok, result.explain()
    assert result.crashes == len(points) and result.commits_lost == 0


def test_a_live_rollout_on_real_agents_survives_crashes_and_applies_each_job_once(
    tmp_path: Path,
) -> None:
    points = ["after_commit:1", "after_push:1", "mid_send:1"]

    result = scenarios.agent_crash_scenario(tmp_path, points)

    assert result.ok, result.explain()
    assert result.crashes == len(points) and result.executed_twice == 0


def test_two_daemons_at_once_end_the_rollout_as_one_daemon_does(
    tmp_path: Path, reference: tuple[Any, ...]
) -> None:
    result = scenarios.two_daemons_scenario(tmp_path, reference)

    assert result.ok, result.explain()
    assert result.executed_twice == 0
