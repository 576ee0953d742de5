"""The fleet watch end to end (docs/operating.md, issue 18): real
``reconciler agent`` processes on 127.0.0.1, a bare repository pushed to
with `git`, and the real daemon loop (``Daemon.serve`` with its branch
watch) sweeping every second with ``offlineAfter: 3s``.

Each test first lets a live rollout put ``llama3.1-8b`` on gpu-a1 and
gpu-a2 (gpu-a3 is left alone) and waits until ``status/fleet.yaml`` shows
all three nodes ``ok``, running what their heartbeats report since.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reconciler.daemon.loop import Daemon
from reconciler.git.watch import BranchWatcher
from reconciler.readers.fleet_reader import read_fleet_status
from reconciler.spec.fleet_status import FleetNode, FleetStatus
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import AgentFleet
from tests.kit.git import git
from tests.kit.waiting import wait_for
from tests.markdown_render import plain_text

pytestmark = pytest.mark.slow

OFFLINE_AFTER = 3.0
SETTINGS = (
    "apiVersion: reconciler/v1\nkind: Settings\n"
    "spec:\n  offlineAfter: 3s\n  fleetCheck: {interval: 1s}\n"
)
OLD = b"provider: ollama\nmodel: llama3-8b\nprofile: default\n"
HAND_EDITED = b"provider: ollama\nmodel: hand-edited\nprofile: default\n"


@dataclass
class Watched:
    fleet: AgentFleet
    daemon: Daemon
    watcher: BranchWatcher
    thread: threading.Thread

    def tip(self) -> str:
        return git("rev-parse", "main", cwd=self.fleet.bare).strip()

    def fleet_status(self) -> FleetStatus | None:
        listed = git("ls-tree", "--name-only", "main", "status/", cwd=self.fleet.bare).split()
        if "status/fleet.yaml" not in listed:
            return None
        data = git("show", "main:status/fleet.yaml", cwd=self.fleet.bare).encode()
        return read_fleet_status("status/fleet.yaml", data)

    def node(self, name: str) -> FleetNode | None:
        fleet = self.fleet_status()
        return fleet.by_name().get(name) if fleet is not None else None

    def in_state(self, name: str, state: str) -> FleetNode | None:
        node = self.node(name)
        return node if node is not None and node.state == state else None

    @property
    def sweeps(self) -> int:
        return self.daemon.fleet_watch.sweeps

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "reconciler", "fleet", "--repo", str(self.fleet.bare), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[Watched]:
    nodes = {name: {"config": OLD, "keep_port": True} for name in ("gpu-a1", "gpu-a2", "gpu-a3")}
    fleet = AgentFleet.create(
        tmp_path,
        nodes,
        files={
            "reconciler.yaml": SETTINGS,
            "rollouts/llama.yaml": rollout_yaml(
                "llama", nodeIds=["gpu-a1", "gpu-a2"], batchSize=2, live=True
            ),
        },
    )
    daemon = fleet.daemon()
    watcher = BranchWatcher.local(fleet.bare, ["main"])
    thread = threading.Thread(target=daemon.serve, args=(watcher,), kwargs={"interval": 0.2})
    thread.start()
    w = Watched(fleet, daemon, watcher, thread)
    try:

        def settled() -> bool:
            phase = fleet.statuses().get("llama", {}).get("phase")
            status = w.fleet_status()
            return (
                phase == "completed"
                and status is not None
                and [(n.name, n.state, n.runtimes[0].model) for n in status.nodes]
                == [
                    ("gpu-a1", "ok", "llama3.1-8b"),
                    ("gpu-a2", "ok", "llama3.1-8b"),
                    ("gpu-a3", "ok", "llama3-8b"),
                ]
            )

        wait_for(settled, timeout=60, what="the rollout completed and every node ok")
        yield w
    finally:
        daemon.stop()
        thread.join(30)
        watcher.close()
        fleet.close()
    assert not thread.is_alive()


def test_a_config_edited_by_hand_on_the_node_is_drift_within_two_sweeps(
    watched: Watched,
) -> None:
    agent = watched.fleet.agents["gpu-a1"]
    jobs_before = len(agent.journal())
    before = watched.sweeps
    agent.config_path.write_bytes(HAND_EDITED)

    node = wait_for(lambda: watched.in_state("gpu-a1", "drift"), timeout=30, what="drift")

    assert watched.sweeps - before <= 2
    (runtime,) = node.runtimes
    assert (runtime.type, runtime.model) == ("hermes", "hand-edited")
    assert runtime.desired is not None
    assert (runtime.desired.model, runtime.desired.rollout) == ("llama3.1-8b", "llama")
    assert watched.in_state("gpu-a2", "ok") and watched.in_state("gpu-a3", "ok")
    subject = git(
        "log", "-1", "--format=%s", "main", "--", "status/fleet.yaml", cwd=watched.fleet.bare
    )
    assert subject.strip() == "status: fleet: gpu-a1 drift"
    dashboard = git("show", "main:status/README.md", cwd=watched.fleet.bare)
    assert "3 nodes: 2 ok, 0 offline, 1 drift, 0 unverified" in dashboard
    assert "hermes runs ollama/hand-edited/default, desired ollama/llama3.1-8b/default" in (
        plain_text(dashboard)  # as the forge shows it: what agents report is escaped
    )
    assert "cannot be read" not in dashboard  # fleet.yaml is not taken for a rollout's status

    shown = watched.cli()
    assert shown.returncode == 0, shown.stderr
    assert "fleet: 3 nodes: 2 ok, 0 offline, 1 drift, 0 unverified" in shown.stdout
    drift_line = next(line for line in shown.stdout.splitlines() if line.startswith("gpu-a1"))
    assert "drift" in drift_line and "ollama/hand-edited/default *" in drift_line
    assert "ollama/llama3.1-8b/default (llama)" in drift_line
    as_json = json.loads(watched.cli("--format", "json").stdout)
    assert as_json["counts"]["drift"] == 1

    # Reported, never corrected: no job went to the node, its file stays.
    later = watched.sweeps
    wait_for(lambda: watched.sweeps >= later + 2, timeout=20, what="two more sweeps")
    assert len(agent.journal()) == jobs_before
    assert agent.config_bytes() == HAND_EDITED


def test_a_killed_agent_is_offline_after_offline_after_and_ok_after_a_restart(
    watched: Watched,
) -> None:
    agent = watched.fleet.agents["gpu-a2"]
    agent.stop()
    killed = time.monotonic()

    node = wait_for(lambda: watched.in_state("gpu-a2", "offline"), timeout=30, what="offline")

    assert time.monotonic() - killed >= OFFLINE_AFTER
    assert node.runtimes[0].model == "llama3.1-8b"  # as last reported
    assert "1 offline" in git("show", "main:status/README.md", cwd=watched.fleet.bare)

    agent.restart()
    back = wait_for(lambda: watched.in_state("gpu-a2", "ok"), timeout=30, what="ok again")
    assert back.since > node.since


def test_reconciler_fleet_before_any_sweep_says_so(tmp_path: Path) -> None:
    from tests.kit.git import make_bare_repo

    bare = make_bare_repo(tmp_path, {"reconciler.yaml": SETTINGS}, message="Seed")
    shown = subprocess.run(
        [sys.executable, "-m", "reconciler", "fleet", "--repo", str(bare)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0
    assert "no fleet status yet" in shown.stdout and "fleetCheck.interval" in shown.stdout


def test_a_node_no_rollout_touched_is_ok(watched: Watched) -> None:
    node = watched.node("gpu-a3")
    assert node is not None and node.state == "ok"
    (runtime,) = node.runtimes
    # It runs something else than the rollout's target, and that is fine:
    # nothing ever said what it should run.
    assert (runtime.model, runtime.desired) == ("llama3-8b", None)


def test_an_idle_fleet_commits_nothing_over_twenty_sweeps(watched: Watched) -> None:
    tip = watched.tip()
    before = watched.sweeps

    wait_for(lambda: watched.sweeps >= before + 21, timeout=90, what="21 sweeps")

    assert watched.tip() == tip
    gauge = watched.daemon.metrics.registry.get_sample_value(
        "reconciler_fleet_nodes", {"state": "ok"}
    )
    assert gauge == 3
