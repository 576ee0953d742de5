"""A hold that only a person can lift needs no faster passes than an idle
fleet (DESIGN.md section 6, step 7): the pass says it is not active, so the
loop sleeps until the branch changes, not for ``--interval``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fleetkit import FleetKit, rollout_yaml


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[FleetKit]:
    made = FleetKit.create(tmp_path, {"web-1": {"role": "web"}, "web-2": {"role": "web"}})
    yield made
    made.close()


def test_a_pause_after_batch_hold_is_not_active_and_a_resume_is(kit: FleetKit) -> None:
    kit.push(
        {
            "rollouts/web.yaml": rollout_yaml(
                "web", selector={"role": "web"}, batchSize=1, pauseAfter=[1]
            )
        }
    )
    daemon = kit.daemon()
    first = daemon.run_pass()
    assert first.active  # batch 1 is in flight: the interval applies

    statuses = kit.run_until(daemon, lambda s: s["web"]["phase"] == "paused")
    assert statuses["web"]["hold"]["reason"] == "pause_after_batch"
    held = daemon.run_pass()
    assert not held.active and held.wakeup is None

    kit.push(
        {
            "rollouts/web.yaml": rollout_yaml(
                "web", selector={"role": "web"}, batchSize=1, pauseAfter=[1], resume="'1'"
            )
        }
    )
    assert daemon.run_pass().active  # resumed: batch 2 goes out
