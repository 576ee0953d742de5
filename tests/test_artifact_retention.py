"""Which artifacts an agent keeps, over many rollouts: the current and the
previous config's, those of jobs not yet applied, and the newest
``--keep-artifacts`` per runtime beyond them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from reconciler.node.artifact_retention import (
    artifacts_to_prune,
    config_artifacts,
    pinned_by_jobs,
)
from reconciler.node.artifact_store import ArtifactStore
from reconciler.node.state_dir import JobRecord
from reconciler.spec.times import format_time

START = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def _digest(i: int, runtime: str) -> str:
    return f"{i:032x}{abs(hash(runtime)) % 16**32:032x}"


def _record(kind: str, rollout: str, runtime: str, sha: str, state: str, at: int) -> JobRecord:
    payload: dict[str, Any] = {
        "jobId": f"{kind}-{rollout}-{runtime}",
        "kind": kind,
        "mode": "live",
        "rollout": rollout,
        "target": {"runtime": runtime},
        "artifacts": [{"name": "weights", "sha256": sha, "size": 1}],
    }
    moment = format_time(START + timedelta(seconds=at))
    return JobRecord(payload["jobId"], payload, state, moment)


def test_over_many_rollouts_the_store_keeps_current_previous_pending_and_the_newest_n(
    tmp_path: Path,
) -> None:
    keep = 2
    store = ArtifactStore(tmp_path)
    journal: list[JobRecord] = []
    configs: dict[str, list[str]] = {"hermes": [], "atlas": []}  # config history per runtime
    clock = 0
    for i in range(40):
        for runtime in configs:
            sha = _digest(i, runtime)
            clock += 1
            journal.append(_record("stage", f"r{i}", runtime, sha, "succeeded", clock))
            store.note_use([sha], runtime)
            (store.folder / sha).write_bytes(b"x")
            if i % 5 != 4:  # every fifth rollout is staged and never applied (abandoned)
                clock += 1
                journal.append(_record("apply", f"r{i}", runtime, sha, "succeeded", clock))
                configs[runtime].append(sha)
        pending = _digest(i + 1, "hermes")  # the next rollout's stage, accepted, not run
        running = [*journal, _record("stage", f"r{i + 1}", "hermes", pending, "accepted", clock)]
        journal = journal[-30:]  # the journal is compacted: old records go

        current_and_previous = {s for history in configs.values() for s in history[-2:]}
        pinned = current_and_previous | pinned_by_jobs(running)
        store.delete(artifacts_to_prune(store.uses, store.held(), pinned, keep))

        held = store.held()
        assert current_and_previous <= held  # a restore never needs a download
        assert pinned_by_jobs(running) - {pending} <= held
        # Beyond the pinned ones, at most ``keep`` per runtime.
        assert len(held - pinned) <= keep * len(configs)
    # Bounded whatever the number of rollouts: nothing accumulates.
    assert len(store.held()) <= 2 * len(configs) + keep * len(configs) + 2 * len(configs)


def test_an_unpinned_file_goes_oldest_first_and_a_file_without_a_use_before_all() -> None:
    uses = {"a": {"hermes": 1}, "b": {"hermes": 2}, "c": {"hermes": 3}}
    assert artifacts_to_prune(uses, ["a", "b", "c", "stray"], [], 1) == ["stray", "a", "b"]
    assert artifacts_to_prune(uses, ["a", "b", "c"], ["a"], 1) == ["b"]


def test_a_stage_pins_its_files_until_an_apply_of_its_rollout_succeeded_after_it() -> None:
    staged = _record("stage", "r1", "hermes", "s1", "succeeded", 1)
    assert pinned_by_jobs([staged]) == {"s1"}
    failed_apply = _record("apply", "r1", "hermes", "s1", "failed", 2)
    assert pinned_by_jobs([staged, failed_apply]) == {"s1"}
    applied = _record("apply", "r1", "hermes", "s1", "succeeded", 3)
    assert pinned_by_jobs([staged, applied]) == set()
    restaged = _record("stage", "r1", "hermes", "s2", "succeeded", 4)
    assert pinned_by_jobs([staged, applied, restaged]) == {"s2"}


def test_a_config_points_to_its_artifacts_by_digest() -> None:
    values = {"artifacts": {"weights": {"path": "/x", "sha256": "ab" * 32}, "bad": "no"}}
    assert config_artifacts(values) == {"ab" * 32}
    assert config_artifacts({"model": "m"}) == set()
