"""The fleet repository misbehaving under a running daemon: the remote
gone for a while, history force-pushed backwards, a status file edited into
nonsense, a rollout file deleted mid-run, fifty people pushing at once."""

from __future__ import annotations

from pathlib import Path

from . import scenarios


def test_an_unreachable_remote_is_waited_out_and_the_rollout_resumes(tmp_path: Path) -> None:
    result = scenarios.remote_outage_scenario(tmp_path)

    assert result.ok, result.explain()


def test_history_force_pushed_backwards_is_refused_until_a_restart_accepts_it(
    tmp_path: Path,
) -> None:
    result = scenarios.force_push_scenario(tmp_path)

    assert result.ok, result.explain()
    assert result.executed_twice == 0


def test_a_status_file_edited_into_nonsense_holds_its_rollout_and_is_never_overwritten(
    tmp_path: Path,
) -> None:
    result = scenarios.status_nonsense_scenario(tmp_path)

    assert result.ok, result.explain()
    assert result.faults == 2  # not YAML; YAML with impossible values


def test_a_rollout_file_deleted_mid_run_aborts_it_with_spec_removed(tmp_path: Path) -> None:
    result = scenarios.rollout_removed_scenario(tmp_path)

    assert result.ok, result.explain()


def test_fifty_people_pushing_while_the_daemon_commits_lose_nothing(tmp_path: Path) -> None:
    result = scenarios.concurrent_pushes_scenario(tmp_path, people=50)

    assert result.ok, result.explain()
    assert result.commits_lost == 0


def test_a_rollout_with_an_unreadable_status_keeps_its_nodes_from_other_rollouts(
    tmp_path: Path,
) -> None:
    result = scenarios.unreadable_status_overlap_scenario(tmp_path)

    assert result.ok, result.explain()
