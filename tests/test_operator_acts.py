"""Who paused or aborted a rollout, and why (docs/rollouts.md): the daemon
records the author and message of the commit that set ``paused: true`` or
``abort: true``, as rollback requests record who asked, and shows them in
``status NAME``, the hold message and the dashboard. The real daemon, the
simulated fleet, a real bare repository and the real CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.cli import main as cli
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.git import git, git_env

pytestmark = pytest.mark.slow

SLOW = "default: {action: succeed, delay: 3}\n"


def test_pause_and_abort_record_who_and_why_from_their_commits(
    tmp_path: Path, identity: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    kit = FleetKit.create(
        tmp_path, {"web-1": {"role": "web"}, "web-2": {"role": "web"}}, behaviour=SLOW
    )
    try:
        # Bob wrote the rollout; Alice (the operator at this terminal) pauses it.
        bob = git_env("Bob Builder", "bob@example.com")
        (kit.work / "rollouts").mkdir()
        (kit.work / "rollouts" / "web.yaml").write_text(
            rollout_yaml("web", selector={"role": "web"}, batchSize=1)
        )
        git("add", "-A", cwd=kit.work, env=bob)
        git("commit", "-q", "-m", "Roll out web", cwd=kit.work, env=bob)
        git("push", "-q", "origin", "HEAD:main", cwd=kit.work, env=bob)
        daemon = kit.daemon()
        kit.run_until(daemon, lambda s: s.get("web", {}).get("phase") == "running")

        git("pull", "-q", "--rebase", "origin", "main", cwd=kit.work)
        pause = ["pause", "web", "--repo", str(kit.work), "--push"]
        assert cli.main([*pause, "-m", "emergency: stop web now"]) == 0
        paused = kit.run_until(daemon, lambda s: s["web"].get("operatorPaused") is True)["web"]
        pause_commit = git("log", "-1", "--format=%H", "origin/main", "--", "rollouts/web.yaml",
                           cwd=kit.work)  # fmt: skip
        capsys.readouterr()
        assert cli.main(["status", "web", "--repo", str(kit.bare)]) == 0
        shown = capsys.readouterr().out
        dashboard = git("show", "main:status/README.md", cwd=kit.bare)

        # A later commit that touches the rollout again keeps who paused it.
        assert cli.main(["abort", "web", "--repo", str(kit.work), "--push", "-m", "bad model"]) == 0
        aborted = kit.run_until(daemon, lambda s: s["web"]["phase"] == "aborted")["web"]
        capsys.readouterr()
        assert cli.main(["status", "web", "--repo", str(kit.bare)]) == 0
        shown_aborted = capsys.readouterr().out
        dashboard_aborted = git("show", "main:status/README.md", cwd=kit.bare)
    finally:
        kit.close()

    alice = "Alice Operator <alice@example.com>"
    assert paused["pausedBy"]["author"] == alice
    assert paused["pausedBy"]["commit"] == pause_commit
    assert paused["pausedBy"]["message"].startswith("pause web: emergency: stop web now")
    assert paused["hold"]["reason"] == "operator_paused"
    assert "(paused by Alice Operator <alice@example.com> in " in paused["hold"]["message"]
    assert paused["hold"]["message"].endswith("emergency: stop web now)")
    assert "by Alice Operator <alice@example.com> in " in " ".join(shown.split())
    assert "emergency: stop web now" in " ".join(shown.split())
    assert "by Alice Operator" in dashboard

    assert aborted["abortedBy"]["author"] == alice
    assert aborted["abortedBy"]["message"].startswith("abort web: bad model")
    assert aborted["message"].startswith("aborted by Alice Operator <alice@example.com> in ")
    assert aborted["message"].endswith("abort web: bad model")
    assert "pausedBy" not in aborted
    assert "aborted   by Alice Operator" in shown_aborted
    assert "`aborted` by Alice Operator" in dashboard_aborted


def test_a_rollout_paused_before_it_starts_records_who_paused_it(
    tmp_path: Path, identity: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    kit = FleetKit.create(tmp_path, {"web-1": {"role": "web"}})
    try:
        (kit.work / "rollouts").mkdir()
        (kit.work / "rollouts" / "web.yaml").write_text(
            rollout_yaml("web", selector={"role": "web"}, batchSize=1, paused=True)
        )
        git("add", "-A", cwd=kit.work, env=identity)
        git("commit", "-q", "-m", "Roll out web, paused: wait for the change window",
            cwd=kit.work, env=identity)  # fmt: skip
        git("push", "-q", "origin", "HEAD:main", cwd=kit.work, env=identity)
        pause_commit = git("rev-parse", "HEAD", cwd=kit.work)
        daemon = kit.daemon()
        pending = kit.run_until(daemon, lambda s: s.get("web", {}).get("reason") == "paused")["web"]
        again = kit.run_until(daemon, lambda s: True)["web"]  # a later pass keeps the record
        capsys.readouterr()
        assert cli.main(["status", "web", "--repo", str(kit.bare)]) == 0
        shown = " ".join(capsys.readouterr().out.split())
        dashboard = git("show", "main:status/README.md", cwd=kit.bare)

        # Unpaused, it starts, and the record goes with the pause.
        git("pull", "-q", "--rebase", "origin", "main", cwd=kit.work)
        assert cli.main(["resume", "web", "--repo", str(kit.work), "--push"]) == 0
        started = kit.run_until(daemon, lambda s: s["web"]["phase"] != "pending")["web"]
    finally:
        kit.close()

    assert pending["phase"] == "pending" and pending["operatorPaused"] is False
    assert pending["pausedBy"] == {
        "author": "Alice Operator <alice@example.com>",
        "commit": pause_commit,
        "message": "Roll out web, paused: wait for the change window",
    }
    assert pending["message"].startswith("paused by the operator (spec.paused is true) before")
    assert "(by Alice Operator <alice@example.com> in " in pending["message"]
    assert again["pausedBy"] == pending["pausedBy"]
    assert "by Alice Operator <alice@example.com> in " in shown
    assert "by Alice Operator" in dashboard
    assert "pausedBy" not in started
