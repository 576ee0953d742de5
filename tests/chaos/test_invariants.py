"""The invariant checks themselves, on made-up histories: each violation
they exist to catch is caught, and a clean history passes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from reconciler.spec.model import Target
from reconciler.spec.rollout_status import FrozenSpec, NodeRecord, RolloutStatus

from .invariants import CommitRecord, Snapshot, check_history, check_jobs

FROZEN = FrozenSpec(Target("hermes", "ollama", "m"), batch_size=1, live=False, on_failure="pause")


def status(phase: str, *nodes: tuple[str, int, str, int]) -> RolloutStatus:
    """``nodes``: (name, batch, state, attempt)."""
    return RolloutStatus(
        name="r",
        phase=phase,
        start_commit="a" * 40,
        frozen=FROZEN,
        nodes=tuple(
            NodeRecord(
                name=n,
                batch=b,
                state=s,
                attempt=a,
                job_id=f"apply-{n}-{a}" if a else None,
                verdict="passed" if s == "succeeded" else None,
            )
            for n, b, s, a in nodes
        ),
    )


def commit(
    i: int, st: RolloutStatus | None, *, author: str = "reconciler", paths: tuple[str, ...] = ()
) -> CommitRecord:
    statuses = {"r": st} if st is not None else {}
    return CommitRecord(
        commit=f"{i:040x}",
        parents=(f"{i - 1:040x}",) if i else (),
        author=author,
        message="",
        time=i,
        paths=paths or ("status/r.yaml",),
        snapshot=Snapshot(f"{i:040x}", statuses, {}),
    )


GOOD = [
    commit(0, None, author="Ada", paths=("rollouts/r.yaml",)),
    commit(1, status("running", ("n1", 1, "dispatched", 1), ("n2", 2, "pending", 0))),
    commit(2, status("running", ("n1", 1, "succeeded", 1), ("n2", 2, "dispatched", 1))),
    commit(3, status("completed", ("n1", 1, "succeeded", 1), ("n2", 2, "succeeded", 1))),
]


def test_a_clean_history_passes() -> None:
    report = check_history(GOOD)

    assert report.violations == [] and report.daemon_commits == 3


def test_a_later_batch_dispatched_before_the_earlier_one_settled_is_caught() -> None:
    early = status("running", ("n1", 1, "dispatched", 1), ("n2", 2, "dispatched", 1))

    report = check_history([GOOD[0], GOOD[1], commit(2, early)])

    assert any("n2 (batch 2) dispatched" in v for v in report.violations)


def test_status_going_backwards_is_caught() -> None:
    reopened = status("running", ("n1", 1, "succeeded", 1), ("n2", 2, "succeeded", 1))
    fewer = status("running", ("n1", 1, "dispatched", 0), ("n2", 2, "pending", 0))
    rewritten = replace(GOOD[3].snapshot["r"], nodes=(
        replace(GOOD[3].snapshot["r"].nodes[0], verdict="failed"), GOOD[3].snapshot["r"].nodes[1]
    ))  # fmt: skip

    terminal = check_history([*GOOD, commit(4, reopened)]).violations
    attempts = check_history([GOOD[0], GOOD[1], commit(2, fewer)]).violations
    verdict = check_history([*GOOD, commit(4, rewritten)]).violations

    assert any("terminal phase completed became running" in v for v in terminal)
    assert any("attempt went back from 1 to 0" in v for v in attempts)
    assert any("verdict of attempt 1 rewritten" in v for v in verdict)


def test_a_daemon_writing_outside_status_and_a_merge_are_caught() -> None:
    outside = commit(4, GOOD[3].snapshot["r"], paths=("status/r.yaml", "rollouts/r.yaml"))
    merge = replace(commit(4, None, author="Ada"), parents=("a" * 40, "b" * 40))

    assert any("outside status/" in v for v in check_history([*GOOD, outside]).violations)
    assert any("merge commit" in v for v in check_history([*GOOD, merge]).violations)


def test_a_person_editing_status_resets_the_baseline() -> None:
    edited = commit(4, status("running", ("n1", 1, "pending", 0)), author="Ada")
    after = commit(5, status("running", ("n1", 1, "dispatched", 1)))

    assert check_history([*GOOD, edited, after]).violations == []


def test_jobs_executed_twice_sent_with_two_payloads_or_never_recorded_are_caught() -> None:
    stats = {
        "received": {"apply-n1-1": 2, "apply-ghost-1": 1},
        "executed": {"apply-n1-1": 2},
        "payloadVariants": {"apply-n1-1": 2},
    }

    report = check_jobs(GOOD, stats, [], clocks_agree=False)

    assert report.executed_twice == 1 and report.payload_variants == 1
    assert any("apply-ghost-1 reached an agent" in v for v in report.violations)
    assert not any("apply-n1-1 reached" in v for v in report.violations)


def test_a_later_batch_issued_before_the_earlier_one_finished_is_caught() -> None:
    journal: list[dict[str, Any]] = [
        {"e": "accept", "payload": {"jobId": "apply-n1-1", "kind": "apply", "rollout": "r",
                                    "node": "n1", "issuedAt": "2026-01-01T00:00:00Z"}},
        {"e": "accept", "payload": {"jobId": "apply-n2-1", "kind": "apply", "rollout": "r",
                                    "node": "n2", "issuedAt": "2026-01-01T00:00:01Z"}},
        {"e": "finish", "jobId": "apply-n1-1", "finishedAt": "2026-01-01T00:00:05Z"},
    ]  # fmt: skip
    stats = {"received": {"apply-n1-1": 1, "apply-n2-1": 1}}

    report = check_jobs(GOOD, stats, journal)

    assert any("n2 (batch 2) was issued a job" in v for v in report.violations)
