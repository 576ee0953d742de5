"""The stop-the-line switch end to end: a signed ``reconciler freeze
--push`` during a running rollout stops its next batch, and ``unfreeze
--push`` lets it go on. The daemon runs as a real process verifying
signatures (``--allowed-signers``), the simulated fleet answers as agents,
the clone signs its commits as the person's git config says."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli import main as cli
from reconciler.spec.safe_yaml import load_yaml
from tests.kit.daemons import DaemonProcess
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.git import git
from tests.kit.keys import make_key
from tests.kit.waiting import wait_for

pytestmark = pytest.mark.slow

NODES = {f"web-{n}": {"role": "web"} for n in (1, 2, 3)}
# The first node's job takes long enough for the freeze to land while it runs.
BEHAVIOUR = "default: succeed\nnodes:\n  web-1: {action: succeed, delay: 15}\n"


def status(kit: FleetKit) -> dict[str, Any]:
    try:
        text = git("show", "main:status/web.yaml", cwd=kit.bare)
    except AssertionError:
        return {}
    return dict(load_yaml("status/web.yaml", text.encode()))


def states(record: dict[str, Any]) -> dict[str, str]:
    return {n["name"]: n["state"] for n in record.get("nodes", [])}


def accepted(kit: FleetKit) -> list[str]:
    journal = kit.root / "sim" / "state" / "sim-journal.jsonl"
    lines = journal.read_text().splitlines() if journal.exists() else []
    events = [json.loads(line) for line in lines if line]
    return [e["payload"]["node"] for e in events if e.get("e") == "accept"]


FREEZE = ["freeze", "--reason", "incident 7", "--for", "1h", "--push"]


def signed_rollout(tmp_path: Path) -> tuple[FleetKit, Path]:
    """A fleet whose clone signs its commits as alice (an allowed signer),
    with a signed rollout of three batches pushed; the allowed signers file."""
    kit = FleetKit.create(tmp_path, NODES, behaviour=BEHAVIOUR)
    alice = make_key(tmp_path / "alice", comment="alice").private
    signers = tmp_path / "allowed_signers"
    signers.write_text(f"alice@example.com {alice.with_suffix('.pub').read_text()}")
    for key, value in (
        ("gpg.format", "ssh"),
        ("user.signingKey", str(alice)),
        ("commit.gpgsign", "true"),
    ):
        git("config", key, value, cwd=kit.work)
    (kit.work / "rollouts").mkdir()
    (kit.work / "rollouts" / "web.yaml").write_text(
        rollout_yaml("web", selector={"role": "web"}, batchSize=1)
    )
    git("add", "-A", cwd=kit.work)
    git("commit", "-q", "-m", "Roll out web", cwd=kit.work)
    git("push", "-q", "origin", "HEAD:main", cwd=kit.work)
    return kit, signers


@contextmanager
def first_batch_running(kit: FleetKit, signers: Path) -> Iterator[DaemonProcess]:
    """The daemon verifying signatures, once the first batch's job is out."""
    with DaemonProcess(
        kit.bare, kit.key_path, "--allowed-signers", str(signers), "--interval", "1s"
    ) as daemon:
        wait_for(lambda: accepted(kit) == ["web-1"], 60, "the first batch's job")
        yield daemon


def test_a_signed_freeze_stops_the_next_batch_and_unfreeze_lets_it_go_on(
    tmp_path: Path, identity: dict[str, str]
) -> None:
    kit, signers = signed_rollout(tmp_path)
    try:
        with first_batch_running(kit, signers) as daemon:
            assert cli.main([*FREEZE, "--repo", str(kit.work)]) == 0
            freeze_commit = git("rev-parse", "HEAD", cwd=kit.work)
            settings = load_yaml("reconciler.yaml", (kit.work / "reconciler.yaml").read_bytes())

            held = wait_for(
                lambda: (s := status(kit)).get("waiting", {}).get("reason") == "freeze" and s,
                90,
                "the rollout to wait for the freeze",
            )
            git("pull", "-q", "--rebase", "origin", "main", cwd=kit.work)
            assert cli.main(["unfreeze", "--repo", str(kit.work), "--push"]) == 0
            unfreeze_commit = git("rev-parse", "HEAD", cwd=kit.work)
            done = wait_for(
                lambda: (s := status(kit)).get("phase") == "completed" and s,
                90,
                "the rollout to complete",
            )
            jobs_after = accepted(kit)
            log = list(daemon.lines)
    finally:
        kit.close()

    assert held["phase"] == "running" and held.get("hold") is None
    assert states(held) == {"web-1": "succeeded", "web-2": "pending", "web-3": "pending"}
    assert held["waiting"]["until"] == settings["spec"]["freezes"][-1]["to"]
    assert states(done) == dict.fromkeys(NODES, "succeeded")
    assert jobs_after == ["web-1", "web-2", "web-3"]
    for commit in (freeze_commit, unfreeze_commit):
        assert "gpgsig" in git("cat-file", "commit", commit, cwd=kit.bare)
    assert not [line for line in log if "unverified" in line or "Traceback" in line]


def test_an_unsigned_freeze_is_not_acted_on_and_the_rollout_goes_on(
    tmp_path: Path, identity: dict[str, str]
) -> None:
    """Under verification a freeze is a change to reconciler.yaml like any
    other: pushed unsigned, the daemon says it does not act on it, and the
    rollout's next batches go out as if it were not there."""
    kit, signers = signed_rollout(tmp_path)
    try:
        with first_batch_running(kit, signers) as daemon:
            git("config", "commit.gpgsign", "false", cwd=kit.work)
            assert cli.main([*FREEZE, "--repo", str(kit.work)]) == 0
            freeze_commit = git("rev-parse", "HEAD", cwd=kit.work)
            done = wait_for(
                lambda: (s := status(kit)).get("phase") == "completed" and s,
                90,
                "the rollout to complete",
            )
            log = list(daemon.lines)
    finally:
        kit.close()

    assert "gpgsig" not in git("cat-file", "commit", freeze_commit, cwd=kit.bare)
    assert "freeze" in git("show", "main:reconciler.yaml", cwd=kit.bare)
    assert states(done) == dict.fromkeys(NODES, "succeeded")
    assert "waiting" not in done or not done["waiting"]
    assert accepted(kit) == ["web-1", "web-2", "web-3"]
    refused = [line for line in log if "push_refused" in line]
    assert refused and freeze_commit[:12] in refused[0], log
