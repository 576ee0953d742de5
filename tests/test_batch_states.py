"""A batch's state as status files, ``status``, the dashboard and the page
say it: a batch with a failed, timed-out or unknown node is failed, held
or not, and never reads running or done; the engine keeps its own state
(reading a status file gives it back), so the rollout goes on as before."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.spec.batch_states import FAILING_NODE_STATES, LIFE_STATES, SHOWN, shown_state
from reconciler.spec.rollout_status import from_record, to_record
from tests.engine_world import World
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.git import git


def test_every_engine_state_has_a_shown_state_for_every_case() -> None:
    assert set(SHOWN) == {
        (life, worst, held)
        for life in LIFE_STATES
        for worst in ("fine", "unknown", "failing")
        for held in (False, True)
    }
    for state in ("failed", "timed_out"):
        assert state in FAILING_NODE_STATES
        assert shown_state("running", ["succeeded", state], held=True) == "failed"
        assert shown_state("done", [state], held=False) == "failed"
    # No verdict is never green or blue, and never failed while it runs.
    assert shown_state("running", ["unknown", "succeeded"], held=True) == "held"
    assert shown_state("running", ["unknown", "failed"], held=True) == "failed"
    assert shown_state("done", ["unknown"], held=False) == "failed"
    assert shown_state("running", ["dispatched"], held=True) == "held"
    assert shown_state("running", ["dispatched"], held=False) == "running"


def test_a_held_batch_with_a_failed_node_is_recorded_failed_and_reads_back_running() -> None:
    w = World(["a", "b", "c"])
    w.rollout(batch_size=2)
    w.step(0)
    w.fail("a")
    w.succeed("b")
    w.step(5)
    status = w.status()
    assert status.phase == "paused"
    assert status.batches[0].state == "running"  # the engine's own state

    record = to_record(status)

    assert record["batches"][0] == {"index": 1, "state": "failed", "settled": False}
    assert record["batches"][1] == {"index": 2, "state": "pending"}
    assert from_record(json.loads(json.dumps(record))) == status


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[FleetKit]:
    nodes = {"web-1": {"role": "web"}, "web-2": {"role": "web"}}
    behaviour = "default: succeed\nnodes:\n  web-1: {action: fail, error: 'model not found'}\n"
    kit = FleetKit.create(tmp_path, nodes, behaviour=behaviour)
    yield kit
    kit.close()


def test_a_failed_batch_is_failed_in_the_file_status_and_dashboard_and_skip_still_ends_it(
    kit: FleetKit,
) -> None:
    kit.push({"rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"}, batchSize=1)})
    daemon = kit.daemon()
    statuses = kit.run_until(daemon, lambda s: s.get("web", {}).get("phase") == "paused")
    assert statuses["web"]["batches"][0]["state"] == "failed"

    shown = subprocess.run(
        [sys.executable, "-m", "reconciler", "status", "web", "--repo", str(kit.bare)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    batch_line = next(line for line in shown.splitlines() if line.strip().startswith("1 "))
    assert "failed" in batch_line and "running" not in batch_line
    dashboard = git("show", "main:status/README.md", cwd=kit.bare)
    assert '· failed"]:::failed' in dashboard

    subprocess.run(
        [sys.executable, "-m", "reconciler", "skip", "web", "web-1", "--push"],
        check=True,
        capture_output=True,
        cwd=kit.work,
    )
    statuses = kit.run_until(daemon, lambda s: s.get("web", {}).get("phase") == "failed")
    assert [b["state"] for b in statuses["web"]["batches"]] == ["done", "done"]
