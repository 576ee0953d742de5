"""The replays of ``test_trust_replays.py`` against the daemon as it runs
in production: ``reconciler run`` as a long-lived process (its caches kept
from pass to pass) and one real ``reconciler agent`` per node, each with
its own key. Rollout ``old`` (model-old) completes, then ``new``
(model-new); then a push without a key tries to start ``old`` again. The
agents must never be sent model-old again, and ``reconciler verify`` must
say why the status is held. One test per way in.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.kit import signed
from tests.kit.daemons import DaemonProcess
from tests.kit.fleets import AgentFleet
from tests.kit.signed import Repo
from tests.kit.waiting import wait_for

pytestmark = pytest.mark.slow

OLD_CONFIG = b"provider: ollama\nmodel: model-base\nprofile: default\n"
_PASSES = re.compile(r"^reconciler_passes_total (\S+)$", re.MULTILINE)


class Running:
    """A signed fleet of real agents and the daemon process acting on it."""

    def __init__(self, fleet: AgentFleet, repo: Repo, daemon: DaemonProcess) -> None:
        self.fleet, self.repo, self.daemon = fleet, repo, daemon
        self.metrics = f"http://{daemon.metrics_address()}/metrics"
        self.notes = 0  # pushes that change no spec, made to wake the daemon

    def passes(self) -> float:
        match = _PASSES.search(httpx.get(self.metrics, timeout=10).text)
        return float(match.group(1)) if match else 0.0

    def old_then_new(self) -> None:
        signed.old_then_new(self.repo, self.fleet.agents, lambda done: wait_for(done, 120))
        assert self.models() == [["model-old", "model-new"]] * 2

    def models(self) -> list[list[str]]:
        """Per agent, the model of every apply job it ever accepted."""
        return [
            [r["payload"]["target"]["model"] for r in agent.jobs_of_kind("apply")]
            for agent in self.fleet.agents.values()
        ]

    def held_for_a_while(self, path: str) -> None:
        """Three passes, each woken by a push that changes no spec (a
        deleted status branch wakes nothing); then the agents must have
        been sent nothing new, and the daemon must have said why."""
        for _ in range(3):
            seen = self.passes()
            self.wake()
            wait_for(lambda seen=seen: self.passes() > seen, 60, "a pass after the push")  # type: ignore[misc]
        assert self.models() == [["model-old", "model-new"]] * 2, "an old rollout ran again"
        assert self.daemon.seen(lambda line: "status_tampered" in line and path in line)

    def wake(self) -> None:
        self.notes += 1
        self.repo.push({f"notes/{self.notes}.txt": "nothing to act on\n"}, "A note", signed=False)


@pytest.fixture
def running(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Running]:
    branch = getattr(request, "param", None)
    settings = "apiVersion: reconciler/v1\nkind: Settings\nspec:\n  offlineAfter: 2m\n"
    if branch:
        settings += f"  statusBranch: {branch}\n"
    nodes = {n: {"config": OLD_CONFIG, "agent_key": "own"} for n in ("web-1", "web-2")}
    fleet = AgentFleet.create(tmp_path, nodes, files={"reconciler.yaml": settings})
    repo = Repo(fleet, tmp_path)
    repo.status_branch = branch or "main"
    try:
        with DaemonProcess(
            fleet.bare, fleet.key_path, "--allowed-signers", str(repo.signers), "--sign-commits",
            "--interval", "0.2s", "--poll", "0.2s", "--metrics", "127.0.0.1:0",
        ) as daemon:  # fmt: skip
            yield Running(fleet, repo, daemon)
    finally:
        fleet.close()


def verify_holds(repo: Repo, capsys: pytest.CaptureFixture[str], *names: str) -> None:
    daemon_key = str(repo.kit.root / "keys" / "reconciler.pub")
    code, out = repo.verify(capsys, "--daemon-key", daemon_key)
    assert code == 1, out
    for name in names:
        assert f"status/{name}.yaml is gone" in out, out


def test_deleting_a_status_and_touching_its_rollout_runs_nothing_again(
    running: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    running.old_then_new()
    old = (running.fleet.work / "rollouts" / "old.yaml").read_text()
    running.repo.push({"status/old.yaml": None, "rollouts/old.yaml": old + "# again\n"},
                      "Run old again", signed=False)  # fmt: skip
    running.held_for_a_while("status/old.yaml")
    verify_holds(running.repo, capsys, "old")


def test_a_status_only_deletion_after_a_signed_settings_change_runs_nothing_again(
    running: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    running.old_then_new()
    settings = "apiVersion: reconciler/v1\nkind: Settings\nspec: {offlineAfter: 3m}\n"
    running.repo.push({"reconciler.yaml": settings}, "Wait longer for agents", signed=True)
    running.repo.push({"status/old.yaml": None}, "Clean up", signed=False)
    running.held_for_a_while("status/old.yaml")
    verify_holds(running.repo, capsys, "old")


@pytest.mark.parametrize("running", ["reconciler-status"], indirect=True)
def test_deleting_the_status_branch_runs_nothing_again(
    running: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    running.old_then_new()
    running.repo.git("push", "-q", "origin", ":reconciler-status")
    running.held_for_a_while("status/old.yaml")
    assert running.daemon.seen(lambda line: "status_tampered" in line and "status/new.yaml" in line)
    assert running.repo.status("old", "reconciler-status") is None
    verify_holds(running.repo, capsys, "old", "new")
