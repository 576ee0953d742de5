"""The reconcile daemon against a real bare repository, real `git` pushes and
the simulated fleet on 127.0.0.1 (docs/architecture.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from reconciler.daemon.loop import PASS_STEPS, Daemon
from tests.kit.documents import node_states, rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.git import clone, commit, git

WEB = {"web-1": {"role": "web"}, "web-2": {"role": "web"}, "web-3": {"role": "web"}}


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[FleetKit]:
    kit = FleetKit.create(tmp_path, WEB)
    yield kit
    kit.close()


def phase_is(name: str, phase: str):  # type: ignore[no-untyped-def]
    return lambda statuses: statuses.get(name, {}).get("phase") == phase


def test_a_pushed_rollout_runs_to_completed_and_every_step_is_a_commit(kit: FleetKit) -> None:
    kit.push({"rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"}, batchSize=2)})
    daemon = kit.daemon()

    first = daemon.run_pass()

    # after one pass over a new rollout its first batch is recorded and sent
    assert first.commit is not None and first.jobs_sent == 2
    status = kit.statuses()["web"]
    assert status["phase"] == "running"
    assert node_states(status) == {"web-1": "dispatched", "web-2": "dispatched", "web-3": "pending"}

    final = kit.run_until(daemon, phase_is("web", "completed"))
    assert set(node_states(final["web"]).values()) == {"succeeded"}
    log = git("log", "--format=%an|%s", "main", "--", "status/web.yaml", cwd=kit.bare).splitlines()
    assert len(log) >= 2 and all(line.startswith("reconciler|status:") for line in log)
    shown = git("show", "main:status/README.md", cwd=kit.bare)
    assert "web" in shown and "completed" in shown


def test_an_idle_pass_leaves_the_branch_untouched(kit: FleetKit) -> None:
    kit.push({"rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"}, batchSize=3)})
    daemon = kit.daemon()
    kit.run_until(daemon, phase_is("web", "completed"))
    tip = git("rev-parse", "main", cwd=kit.bare)

    outcome = daemon.run_pass()

    assert outcome.commit is None and outcome.transitions == 0 and outcome.jobs_sent == 0
    assert git("rev-parse", "main", cwd=kit.bare) == tip


def test_the_daemon_writes_only_under_status(kit: FleetKit) -> None:
    kit.push({"rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"}, batchSize=3)})
    daemon = kit.daemon()
    kit.run_until(daemon, phase_is("web", "completed"))

    commits = git("log", "--author=reconciler", "--format=%H", "main", cwd=kit.bare).split()
    touched = set()
    for sha in commits:
        touched.update(git("show", "--name-only", "--format=", sha, cwd=kit.bare).split())
    assert commits and all(path.startswith("status/") for path in touched)


def test_an_invalid_rollout_is_reported_in_its_status_and_others_carry_on(kit: FleetKit) -> None:
    bad = rollout_yaml("bad", selector={"role": "web"}, batchSize=0)
    good = rollout_yaml("good", nodeIds=["web-1"])
    kit.push({"rollouts/bad.yaml": bad, "rollouts/good.yaml": good})
    daemon = kit.daemon()

    statuses = kit.run_until(daemon, phase_is("good", "completed"))

    assert statuses["bad"]["phase"] == "pending"
    text = str(statuses["bad"])
    assert "rollouts/bad.yaml" in text and "batchSize" in text


def test_a_person_pushing_while_the_daemon_commits_loses_nothing(kit: FleetKit) -> None:
    kit.push({"rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"})})
    daemon = kit.daemon()
    other = clone(kit.bare, kit.root / "other")
    pushed: list[str] = []
    stop = threading.Event()

    def person() -> None:
        for i in range(15):
            if stop.is_set():
                return
            commit(other, {f"docs/note-{i}.md": f"note {i}\n"}, f"note {i}")
            while True:  # as a person does: a rejected push is pulled, rebased and pushed again
                git("pull", "--rebase", "-q", "origin", "main", cwd=other)
                mine = git("rev-parse", "HEAD", cwd=other)
                git("push", "-q", "origin", "HEAD:main", cwd=other, check=False)
                landed = git("merge-base", "--is-ancestor", mine, "main", cwd=kit.bare, check=False)
                if landed == "" and mine in git("rev-list", "main", cwd=kit.bare).split():
                    pushed.append(mine)
                    break
            time.sleep(0.02)

    thread = threading.Thread(target=person)
    thread.start()
    try:
        kit.run_until(daemon, phase_is("web", "completed"), pause=0.01)
    finally:
        thread.join()
    history = set(git("rev-list", "main", cwd=kit.bare).split())
    notes = git("ls-tree", "--name-only", "main", "docs/", cwd=kit.bare).split()
    assert pushed and set(pushed) <= history
    assert len(notes) == len(pushed)
    assert git("rev-list", "--merges", "main", cwd=kit.bare) == ""  # linear


def test_two_daemons_on_one_repository_commit_each_transition_once(kit: FleetKit) -> None:
    kit.push({"rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"})})
    first, second = kit.daemon(), kit.daemon()
    errors: list[BaseException] = []

    def drive(daemon) -> None:  # type: ignore[no-untyped-def]
        try:
            kit.run_until(daemon, phase_is("web", "completed"), pause=0.0)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(d,)) for d in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert not errors
    bodies = git("log", "--format=%b", "main", "--", "status/web.yaml", cwd=kit.bare)
    lines = [line for line in bodies.splitlines() if "->" in line]
    assert len(lines) == len(set(lines)), "a transition was committed twice"
    stats = kit.fleet.stats()
    assert stats["maxPayloadVariants"] == 1 and stats["maxExecuted"] == 1


def test_a_corrupt_status_file_holds_its_rollout_and_is_never_overwritten(kit: FleetKit) -> None:
    kit.push({"rollouts/web.yaml": rollout_yaml("web", nodeIds=["web-1"]),
              "rollouts/other.yaml": rollout_yaml("other", nodeIds=["web-2"], allowOverlap=True)})  # fmt: skip
    daemon = kit.daemon()
    kit.run_until(daemon, lambda s: "web" in s and "other" in s)
    kit.push({"status/web.yaml": "phase: [this is not a status\n"}, "Hand-edit the status")
    broken = git("rev-parse", "main:status/web.yaml", cwd=kit.bare)

    kit.run_until(daemon, phase_is("other", "completed"))
    daemon.run_pass()

    assert git("rev-parse", "main:status/web.yaml", cwd=kit.bare) == broken
    dashboard = git("show", "main:status/README.md", cwd=kit.bare)
    assert (
        "cannot be read" in dashboard and "`web`" in dashboard and "status/web.yaml:" in dashboard
    )


def _daemon_process(
    kit: FleetKit, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "reconciler", "run", "--repo", str(kit.bare),
         "--key", str(kit.key_path), "--interval", "0.1s", *extra],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def test_killed_after_its_commit_and_before_sending_the_restart_sends_the_same_jobs(
    kit: FleetKit,
) -> None:
    kit.push({"rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"}, batchSize=2)})

    crashed = _daemon_process(kit, "--once", env={"RECONCILER_CRASH_AT": "after_push"})
    assert crashed.wait(30) == -signal.SIGKILL
    recorded = {n["name"]: n.get("jobId") for n in kit.statuses()["web"]["nodes"]}
    assert kit.fleet.stats()["received"] == {}  # committed, never sent

    restarted = _daemon_process(kit)
    try:
        deadline = time.monotonic() + 30
        while kit.statuses()["web"]["phase"] != "completed":
            assert time.monotonic() < deadline, "the restarted daemon did not finish the rollout"
            time.sleep(0.1)
    finally:
        restarted.send_signal(signal.SIGTERM)
        assert restarted.wait(15) == 0
    stats = kit.fleet.stats()
    assert recorded["web-1"] in stats["executed"] and recorded["web-2"] in stats["executed"]
    assert stats["maxPayloadVariants"] == 1 and stats["maxExecuted"] == 1


def test_run_once_reports_a_missing_repository_as_a_failure(tmp_path: Path, kit: FleetKit) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "reconciler", "run", "--repo", str(tmp_path / "nowhere"),
         "--key", str(kit.key_path), "--once"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "nowhere" in proc.stderr


def test_a_scheduled_rollout_starts_at_its_time_after_quiet_passes(kit: FleetKit) -> None:
    # Passes with nothing to do are not stepped again; the start time must
    # still wake the rollout.
    base = datetime.now(UTC).replace(microsecond=0)
    clock = {"now": base}
    start = base + timedelta(seconds=60)
    kit.push(
        {
            "rollouts/web.yaml": rollout_yaml(
                "web", nodeIds=["web-1"], startAt=f'"{start:%Y-%m-%dT%H:%M:%SZ}"'
            )
        }
    )
    daemon = kit.daemon(clock=lambda: clock["now"])

    daemon.run_pass()
    assert kit.statuses()["web"]["phase"] == "scheduled"
    tip = git("rev-parse", "main", cwd=kit.bare)
    for seconds in (10, 30, 59):
        clock["now"] = base + timedelta(seconds=seconds)
        assert daemon.run_pass().jobs_sent == 0
    assert git("rev-parse", "main", cwd=kit.bare) == tip

    clock["now"] = start
    outcome = daemon.run_pass()

    assert outcome.jobs_sent == 1
    assert kit.statuses()["web"]["phase"] == "running"


def test_the_pass_is_its_named_steps_in_design_order_each_saying_what_it_touches() -> None:
    assert PASS_STEPS == ("read", "verify", "observe", "step", "fleet", "commit", "notify", "send")
    for name in PASS_STEPS:
        doc = getattr(Daemon, f"_{name}").__doc__ or ""
        assert "Touches:" in doc, name
