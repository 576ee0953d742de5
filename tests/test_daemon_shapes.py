"""Rollout shapes end to end (docs/rollouts.md): the daemon, a real bare
repository and the simulated fleet as a real process on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from reconciler.git.store import GitStore
from reconciler.git.watch import BranchWatcher
from reconciler.spec.times import format_time, parse_time
from tests.kit.documents import node_states, rollout_yaml
from tests.kit.fleets import FleetKit

FIVE = {f"web-{i}": {"role": "web"} for i in range(1, 6)}


@pytest.fixture
def five(tmp_path: Path) -> Iterator[FleetKit]:
    made = FleetKit.create(tmp_path, FIVE)
    yield made
    made.close()


def test_batches_one_then_half_on_five_nodes_dispatch_one_three_one(five: FleetKit) -> None:
    five.push(
        {"rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"}, batches='[1, "50%"]')}
    )
    daemon = five.daemon()
    sent: list[int] = []
    deadline = time.monotonic() + 30
    while five.statuses().get("web", {}).get("phase") != "completed":
        assert time.monotonic() < deadline, five.statuses()
        outcome = daemon.run_pass()
        if outcome.jobs_sent:
            sent.append(outcome.jobs_sent)
        time.sleep(0.05)

    assert sent == [1, 3, 1]
    status = five.statuses()["web"]
    assert [n["batch"] for n in status["nodes"]] == [1, 2, 2, 2, 3]
    assert status["frozen"]["batches"] == [1, "50%"]
    assert all(n["attempt"] == 1 for n in status["nodes"])


def serve_in_thread(kit: FleetKit, **kwargs: Any) -> tuple[threading.Thread, Any]:
    """The daemon's own loop, as ``reconciler run`` runs it: only a branch
    change, the interval while active, or ``wakeup`` brings the next pass."""
    daemon = kit.daemon()
    watcher = BranchWatcher.for_store(GitStore.open(str(kit.bare), "main"))
    thread = threading.Thread(target=daemon.serve, args=(watcher,), kwargs=kwargs, daemon=True)
    thread.start()
    return thread, daemon


def wait_for(kit: FleetKit, done: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        statuses = kit.statuses()
        if done(statuses):
            return statuses
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout}s; statuses: {statuses}")
        time.sleep(0.1)


def test_a_timed_pause_lifts_by_itself_through_the_daemons_wakeup(tmp_path: Path) -> None:
    kit = FleetKit.create(tmp_path, {"web-1": {"role": "web"}, "web-2": {"role": "web"}})
    try:
        kit.push(
            {
                "rollouts/web.yaml": rollout_yaml(
                    "web", selector={"role": "web"}, pauseAfter="[{batch: 1, for: 3s}]"
                )
            }
        )
        # Passes come only from the wakeup: a held rollout is not active, and
        # the interval and the re-read are far longer than the test.
        thread, daemon = serve_in_thread(kit, interval=0.2, reread=120.0)
        try:
            held = wait_for(kit, lambda s: s.get("web", {}).get("phase") == "paused", 20)
            hold = held["web"]["hold"]
            assert hold["reason"] == "pause_after_batch"
            assert parse_time(hold["until"]) == parse_time(hold["since"]) + timedelta(seconds=3)
            assert "starts by itself" in hold["message"]
            done = wait_for(kit, lambda s: s["web"]["phase"] == "completed", 15)
        finally:
            daemon.stop()
            thread.join(10)
        second = next(n for n in done["web"]["nodes"] if n["name"] == "web-2")
        assert parse_time(second["dispatchedAt"]) >= parse_time(hold["until"])
    finally:
        kit.close()


def test_a_timed_pause_with_a_failure_in_its_batch_waits_for_a_resume(tmp_path: Path) -> None:
    kit = FleetKit.create(
        tmp_path,
        {"web-1": {"role": "web"}, "web-2": {"role": "web"}},
        behaviour="default: succeed\nnodes:\n  web-1: {action: fail, error: broken}\n",
    )
    try:
        spec = {"selector": {"role": "web"}, "onFailure": "observe"}
        kit.push(
            {"rollouts/web.yaml": rollout_yaml("web", **spec, pauseAfter="[{batch: 1, for: 3s}]")}
        )
        daemon = kit.daemon()
        held = kit.run_until(daemon, lambda s: s.get("web", {}).get("phase") == "paused")
        assert held["web"]["hold"]["reason"] == "pause_after_batch"
        assert "until" not in held["web"]["hold"]
        outcome = daemon.run_pass()
        assert outcome.wakeup is None and not outcome.active
        time.sleep(4)
        for _ in range(3):
            daemon.run_pass()
        still = kit.statuses()["web"]
        assert still["phase"] == "paused"
        assert node_states(still) == {"web-1": "failed", "web-2": "pending"}

        kit.push(
            {
                "rollouts/web.yaml": rollout_yaml(
                    "web", **spec, pauseAfter="[{batch: 1, for: 3s}]", resumeRequest="'go'"
                )
            }
        )
        ended = kit.run_until(daemon, lambda s: s["web"]["phase"] == "failed")
        assert node_states(ended["web"]) == {"web-1": "failed", "web-2": "succeeded"}
    finally:
        kit.close()


def settings_with_freeze(start: datetime, end: datetime) -> str:
    return (
        "apiVersion: reconciler/v1\nkind: Settings\nspec:\n  freezes:\n"
        f'    - {{from: "{format_time(start)}", to: "{format_time(end)}", reason: test}}\n'
    )


def test_a_freeze_starting_mid_rollout_lets_the_batch_finish_and_starts_no_other(
    tmp_path: Path,
) -> None:
    kit = FleetKit.create(
        tmp_path,
        {"web-1": {"role": "web"}, "web-2": {"role": "web"}, "web-3": {"role": "web"}},
        behaviour="default: {action: succeed, delay: 5}\n",
    )
    try:
        # Each job takes 5 s; the freeze begins 4 s from now, while batch 1 runs.
        now = datetime.now(UTC).replace(microsecond=0)
        start, end = now + timedelta(seconds=4), now + timedelta(seconds=9)
        kit.push(
            {
                "reconciler.yaml": settings_with_freeze(start, end),
                "rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"}),
            }
        )
        daemon = kit.daemon()
        first = daemon.run_pass()
        assert first.jobs_sent == 1
        assert datetime.now(UTC) < start  # batch 1 started before the freeze

        during = kit.run_until(
            daemon, lambda s: node_states(s["web"])["web-1"] == "succeeded", timeout=20
        )["web"]
        assert datetime.now(UTC) < end
        assert during["phase"] == "running"
        assert during["waiting"] == {"reason": "freeze", "until": format_time(end)}
        assert node_states(during) == {"web-1": "succeeded", "web-2": "pending", "web-3": "pending"}

        ended = kit.run_until(daemon, lambda s: s["web"]["phase"] == "completed", timeout=40)
        nodes = {n["name"]: n for n in ended["web"]["nodes"]}
        assert parse_time(nodes["web-1"]["dispatchedAt"]) < start
        for name in ("web-2", "web-3"):
            assert parse_time(nodes[name]["dispatchedAt"]) >= end
        assert "waiting" not in ended["web"]
    finally:
        kit.close()


def test_after_waits_for_completion_and_stays_pending_when_the_dependency_fails(
    tmp_path: Path,
) -> None:
    kit = FleetKit.create(
        tmp_path,
        {n: {"role": n} for n in ("a-1", "a-2", "b-1", "b-2")},
        behaviour=(
            "default: {action: succeed, delay: 1}\nnodes:\n  b-1: {action: fail, error: broken}\n"
        ),
    )
    try:
        kit.push(
            {
                "rollouts/base.yaml": rollout_yaml("base", selector={"role": "a-1"}),
                "rollouts/top.yaml": rollout_yaml("top", selector={"role": "a-2"}, after="[base]"),
                "rollouts/broken.yaml": rollout_yaml(
                    "broken", selector={"role": "b-1"}, onFailure="observe"
                ),
                "rollouts/later.yaml": rollout_yaml(
                    "later", selector={"role": "b-2"}, after="[broken]"
                ),
            }
        )
        daemon = kit.daemon()
        daemon.run_pass()
        first = kit.statuses()
        assert first["base"]["phase"] == "running"
        assert first["top"]["phase"] == "pending" and first["top"]["reason"] == "after"
        assert "base" in first["top"]["message"]

        done = kit.run_until(
            daemon,
            lambda s: s["top"]["phase"] == "completed" and s["broken"]["phase"] == "failed",
        )
        assert parse_time(done["top"]["startedAt"]) >= parse_time(done["base"]["finishedAt"])
        later = done["later"]
        assert later["phase"] == "pending" and later["reason"] == "after_failed"
        assert "broken ended failed" in later["message"]
        assert later["startCommit"] is None  # never started: it claims no node
    finally:
        kit.close()
