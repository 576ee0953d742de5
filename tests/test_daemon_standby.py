"""Warm standby end to end, daemon side: the daemon, a real bare repository
and the simulated fleet as a real process on 127.0.0.1, whose nodes run two
slots per runtime. Each live apply carries standby and answers the slot it
kept warm; the daemon sends each node its release at the moment
keepPrevious says, records it, and never reopens a finished rollout."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli import main as cli
from reconciler.daemon.loop import Daemon
from reconciler.spec.times import parse_time
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit

THREE = {f"gpu-{i}": {"role": "gpu"} for i in range(1, 4)}
HEALTH_TIMEOUT = 60


def standby_rollout(keep: str, **spec: Any) -> dict[str, str]:
    spec.setdefault("selector", {"role": "gpu"})
    spec.setdefault("live", True)
    spec.setdefault("healthTimeout", f"{HEALTH_TIMEOUT}s")
    return {"rollouts/llama.yaml": rollout_yaml("llama", standby={"keepPrevious": keep}, **spec)}


def nodes_of(statuses: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in statuses["llama"]["nodes"]}


def all_released(statuses: dict[str, Any]) -> bool:
    llama = statuses.get("llama", {})
    kept = [n["standby"] for n in llama.get("nodes", ()) if "standby" in n]
    ended = llama.get("phase") in ("completed", "aborted")
    return ended and bool(kept) and all(k["releasedAt"] for k in kept)


def release_sent_at(node: dict[str, Any]) -> Any:
    """When the daemon sent the node's release: its deadline less healthTimeout."""
    return parse_time(node["standby"]["releaseDeadline"]) - timedelta(seconds=HEALTH_TIMEOUT)


def release_count(kit: FleetKit) -> int:
    return sum(1 for j in kit.fleet.stats()["executed"] if j.startswith("release-"))


def in_state(node: str, state: str) -> Callable[[dict[str, Any]], bool]:
    return lambda s: "llama" in s and nodes_of(s)[node]["state"] == state


Started = tuple[FleetKit, Daemon]


@pytest.fixture
def standby_fleet(tmp_path: Path) -> Iterator[Callable[..., Started]]:
    """Starts the three-node simulated fleet with ``behaviour``, pushes
    ``standby_rollout(keep, **spec)`` and makes a daemon for it."""
    kits: list[FleetKit] = []

    def start(behaviour: str, keep: str, **spec: Any) -> Started:
        kit = FleetKit.create(tmp_path, THREE, behaviour=behaviour)
        kits.append(kit)
        kit.push(standby_rollout(keep, **spec))
        return kit, kit.daemon()

    yield start
    for kit in kits:
        kit.close()


@pytest.mark.parametrize("keep", ["untilSoaked", "untilCompleted"])
def test_a_standby_rollout_completes_and_each_node_is_released_when_keep_previous_says(
    standby_fleet: Callable[..., Started], keep: str
) -> None:
    kit, daemon = standby_fleet("default: {action: succeed, delay: 0.2}\n", keep)

    done = kit.run_until(daemon, all_released, timeout=60)
    stats = kit.fleet.stats()
    sent = daemon.metrics.jobs_sent.labels(kind="release")._value.get()

    llama = done["llama"]
    nodes = nodes_of(done)
    assert llama["phase"] == "completed" and llama["frozen"]["standby"] == {"keepPrevious": keep}
    finished = parse_time(llama["finishedAt"])
    for name, node in nodes.items():
        assert node["outOfService"] == 0, name
        assert node["timings"]["routedAt"] == node["timings"]["servingAt"]
        assert node["standby"]["slot"] == "a" and node["standby"]["releaseError"] == ""
        assert node["standby"]["releaseJobId"].startswith("release-")
        if keep == "untilSoaked":  # released as the node passed, before the rollout ended
            assert release_sent_at(node) == parse_time(node["finishedAt"])
        else:  # kept warm until the rollout ended
            assert release_sent_at(node) >= finished
    if keep == "untilSoaked":
        second = nodes["gpu-2"]
        assert release_sent_at(nodes["gpu-1"]) <= parse_time(second["dispatchedAt"])
    # one release per node, each executed once, and counted
    assert sum(1 for j in stats["executed"] if j.startswith("release-")) == 3
    assert stats["maxExecuted"] == 1 and stats["maxPayloadVariants"] == 1
    assert sent == 3


def test_abort_releases_the_slots_kept_and_the_phase_stays_aborted(
    standby_fleet: Callable[..., Started],
) -> None:
    # gpu-2's apply never finishes: the rollout is aborted with gpu-1 switched.
    kit, daemon = standby_fleet("default: succeed\nnodes:\n  gpu-2: hang\n", "untilCompleted")
    kit.run_until(daemon, in_state("gpu-2", "dispatched"))
    assert release_count(kit) == 0  # untilCompleted: kept while the rollout runs

    kit.push(standby_rollout("untilCompleted", abort=True), message="Abort llama")
    ended = kit.run_until(daemon, lambda s: s["llama"]["phase"] == "aborted")
    released = kit.run_until(
        daemon, lambda s: bool((nodes_of(s)["gpu-1"]["standby"] or {}).get("releasedAt"))
    )

    assert released["llama"]["phase"] == "aborted"
    assert released["llama"]["transitions"] == ended["llama"]["transitions"]
    assert released["llama"]["finishedAt"] == ended["llama"]["finishedAt"]
    nodes = nodes_of(released)
    assert "standby" not in nodes["gpu-2"] and "standby" not in nodes["gpu-3"]
    assert release_count(kit) == 1


def test_a_failed_release_is_recorded_and_the_rollout_completes(
    standby_fleet: Callable[..., Started],
) -> None:
    kit, daemon = standby_fleet(
        "default: succeed\nnodes:\n  gpu-2: {release: fail}\n", "untilSoaked"
    )

    def settled(s: dict[str, Any]) -> bool:
        llama = s.get("llama", {})
        return llama.get("phase") == "completed" and all(
            n["standby"]["releasedAt"] or n["standby"]["releaseError"] for n in llama["nodes"]
        )

    done = kit.run_until(daemon, settled, timeout=60)

    nodes = nodes_of(done)
    assert nodes["gpu-2"]["standby"]["releasedAt"] is None
    assert nodes["gpu-2"]["standby"]["releaseError"].startswith("release failed: stop_failed")
    assert nodes["gpu-1"]["standby"]["releasedAt"] and nodes["gpu-3"]["standby"]["releasedAt"]
    assert done["llama"]["hold"] is None


def test_a_node_without_slots_refuses_the_standby_apply(
    standby_fleet: Callable[..., Started],
) -> None:
    kit, daemon = standby_fleet(
        "default: succeed\nnodes:\n  gpu-1: {slots: false}\n", "untilCompleted"
    )

    held = kit.run_until(daemon, lambda s: s.get("llama", {}).get("phase") == "paused")

    node = nodes_of(held)["gpu-1"]
    assert node["verdict"] == "failed" and "standby_not_supported" in node["error"]
    assert "standby" not in node


def test_validate_refuses_standby_on_a_dry_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "fleet"
    (root / "rollouts").mkdir(parents=True)
    (root / "rollouts/llama.yaml").write_text(
        rollout_yaml("llama", selector={"role": "gpu"}, standby={"keepPrevious": "untilSoaked"})
    )

    assert cli.main(["validate", str(root)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{root}/rollouts/llama.yaml:7:3: spec.standby: standby needs live: true: a dry run "
        "starts no slot on the node, so there is no previous slot to keep warm; set live: "
        "true, or remove standby"
    ]


def test_a_policy_restore_routes_back_to_the_warm_slot_and_its_release_follows(
    standby_fleet: Callable[..., Started],
) -> None:
    # gpu-2 switches slots but keeps serving the old model (drift): it fails,
    # and the rollback policy restores it by routing back to slot a.
    policy = {"onFailure": "rollback", "healthTimeout": "3s"}
    kit, daemon = standby_fleet(
        "default: succeed\nnodes:\n  gpu-2: drift\n", "untilCompleted", **policy
    )
    kit.run_until(daemon, in_state("gpu-2", "rolled_back"), timeout=60)
    assert release_count(kit) == 0  # nothing ended: every kept slot stays warm

    kit.push(standby_rollout("untilCompleted", **policy, abort=True))
    done = kit.run_until(daemon, all_released, timeout=60)

    nodes = nodes_of(done)
    restore = nodes["gpu-2"]["restore"]
    assert restore["error"] == "" and restore["timings"]["routedAt"]
    assert done["llama"]["phase"] == "aborted"
    # sent once the restore had ended (a release is idempotent on the node)
    sent = parse_time(nodes["gpu-2"]["standby"]["releaseDeadline"]) - timedelta(seconds=3)
    assert sent >= parse_time(restore["finishedAt"])
    assert "standby" not in nodes["gpu-3"]


def test_a_release_the_agent_missed_is_sent_again_once_it_is_back(
    standby_fleet: Callable[..., Started],
) -> None:
    behaviour = "default: succeed\nnodes:\n  gpu-3: {action: succeed, delay: 1}\n"
    kit, daemon = standby_fleet(behaviour, "untilCompleted")
    kit.run_until(daemon, in_state("gpu-3", "dispatched"))
    kit.fleet.set_behaviour(behaviour + "  gpu-1: unreachable\n")

    def release_sent(s: dict[str, Any]) -> bool:
        return bool((nodes_of(s)["gpu-1"].get("standby") or {}).get("releaseJobId"))

    sent = kit.run_until(daemon, release_sent)
    assert sent["llama"]["phase"] == "completed"
    for _ in range(3):  # passes while the agent cannot be reached
        daemon.run_pass()
    missed = nodes_of(kit.statuses())["gpu-1"]["standby"]
    kit.fleet.set_behaviour(behaviour)
    done = kit.run_until(daemon, all_released)

    assert missed["releasedAt"] is None and missed["releaseError"] == ""
    kept = nodes_of(done)["gpu-1"]["standby"]
    assert kept["releaseJobId"] == missed["releaseJobId"] and kept["releaseError"] == ""
    assert kit.fleet.stats()["executed"][kept["releaseJobId"]] == 1
