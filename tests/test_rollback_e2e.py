"""Explicit rollback and backups, end to end (docs/rollouts.md and docs/protocol.md and docs/cli.md).

Real parts only: three-or-fewer ``reconciler agent`` processes on 127.0.0.1,
each with its own state directory, ``--allow-live-apply`` and a runtime
config written before the rollout; a bare repository pushed to with the
`git` binary; the in-process ``Daemon`` running real reconcile passes; and
the ``reconciler rollback`` / ``resume`` commands run as processes with the
operator's git identity, their commits pushed like a person pushes them.

The pre-rollout configs carry comments and an extra key, which a live apply
does not keep, so "restored" below means byte for byte.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli import main as cli
from reconciler.spec.times import parse_time
from tests.kit.agents import RealAgent
from tests.kit.documents import node_map, rollback_outcomes, rollout_yaml
from tests.kit.fleets import AgentFleet
from tests.kit.git import git, git_env
from tests.kit.mitm import Mitm

RITA = ("Rita Rollback", "rita@example.com")
BORIS = ("Boris Resume", "boris@example.com")
ROLLBACKER = f"{RITA[0]} <{RITA[1]}>"
TARGET_MODEL = "llama3.1-8b"  # tests.kit.documents.TARGET


def old_config(node: str, layers: int = 33) -> bytes:
    """A node's config before any rollout: hand-written, with a comment."""
    return (
        f"# hermes on {node}, tuned by hand\n"
        f"provider: ollama\nmodel: llama3-8b   # the old model\nprofile: default\n"
        f"gpuLayers: {layers}\n"
    ).encode()


def run_cli(
    fleet: AgentFleet, *args: str, who: tuple[str, str] = RITA
) -> subprocess.CompletedProcess[str]:
    """``reconciler ARGS --repo WORK`` as Rita (or ``who``) runs it, after a
    pull so the working tree holds the daemon's latest status."""
    fleet.pull()
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *args, "--repo", str(fleet.work)],
        env=git_env(*who),
        capture_output=True,
        text=True,
        timeout=60,
    )


def rollback(fleet: AgentFleet, *args: str) -> subprocess.CompletedProcess[str]:
    """``reconciler rollback ARGS --commit``, then push, as an operator does."""
    done = run_cli(fleet, "rollback", *args, "--commit")
    assert done.returncode == 0, done.stderr + done.stdout
    fleet.git_push()
    return done


def phase(name: str, *phases: str) -> Any:
    return lambda statuses: statuses.get(name, {}).get("phase") in phases


def rollback_done(name: str, request: str) -> Any:
    def check(statuses: Mapping[str, Any]) -> bool:
        records = statuses.get(name, {}).get("rollbacks", [])
        return any(r["id"] == request and r["state"] in ("done", "refused") for r in records)

    return check


def record_of(status: Mapping[str, Any], request: str) -> dict[str, Any]:
    (record,) = [r for r in status["rollbacks"] if r["id"] == request]
    return dict(record)


def apply_backup(agent: RealAgent, attempt: int = 1) -> str:
    """The backup the agent took for this attempt's apply job (from its journal)."""
    (record,) = [
        r
        for r in agent.jobs_of_kind("apply")
        if r["payload"]["attempt"] == attempt and r["payload"]["mode"] == "live"
    ]
    backup: str = record["backup_id"]
    assert backup, record
    return backup


@pytest.fixture
def fleets() -> Iterator[list[AgentFleet]]:
    made: list[AgentFleet] = []
    yield made
    for fleet in made:
        fleet.close()


# --- a failed rollout, rolled back -------------------------------------------------


def test_rollback_all_restores_the_changed_nodes_and_leaves_the_failed_one_alone(
    tmp_path: Path, fleets: list[AgentFleet]
) -> None:
    nodes = ["gpu-a1", "gpu-a2", "gpu-a3"]
    fleet = AgentFleet.create(
        tmp_path,
        {
            "gpu-a1": {"config": old_config("gpu-a1", 31)},
            "gpu-a2": {"config": old_config("gpu-a2", 32)},
            # the runtime does not come back with the new model on the third node
            "gpu-a3": {"config": old_config("gpu-a3", 33), "after_apply": "echo no GPU; exit 1"},
        },
    )
    fleets.append(fleet)
    text = "# the llama upgrade, one node at a time\n" + rollout_yaml(
        "llama", nodeIds=nodes, live=True, onFailure="pause"
    )
    fleet.push({"rollouts/llama.yaml": text}, "Roll out llama3.1")
    daemon = fleet.daemon()
    statuses = fleet.run_until(daemon, phase("llama", "paused"))
    held = statuses["llama"]["hold"]
    assert held["reason"] == "health_failed" and held["nodes"] == ["gpu-a3"]
    assert fleet.agents["gpu-a1"].config_bytes() != old_config("gpu-a1", 31)
    assert fleet.agents["gpu-a3"].config_bytes() == old_config("gpu-a3", 33)

    done = run_cli(
        fleet, "rollback", "llama", "--all", "--message", "llama3.1 breaks a3", "--commit"
    )
    assert done.returncode == 0, done.stderr

    # the CLI added one line and kept the rest of the file, comments included
    assert "spec.rollbackRequest: (absent) -> {id: r1, nodes: all}" in done.stdout
    numstat = git("diff", "--numstat", "HEAD~1", "HEAD", cwd=fleet.work)
    assert numstat.split() == ["1", "0", "rollouts/llama.yaml"]
    assert git("log", "-1", "--format=%an|%s", cwd=fleet.work) == (
        f"{RITA[0]}|rollback llama: llama3.1 breaks a3"
    )
    # Someone else's resume pushed with it: nothing else is dispatched while
    # restores run, and the rollback is still Rita's.
    resumed = run_cli(fleet, "resume", "llama", "--commit", who=BORIS)
    assert resumed.returncode == 0, resumed.stderr
    fleet.git_push()
    statuses = fleet.run_until(daemon, rollback_done("llama", "r1"))

    status = statuses["llama"]
    record = record_of(status, "r1")
    assert record["requestedBy"] == ROLLBACKER
    assert rollback_outcomes(record) == {
        "gpu-a1": "rolled_back",
        "gpu-a2": "rolled_back",
        "gpu-a3": "skipped",
    }
    skipped = {n["name"]: n["message"] for n in record["nodes"]}["gpu-a3"]
    assert skipped.startswith("never changed")
    for name, layers in (("gpu-a1", 31), ("gpu-a2", 32), ("gpu-a3", 33)):
        assert fleet.agents[name].config_bytes() == old_config(name, layers), name
    # each restore put back the backup of the node's own first apply
    for name in ("gpu-a1", "gpu-a2"):
        agent = fleet.agents[name]
        (restore,) = agent.jobs_of_kind("restore")
        assert restore["state"] == "succeeded"
        assert restore["payload"]["backupId"] == apply_backup(agent)
    # the third node was left alone: no restore job ever reached it
    assert fleet.agents["gpu-a3"].jobs_of_kind("restore") == []
    states = {n: r["state"] for n, r in node_map(status).items()}
    assert states == {"gpu-a1": "rolled_back", "gpu-a2": "rolled_back", "gpu-a3": "failed"}
    assert status["phase"] == "paused" and status["hold"]["reason"] == "health_failed"
    assert len(fleet.agents["gpu-a3"].jobs_of_kind("apply")) == 1
    (refusal,) = [c for c in status["conditions"] if c["type"] == "resume_refused"]
    assert "restore is in progress" in refusal["message"]

    # The same id again, in later commits (another edit, then the request
    # removed and written back): handled once, so each node restored once.
    again = text + "  rollbackRequest: {id: r1, nodes: all}  # done, see status\n"
    fleet.push({"rollouts/llama.yaml": again}, "Note the rollback")
    fleet.run_until(daemon, lambda s: True)
    fleet.push({"rollouts/llama.yaml": text}, "Drop the rollback request")
    fleet.run_until(daemon, lambda s: True)
    fleet.push({"rollouts/llama.yaml": text + "  rollbackRequest: {id: r1, nodes: [gpu-a1]}\n"})
    for _ in range(3):
        daemon.run_pass()
    for agent in fleet.agents.values():
        agent.wait_idle()
    assert [len(a.jobs_of_kind("restore")) for a in fleet.agents.values()] == [1, 1, 0]
    assert [r["id"] for r in fleet.statuses()["llama"]["rollbacks"]] == ["r1"]


# --- two applies, two backups ----------------------------------------------------

# The first apply succeeds, but the after-apply hook (say, a configuration
# manager run) writes a different model right after it: the heartbeat shows
# drift until the deadline, so the first attempt fails. A resume applies
# again, which backs up the drifted config: the config between the attempts.
DRIFT = (
    'if [ "$RECONCILER_KIND" = apply ] && [ "$RECONCILER_ATTEMPT" = 1 ]; then '
    "printf 'provider: ollama\\nmodel: hand-picked\\nprofile: default\\n' > \"$RECONCILER_CONFIG\"; "
    "fi"
)


def test_a_node_applied_twice_is_restored_to_its_config_from_before_the_rollout(
    tmp_path: Path, fleets: list[AgentFleet]
) -> None:
    # Retention 1 as well: the first backup of a rollout outlives the count.
    fleet = AgentFleet.create(
        tmp_path, {"gpu-b1": {"config": old_config("gpu-b1"), "after_apply": DRIFT, "retention": 1}}
    )
    fleets.append(fleet)
    agent = fleet.agents["gpu-b1"]
    text = rollout_yaml("mistral", nodeIds=["gpu-b1"], live=True, healthTimeout="1m")
    fleet.push({"rollouts/mistral.yaml": text})
    daemon = fleet.daemon()
    daemon.run_pass()
    agent.wait_idle()
    daemon.run_pass()
    assert node_map(fleet.statuses()["mistral"])["gpu-b1"]["state"] == "dispatched"  # drifting

    fleet.clock.advance(61)  # the deadline passes with the heartbeat still drifted
    statuses = fleet.run_until(daemon, phase("mistral", "paused"))
    node = node_map(statuses["mistral"])["gpu-b1"]
    assert node["state"] == "failed" and node["error"].startswith("drift")
    between = agent.config_bytes()
    assert between is not None and b"hand-picked" in between

    resumed = run_cli(fleet, "resume", "mistral", "--commit")
    assert resumed.returncode == 0, resumed.stderr
    fleet.git_push()
    statuses = fleet.run_until(daemon, phase("mistral", "completed"))
    assert node_map(statuses["mistral"])["gpu-b1"]["attempt"] == 2
    first, second = apply_backup(agent, 1), apply_backup(agent, 2)
    assert [b["backupId"] for b in agent.backups()] == [second, first]
    assert node_map(statuses["mistral"])["gpu-b1"]["firstBackupId"] == first

    rollback(fleet, "mistral", "--all")
    statuses = fleet.run_until(daemon, rollback_done("mistral", "r1"))

    assert rollback_outcomes(record_of(statuses["mistral"], "r1")) == {"gpu-b1": "rolled_back"}
    (restore,) = agent.jobs_of_kind("restore")
    assert restore["payload"]["backupId"] == first
    assert agent.config_bytes() == old_config("gpu-b1")  # not the config between the attempts
    assert statuses["mistral"]["phase"] == "completed"
    # retention 1: the restore's own backup is the newest; the rollout's first
    # backup is still kept; the one between them is gone
    assert [b["jobId"] for b in agent.backups()] == [restore["job_id"], apply_job(agent, 1)]


def apply_job(agent: RealAgent, attempt: int) -> str:
    (record,) = [r for r in agent.jobs_of_kind("apply") if r["payload"]["attempt"] == attempt]
    job_id: str = record["job_id"]
    return job_id


# --- the first apply's result never seen ---------------------------------------------


def test_a_node_whose_apply_was_never_seen_is_found_in_the_agents_backup_list(
    tmp_path: Path, fleets: list[AgentFleet]
) -> None:
    settings = "apiVersion: reconciler/v1\nkind: Settings\nspec:\n  offlineAfter: 30s\n"
    fleet = AgentFleet.create(
        tmp_path,
        {"gpu-f1": {"config": old_config("gpu-f1"), "keep_port": True}},
        files={"reconciler.yaml": settings},
    )
    fleets.append(fleet)
    agent = fleet.agents["gpu-f1"]
    fleet.push({"rollouts/gone.yaml": rollout_yaml("gone", nodeIds=["gpu-f1"], live=True)})
    daemon = fleet.daemon()
    daemon.run_pass()  # records and sends the apply; the agent applies it
    agent.wait_idle()
    agent.stop()  # before the daemon hears how it went

    daemon.run_pass()  # unreachable from now
    fleet.clock.advance(31)
    statuses = fleet.run_until(daemon, phase("gone", "paused"))
    node = node_map(statuses["gone"])["gpu-f1"]
    assert node["state"] == "unknown" and node["firstBackupKnown"] is False
    assert node["firstBackupId"] is None

    # Asked while the agent is still down: accepted, waiting for its backup list.
    rollback(fleet, "gone", "--all")
    statuses = fleet.run_until(daemon, lambda s: bool(s["gone"]["rollbacks"]))
    assert record_of(statuses["gone"], "r1")["state"] == "waiting"
    # Asked again with a new id: the first request, which sent nothing, is replaced.
    rollback(fleet, "gone", "--all")
    statuses = fleet.run_until(daemon, lambda s: len(s["gone"]["rollbacks"]) == 2)
    first = record_of(statuses["gone"], "r1")
    assert first["state"] == "refused" and 'replaced by "r2"' in first["message"]
    assert record_of(statuses["gone"], "r2")["state"] == "waiting"
    # Someone else resumes meanwhile: refused, nothing is dispatched while it waits.
    resumed = run_cli(fleet, "resume", "gone", "--commit", who=BORIS)
    assert resumed.returncode == 0, resumed.stderr
    fleet.git_push()
    statuses = fleet.run_until(daemon, lambda s: s["gone"]["lastHandledResume"] != "")
    (refusal,) = [c for c in statuses["gone"]["conditions"] if c["type"] == "resume_refused"]
    assert 'rollbackRequest "r2" waits' in refusal["message"]
    assert node_map(statuses["gone"])["gpu-f1"]["attempt"] == 1
    agent.restart()

    statuses = fleet.run_until(daemon, rollback_done("gone", "r2"))

    record = record_of(statuses["gone"], "r2")
    assert rollback_outcomes(record) == {"gpu-f1": "rolled_back"}
    assert record["requestedBy"] == ROLLBACKER  # not the author of the newer resume commit
    assert len(agent.jobs_of_kind("apply")) == 1
    (restore,) = agent.jobs_of_kind("restore")
    assert restore["payload"]["backupId"] == apply_backup(agent)
    assert agent.config_bytes() == old_config("gpu-f1")


# --- a completed rollout, rolled back ------------------------------------------------

RESTORE_FAILS = '[ "$RECONCILER_KIND" != restore ] || { echo model gone >&2; exit 1; }'


def test_rollback_of_a_completed_rollout_keeps_it_completed_and_status_lists_the_rollback(
    tmp_path: Path, fleets: list[AgentFleet], capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = AgentFleet.create(
        tmp_path,
        {
            "gpu-c1": {"config": old_config("gpu-c1", 1)},
            "gpu-c2": {"config": old_config("gpu-c2", 2)},
            # its runtime refuses to go back to the old model
            "gpu-c3": {"config": old_config("gpu-c3", 3), "after_apply": RESTORE_FAILS},
        },
    )
    fleets.append(fleet)
    nodes = ["gpu-c1", "gpu-c2", "gpu-c3"]
    fleet.push({"rollouts/web.yaml": rollout_yaml("web", nodeIds=nodes, live=True, batchSize=3)})
    daemon = fleet.daemon()
    fleet.run_until(daemon, phase("web", "completed"))

    applied = fleet.agents["gpu-c3"].config_bytes()
    rollback(fleet, "web", "--nodes", "gpu-c1,gpu-c3")
    asked_at = parse_time(git("log", "-1", "--format=%cI", "main", cwd=fleet.bare))
    statuses = fleet.run_until(daemon, rollback_done("web", "r1"))

    status = statuses["web"]
    assert status["phase"] == "completed"
    assert fleet.agents["gpu-c1"].config_bytes() == old_config("gpu-c1", 1)
    assert fleet.agents["gpu-c2"].config_bytes() != old_config("gpu-c2", 2)  # not asked for
    assert fleet.agents["gpu-c3"].config_bytes() == applied  # the agent undid the restore
    record = record_of(status, "r1")
    assert record["requestedBy"] == ROLLBACKER and record["state"] == "done"
    assert parse_time(record["time"]) >= asked_at.replace(microsecond=0)
    assert rollback_outcomes(record) == {"gpu-c1": "rolled_back", "gpu-c3": "rollback_failed"}
    states = {n: r["state"] for n, r in node_map(status).items()}
    assert states == {"gpu-c1": "rolled_back", "gpu-c2": "succeeded", "gpu-c3": "rollback_failed"}
    # Without agentKey nothing is kept as evidence: the record is as in version 1.
    assert "evidence" not in node_map(status)["gpu-c1"]["restore"]
    assert status["hold"] is None

    capsys.readouterr()
    assert cli.main(["status", "web", "--repo", str(fleet.bare)]) == 0
    shown = capsys.readouterr().out
    assert "completed" in shown.splitlines()[0]
    section = shown[shown.index("\nrollbacks\n") :]
    assert f"r1  done  by {ROLLBACKER} at {record['time']}" in section
    assert "gpu-c1: rolled_back" in section and "gpu-c3: rollback_failed (restore failed" in section

    assert cli.main(["status", "web", "--repo", str(fleet.bare), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rollbacks"] == status["rollbacks"]


# --- refusals ----------------------------------------------------------------------


def test_refused_rollbacks_restore_nothing(tmp_path: Path, fleets: list[AgentFleet]) -> None:
    fleet = AgentFleet.create(
        tmp_path,
        {
            # applies, then drifts: its rollout keeps running until the deadline
            "gpu-d1": {"config": old_config("gpu-d1"), "after_apply": DRIFT},
            "gpu-d2": {"config": old_config("gpu-d2")},
        },
    )
    fleets.append(fleet)
    busy, dry = fleet.agents["gpu-d1"], fleet.agents["gpu-d2"]
    running = rollout_yaml("busy", nodeIds=["gpu-d1"], live=True, healthTimeout="1h")
    dry_run = rollout_yaml("dry", nodeIds=["gpu-d2"])
    fleet.push({"rollouts/busy.yaml": running, "rollouts/dry.yaml": dry_run})
    daemon = fleet.daemon()
    fleet.run_until(daemon, phase("dry", "completed"))
    busy.wait_idle()
    statuses = fleet.run_until(daemon, phase("busy", "running"))
    assert node_map(statuses["busy"])["gpu-d1"]["state"] == "dispatched"

    # running and not held: the CLI says so, and a hand-written request is refused
    refused = run_cli(fleet, "rollback", "busy", "--all")
    assert refused.returncode == 1 and "running and holds nothing" in refused.stderr
    # dry-run: nothing was changed, so nothing can be rolled back
    refused = run_cli(fleet, "rollback", "dry", "--all")
    assert refused.returncode == 1 and "dry-run" in refused.stderr
    fleet.push(
        {
            "rollouts/busy.yaml": running + "  rollbackRequest: {id: r1, nodes: all}\n",
            "rollouts/dry.yaml": dry_run + "  rollbackRequest: {id: r1, nodes: all}\n",
        },
        "Roll back both, by hand",
    )
    statuses = fleet.run_until(
        daemon, lambda s: rollback_done("busy", "r1")(s) and rollback_done("dry", "r1")(s)
    )

    busy_status, dry_status = statuses["busy"], statuses["dry"]
    assert record_of(busy_status, "r1")["state"] == "refused"
    assert busy_status["phase"] == "running"
    (condition,) = [c for c in busy_status["conditions"] if c["type"] == "rollback_refused"]
    assert "running and not held" in condition["message"] and "pause" in condition["message"]
    assert record_of(dry_status, "r1")["state"] == "refused"
    assert "dry-run" in record_of(dry_status, "r1")["message"]
    (condition,) = [c for c in dry_status["conditions"] if c["type"] == "rollback_refused"]
    assert "dry-run" in condition["message"]
    assert dry_status["phase"] == "completed"
    assert busy.jobs_of_kind("restore") == [] and dry.jobs_of_kind("restore") == []
    assert dry.config_bytes() == old_config("gpu-d2")

    # unknown node: the CLI refuses it; written by hand, that node is refused
    # and the rest of the request is carried out
    live = rollout_yaml("live", nodeIds=["gpu-d2"], live=True)
    fleet.push({"rollouts/live.yaml": live})
    fleet.run_until(daemon, phase("live", "completed"))
    refused = run_cli(fleet, "rollback", "live", "--nodes", "gpu-d2,gpu-zz")
    assert refused.returncode == 1 and "not nodes of live: gpu-zz" in refused.stderr
    fleet.push(
        {"rollouts/live.yaml": live + "  rollbackRequest: {id: r1, nodes: [gpu-d2, gpu-zz]}\n"}
    )
    statuses = fleet.run_until(daemon, rollback_done("live", "r1"))

    record = record_of(statuses["live"], "r1")
    assert rollback_outcomes(record) == {"gpu-d2": "rolled_back", "gpu-zz": "refused"}
    (condition,) = [c for c in statuses["live"]["conditions"] if c["type"] == "rollback_refused"]
    assert "gpu-zz" in condition["message"]
    assert dry.config_bytes() == old_config("gpu-d2")
    assert len(dry.jobs_of_kind("restore")) == 1


# --- reconciler backups ----------------------------------------------------------------


def test_backups_lists_a_real_agents_backups_newest_first(
    tmp_path: Path, fleets: list[AgentFleet], capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = AgentFleet.create(tmp_path, {"gpu-e1": {"config": old_config("gpu-e1")}})
    fleets.append(fleet)
    agent = fleet.agents["gpu-e1"]
    daemon = fleet.daemon()
    fleet.push({"rollouts/first.yaml": rollout_yaml("first", nodeIds=["gpu-e1"], live=True)})
    fleet.run_until(daemon, phase("first", "completed"))
    second = "{runtime: hermes, provider: vllm, model: mistral-7b, profile: default}"
    fleet.push(
        {
            "rollouts/second.yaml": rollout_yaml(
                "second", nodeIds=["gpu-e1"], live=True, target=second
            )
        }
    )
    fleet.run_until(daemon, phase("second", "completed"))

    capsys.readouterr()
    assert cli.main(["backups", "gpu-e1", "--repo", str(fleet.bare)]) == 0
    lines = capsys.readouterr().out.splitlines()

    assert lines[0] == f"gpu-e1 ({agent.url}): 2 backups, newest first"
    assert lines[1].split() == ["BACKUP", "RUNTIME", "CREATED", "JOB", "ROLLOUT", "PROVIDER/MODEL"]
    rows = [line.split() for line in lines[2:]]
    assert [r[0] for r in rows] == [b["backupId"] for b in agent.backups()]
    # what each backup holds: the config each rollout replaced
    assert [(r[1], r[4], r[5]) for r in rows] == [
        ("hermes", "second", f"ollama/{TARGET_MODEL}"),
        ("hermes", "first", "ollama/llama3-8b"),
    ]
    assert [r[3] for r in rows] == [apply_job_of(agent, "second"), apply_job_of(agent, "first")]


def apply_job_of(agent: RealAgent, rollout: str) -> str:
    (record,) = [r for r in agent.jobs_of_kind("apply") if r["payload"]["rollout"] == rollout]
    job_id: str = record["job_id"]
    return job_id


def test_a_backup_list_relabelled_on_the_way_restores_nothing_the_agent_did_not_sign(
    tmp_path: Path, fleets: list[AgentFleet]
) -> None:
    # Between the daemon and an agent with agentKey, a relay without the
    # key swaps the job ids of two backups, so that the backup of an older
    # rollout passes for this one's: the daemon must not restore from it.
    settings = "apiVersion: reconciler/v1\nkind: Settings\nspec:\n  offlineAfter: 30s\n"
    node = {"config": old_config("gpu-m1"), "keep_port": True, "agent_key": "own"}
    fleet = AgentFleet.create(tmp_path, {"gpu-m1": node}, files={"reconciler.yaml": settings})
    fleets.append(fleet)
    agent = fleet.agents["gpu-m1"]
    swapping: list[bool] = []

    def swap(method: str, target: str, status: int, body: bytes) -> tuple[int, bytes]:
        if not swapping or "/backups" not in target or status != 200:
            return status, body
        data = json.loads(body)
        listed = data["backups"] if isinstance(data, dict) else data
        newest, older = listed[0], listed[1]
        newest["jobId"], older["jobId"] = older["jobId"], newest["jobId"]
        newest["rollout"], older["rollout"] = older["rollout"], newest["rollout"]
        return status, json.dumps(data).encode()

    relay = Mitm(agent.url, swap)
    try:
        node_file = fleet.work / "nodes" / "gpu-m1.yaml"
        fleet.push({"nodes/gpu-m1.yaml": node_file.read_text().replace(agent.url, relay.url)})
        first = "{runtime: hermes, provider: ollama, model: model-first, profile: default}"
        fleet.push({"rollouts/first.yaml": rollout_yaml("first", target=first,
                    nodeIds=["gpu-m1"], live=True)})  # fmt: skip
        daemon = fleet.daemon()
        fleet.run_until(daemon, phase("first", "completed"))
        before = agent.config_bytes()
        fleet.push({"rollouts/gone.yaml": rollout_yaml("gone", nodeIds=["gpu-m1"], live=True)})
        daemon.run_pass()  # sends the apply; the agent applies it
        agent.wait_idle()
        agent.stop()  # before the daemon hears how it went
        daemon.run_pass()
        fleet.clock.advance(31)
        statuses = fleet.run_until(daemon, phase("gone", "paused"))
        assert node_map(statuses["gone"])["gpu-m1"]["firstBackupKnown"] is False

        rollback(fleet, "gone", "--all")
        swapping.append(True)
        agent.restart()
        fleet.run_until(daemon, lambda _: unverified_backups(daemon) >= 2)
        assert agent.jobs_of_kind("restore") == []
        assert record_of(fleet.statuses()["gone"], "r1")["state"] == "waiting"

        swapping.clear()  # the agent's own signed list: its own backup goes back
        statuses = fleet.run_until(daemon, rollback_done("gone", "r1"))
    finally:
        relay.close()
    assert rollback_outcomes(record_of(statuses["gone"], "r1")) == {"gpu-m1": "rolled_back"}
    (applied,) = [r for r in agent.jobs_of_kind("apply") if r["payload"]["rollout"] == "gone"]
    (restore,) = agent.jobs_of_kind("restore")
    assert restore["payload"]["backupId"] == applied["backup_id"]
    assert agent.config_bytes() == before


def unverified_backups(daemon: Any) -> float:
    value = daemon.metrics.registry.get_sample_value(
        "reconciler_unverified_answers_total", {"kind": "backups"}
    )
    return float(value or 0)
