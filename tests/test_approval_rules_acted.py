"""Approval rules when the person who signed every spec commit leaves the
allowed-signers file (docs/approval-rules.md): the next signed commit is
judged by the rules of the tree the daemon last acted on, which its state
directory records, never by the rules the commit writes itself. Real `git`
and `ssh-keygen` signatures, approvals by ``reconciler approve``, the
daemon's ``run --once`` (a restart every pass) against the simulated fleet.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.cli.main import main
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.keys import make_key
from tests.kit.signed import Repo

RULES = """apiVersion: reconciler/v1
kind: Settings
spec:
  approvalRules:
    - name: serving-owners
      nodes: {selector: {role: serving}}
      principals: [sre@example.com]
      require: 1
    - name: settings-owners
      settings: true
      principals: [carol@example.com]
      require: 1
"""
NO_RULES = "apiVersion: reconciler/v1\nkind: Settings\nspec: {}\n"
NODES = {"res-1": {"role": "research"}, "srv-1": {"role": "serving"}}


def test_a_signer_leaving_keeps_the_rules_the_daemon_acted_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kit = FleetKit.create(tmp_path, NODES)
    try:
        repo = Repo(kit, tmp_path)  # ada signs every spec commit
        people = {n: make_key(tmp_path / n, comment=n) for n in ("bob", "carol", "sre", "res")}
        ada = repo.signers.read_text()
        others = "".join(f"{n}@example.com {k.text}\n" for n, k in people.items())
        repo.signers.write_text(ada + others)
        repo.extra = ["--require-approvals", "1"]

        def approve(commit: str, *who: str) -> None:
            for name in who:
                key = str(people[name].private)
                assert (
                    main(["approve", commit, "--key", key, "--repo", str(kit.work), "--push"]) == 0
                )

        research = rollout_yaml("res", nodeIds=["res-1"])
        first = repo.push(
            {"reconciler.yaml": RULES, "rollouts/res.yaml": research}, "rules", signed=True
        )
        approve(first, "carol", "sre")
        repo.run_until(lambda: repo.phase("res") == "completed")

        # ada leaves; bob deletes every rule and starts a rollout on the
        # serving node, approved by one research reviewer
        repo.signers.write_text(others)
        repo.alice = people["bob"].private
        serving = rollout_yaml("srv", nodeIds=["srv-1"])
        loose = repo.push(
            {"reconciler.yaml": NO_RULES, "rollouts/srv.yaml": serving}, "loose", signed=True
        )
        approve(loose, "res")
        for _ in range(3):
            repo.run_once()
        assert [p for p in repo.accepted() if p["node"] == "srv-1"] == []
        assert repo.phase("srv") in (None, "pending")
        code, out = repo.verify(capsys, "--require-approvals", "1")
        assert code == 1 and "needs 1 of settings-owners (carol@example.com); has 0" in out, out
        assert "needs 1 of serving-owners (sre@example.com); has 0" in out, out

        # the owners the acted-on tree names approve it: now it goes
        approve(loose, "carol", "sre")
        repo.run_until(lambda: repo.phase("srv") == "completed")
        assert [p["node"] for p in repo.accepted() if p["rollout"] == "srv"] == ["srv-1"]
    finally:
        kit.close()
