"""Event-driven observation (docs/protocol.md, held reads): held
``?wait=`` reads of jobs on the real agent and the simulated fleet, and the
daemon's loop starting a pass as soon as one answers finished. The plain
behaviour (polling at the interval) is pinned with a fleet that ignores
``wait``. Real agent processes, the simulated fleet as a real process, real
HTTP on 127.0.0.1."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.daemon import agent_reads
from reconciler.daemon.loop import Daemon
from reconciler.git.store import GitStore
from reconciler.git.watch import BranchWatcher
from reconciler.protocol.effects import SendJob
from reconciler.protocol.long_poll import wait_seconds
from reconciler.spec.model import Target
from reconciler.spec.times import parse_time
from tests.kit.documents import rollout_yaml
from tests.kit.endpoint import ServiceEndpoint
from tests.kit.fleets import AgentFleet, FleetKit, RepoKit
from tests.kit.git import git

CONFIG = b"provider: vllm\nmodel: old-model\nprofile: default\n"


def test_wait_reads_durations_and_refuses_what_is_not_one() -> None:
    assert wait_seconds("") is None
    assert wait_seconds("other=1") is None
    assert wait_seconds("wait=20s") == 20.0
    assert wait_seconds("wait=1.5") == 1.5
    assert wait_seconds("wait=3600s") == 60.0  # capped
    for bad in ("wait=soon", "wait=-1s", "wait=nan"):
        with pytest.raises(ValueError, match="wait must"):
            wait_seconds(bad)


@contextlib.contextmanager
def serving(kit: RepoKit, daemon: Daemon, **kwargs: Any) -> Iterator[threading.Thread]:
    """``daemon.serve`` on a thread of its own while the block runs; stopped after."""
    watcher = BranchWatcher.for_store(GitStore.open(str(kit.bare), "main"))
    thread = threading.Thread(target=daemon.serve, args=(watcher,), kwargs=kwargs, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        daemon.stop()
        thread.join(15)


def wait_for(kit: RepoKit, done: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        statuses = kit.statuses()
        if done(statuses):
            return statuses
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout}s; statuses: {statuses}")
        time.sleep(0.05)


def completed(statuses: dict[str, Any]) -> bool:
    return bool(statuses.get("r", {}).get("phase") == "completed")


def test_real_agent_holds_a_job_read_until_the_job_finishes(tmp_path: Path) -> None:
    fleet = AgentFleet.create(tmp_path, {"a1": {"config": CONFIG, "after_apply": "sleep 1"}})
    try:
        fleet.push({"rollouts/r.yaml": rollout_yaml("r", nodeIds=["a1"], live=True)})
        daemon = fleet.daemon()
        daemon.run_pass()  # dispatches the one job
        agent = fleet.agents["a1"]
        job_id = agent.journal()[0]["job_id"]
        url = f"{agent.url}/v1/nodes/a1/jobs/{job_id}"
        plain = httpx.get(url).json()
        assert plain["state"] in ("accepted", "running")  # no wait: answered at once
        started = time.monotonic()
        held = httpx.get(url + "?wait=20s", timeout=30).json()
        took = time.monotonic() - started
        assert held["state"] == "succeeded"
        assert took < 10  # answered when the job finished, not when the wait ended
        # A finished job is answered at once, and a short wait ends unfinished jobs' reads.
        assert httpx.get(url + "?wait=20s").json()["state"] == "succeeded"
        bad = httpx.get(url + "?wait=soon")
        assert bad.status_code == 400 and "wait must" in bad.json()["message"]
    finally:
        fleet.close()


def test_batches_follow_finished_jobs_not_the_interval_with_real_agents(tmp_path: Path) -> None:
    nodes = {f"a{i}": {"config": CONFIG, "after_apply": "sleep 0.3"} for i in range(1, 4)}
    fleet = AgentFleet.create(tmp_path, nodes)
    try:
        fleet.push({"rollouts/r.yaml": rollout_yaml("r", nodeIds=["a1", "a2", "a3"], live=True)})
        daemon = fleet.daemon()
        # An interval far longer than the test: a pass after a dispatch can
        # only come from a held read answering that the job finished.
        started = time.monotonic()
        with serving(fleet, daemon, interval=120.0, reread=120.0) as thread:
            done = wait_for(fleet, completed, 60)
            took = time.monotonic() - started
        assert not thread.is_alive()
        assert [n["batch"] for n in done["r"]["nodes"]] == [1, 2, 3]
        assert all(n["state"] == "succeeded" for n in done["r"]["nodes"])
        assert took < 60  # three batches: two of them would each wait out 120 s
        assert daemon.client.watching() == set()  # no held read outlives the loop
    finally:
        fleet.close()


def test_simulated_fleet_batches_follow_each_other_with_default_interval(tmp_path: Path) -> None:
    nodes = {f"web-{i}": {"role": "web"} for i in range(1, 5)}
    kit = FleetKit.create(tmp_path, nodes, behaviour="default: {action: succeed, delay: 0.2}\n")
    try:
        kit.push({"rollouts/r.yaml": rollout_yaml("r", selector={"role": "web"})})
        daemon = kit.daemon()
        started = time.monotonic()
        with serving(kit, daemon, interval=5.0):  # the default
            wait_for(kit, completed, 60)
            took = time.monotonic() - started
        # Four batches, three gaps between them: at the interval that is 15 s at least.
        assert took < 12
    finally:
        kit.close()


def test_fleet_that_ignores_wait_is_polled_at_the_interval(tmp_path: Path) -> None:
    """The plain behaviour: an agent without held answers answers at once;
    the daemon stops holding reads there and the interval brings each batch."""
    nodes = {f"web-{i}": {"role": "web"} for i in range(1, 4)}
    kit = FleetKit.create(
        tmp_path,
        nodes,
        behaviour="default: {action: succeed, delay: 0.2}\n",
        sim_args=("--ignore-wait",),
    )
    try:
        kit.push({"rollouts/r.yaml": rollout_yaml("r", selector={"role": "web"})})
        daemon = kit.daemon()
        started = time.monotonic()
        with serving(kit, daemon, interval=1.5):
            done = wait_for(kit, completed, 60)
            took = time.monotonic() - started
            held = daemon.client.watching()
        assert all(n["state"] == "succeeded" for n in done["r"]["nodes"])
        assert held == set()  # nothing held at an agent that answers at once
        assert took >= 2 * 1.5  # two gaps between three batches, each the interval
    finally:
        kit.close()


def test_simulated_fleet_answers_a_held_read_unfinished_when_the_wait_ends(
    tmp_path: Path,
) -> None:
    kit = FleetKit.create(tmp_path, {"web-1": {"role": "web"}}, behaviour="default: hang\n")
    try:
        kit.push({"rollouts/r.yaml": rollout_yaml("r", selector={"role": "web"})})
        daemon = kit.daemon()
        status = kit.run_until(daemon, lambda s: bool(s.get("r", {}).get("nodes")))
        job_id = status["r"]["nodes"][0]["jobId"]
        url = f"{kit.fleet.url}/v1/nodes/web-1/jobs/{job_id}"
        started = time.monotonic()
        held = httpx.get(url + "?wait=1s", timeout=30).json()
        took = time.monotonic() - started
        assert held["state"] == "running"  # the job hangs: the wait ended
        assert took >= 0.9
        bad = httpx.get(url + "?wait=-1s")
        assert bad.status_code == 400 and "wait must" in bad.json()["message"]
    finally:
        kit.close()


def status_commit_messages(kit: RepoKit) -> list[str]:
    log = git("log", "--format=%B%x00", "main", cwd=kit.bare)
    return [m for m in log.split("\0") if m.strip().startswith("status:")]


def test_a_batch_finishing_together_is_one_pass_and_one_status_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A held read answering succeeded waits for the batch's other held
    reads (up to GATHER_SECONDS, here longer than the test): the pass starts
    when the last one answers, not at the first, and not at the gather's end."""
    monkeypatch.setattr(agent_reads, "GATHER_SECONDS", 120.0)
    nodes = {
        "a1": {"config": CONFIG, "after_apply": "true"},
        "a2": {"config": CONFIG, "after_apply": "sleep 0.5"},
        "a3": {"config": CONFIG, "after_apply": "sleep 1"},
    }
    fleet = AgentFleet.create(tmp_path, nodes)
    try:
        rollout = rollout_yaml("r", nodeIds=["a1", "a2", "a3"], live=True, batchSize=3)
        fleet.push({"rollouts/r.yaml": rollout})
        daemon = fleet.daemon()
        started = time.monotonic()
        with serving(fleet, daemon, interval=120.0, reread=120.0):
            done = wait_for(fleet, completed, 60)
            took = time.monotonic() - started
        assert all(n["state"] == "succeeded" for n in done["r"]["nodes"])
        assert took < 60  # neither the gather's 120 s nor the interval's
        finished = [m for m in status_commit_messages(fleet) if "-> succeeded" in m]
        assert len(finished) == 1, finished  # the three verdicts in one commit
        assert all(f"r/{n}: dispatched -> succeeded" in finished[0] for n in nodes)
    finally:
        fleet.close()


def test_a_slow_node_does_not_hold_back_the_others_verdicts_past_the_gather(
    tmp_path: Path,
) -> None:
    """With the default gather (GATHER_SECONDS), a node still applying does
    not keep the batch's finished nodes from being recorded: their pass
    starts when the gather ends."""
    nodes = {
        "a1": {"config": CONFIG, "after_apply": "true"},
        "a2": {"config": CONFIG, "after_apply": "sleep 20"},
    }
    fleet = AgentFleet.create(tmp_path, nodes)
    try:
        rollout = rollout_yaml("r", nodeIds=["a1", "a2"], live=True, batchSize=2)
        fleet.push({"rollouts/r.yaml": rollout})
        daemon = fleet.daemon()
        with serving(fleet, daemon, interval=120.0, reread=120.0):
            seen = wait_for(
                fleet,
                lambda s: any(n["state"] == "succeeded" for n in s.get("r", {}).get("nodes", [])),
                15,
            )
        states = {n["name"]: n["state"] for n in seen["r"]["nodes"]}
        assert states == {"a1": "succeeded", "a2": "dispatched"}  # a2 still sleeps
    finally:
        fleet.close()


def test_a_failure_starts_a_pass_at_once_while_the_batch_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_reads, "GATHER_SECONDS", 120.0)
    nodes = {
        "a1": {"config": CONFIG, "after_apply": "exit 3"},
        "a2": {"config": CONFIG, "after_apply": "sleep 20"},
    }
    fleet = AgentFleet.create(tmp_path, nodes)
    try:
        rollout = rollout_yaml("r", nodeIds=["a1", "a2"], live=True, batchSize=2)
        fleet.push({"rollouts/r.yaml": rollout})
        daemon = fleet.daemon()
        with serving(fleet, daemon, interval=120.0, reread=120.0):
            held = wait_for(fleet, lambda s: s.get("r", {}).get("phase") == "paused", 15)
        states = {n["name"]: n["state"] for n in held["r"]["nodes"]}
        assert held["r"]["hold"]["reason"] == "health_failed"
        assert states == {"a1": "failed", "a2": "dispatched"}  # a2's apply still sleeps
    finally:
        fleet.close()


def test_held_reads_bring_what_a_plain_read_would_get(tmp_path: Path) -> None:
    """The shortcuts a pass takes from held reads, against the plain reads:
    the finished record is the one a GET returns, and the heartbeat read
    right after it is newer than the job and shows its target."""
    fleet = AgentFleet.create(tmp_path, {"a1": {"config": CONFIG, "after_apply": "sleep 0.3"}})
    try:
        agent = fleet.agents["a1"]
        client = fleet.daemon().client
        job = SendJob(
            "job-held-1", "apply", "a1", "r", 1, "live",
            Target("hermes", "vllm", "new-model", "default"), "0" * 40,
        )  # fmt: skip
        woken = threading.Event()
        sent = client.send_jobs([(agent.url, job)], datetime.now(UTC), on_finished=woken.set)
        assert sent["job-held-1"].state in ("accepted", "running")
        assert woken.wait(20)  # the held read began on the POST's answer and saw it finish
        held = client.take_finished(["job-held-1"])
        beats = client.take_heartbeats(["a1"])
        plain = client.read_jobs([(agent.url, job)])["job-held-1"]
        assert held == {"job-held-1": plain} and plain is not None
        assert plain.state == "succeeded" and plain.finished_at is not None
        beat = beats["a1"]
        assert parse_time(beat.time) > parse_time(plain.finished_at)
        runtime = beat.runtime("hermes")
        assert runtime is not None and runtime.model == "new-model"
        # Taken once: the next pass reads for itself.
        assert client.take_finished(["job-held-1"]) == {}
        assert client.take_heartbeats(["a1"]) == {}
    finally:
        fleet.close()


# -- held heartbeat reads --------------------------------------------------------


def test_real_agent_holds_a_heartbeat_read_until_its_heartbeat_changes(tmp_path: Path) -> None:
    fleet = AgentFleet.create(tmp_path, {"a1": {"config": CONFIG, "after_apply": "sleep 1"}})
    try:
        agent = fleet.agents["a1"]
        url = f"{agent.url}/v1/nodes/a1/heartbeat"
        before = httpx.get(url).json()
        query = {"newerThan": before["time"], "wait": "20s"}
        # Nothing changes: the wait ends and the heartbeat is answered as it is.
        started = time.monotonic()
        quiet = httpx.get(url, params={**query, "wait": "1s"}, timeout=30).json()
        assert time.monotonic() - started >= 0.9
        assert quiet["runtimes"] == before["runtimes"]
        # A job finishing changes it: the held read answers then, not at the wait's end.
        held: dict[str, Any] = {}
        reader = threading.Thread(
            target=lambda: held.update(httpx.get(url, params=query, timeout=30).json())
        )
        reader.start()
        fleet.push({"rollouts/r.yaml": rollout_yaml("r", nodeIds=["a1"], live=True)})
        fleet.daemon().run_pass()  # sends the job
        started = time.monotonic()
        reader.join(25)
        assert not reader.is_alive() and time.monotonic() - started < 15
        assert held["runtimes"][0]["model"] == "llama3.1-8b"  # the rollout's target
        # Changed after newerThan already: answered at once. Not a time: refused.
        assert httpx.get(url, params=query, timeout=5).json()["runtimes"] == held["runtimes"]
        bad = httpx.get(url, params={**query, "newerThan": "yesterday"})
        assert bad.status_code == 400 and "newerThan must" in bad.json()["message"]
    finally:
        fleet.close()


def soak_rollout(endpoint: ServiceEndpoint, soak: str) -> str:
    check = f"{{name: ready, http: {{url: '{endpoint.url}/ready', bodyContains: ready}}}}"
    health = f"{{soak: {soak}, interval: 1s, checks: [{check}]}}"
    return rollout_yaml("r", nodeIds=["a1"], live=True, health=health)


def test_a_soak_ends_with_a_held_heartbeat_read_not_at_the_interval(tmp_path: Path) -> None:
    endpoint = ServiceEndpoint(200, b"ready")
    fleet = AgentFleet.create(tmp_path, {"a1": {"config": CONFIG}})
    try:
        fleet.push({"rollouts/r.yaml": soak_rollout(endpoint, "3s")})
        daemon = fleet.daemon()
        started = time.monotonic()
        # An interval far longer than the test: after the apply, only held
        # heartbeat reads can bring the check's first success and the soak's end.
        with serving(fleet, daemon, interval=120.0, reread=120.0):
            done = wait_for(fleet, completed, 60)
            took = time.monotonic() - started
        assert took < 60
        assert done["r"]["nodes"][0]["checks"][0]["ok"] is True
        assert daemon.client.watching_heartbeats() == set()  # none outlives the loop
    finally:
        fleet.close()
        endpoint.close()


def test_a_check_failing_mid_soak_is_seen_when_the_heartbeat_changes(tmp_path: Path) -> None:
    endpoint = ServiceEndpoint(200, b"ready")
    fleet = AgentFleet.create(tmp_path, {"a1": {"config": CONFIG}})
    try:
        fleet.push({"rollouts/r.yaml": soak_rollout(endpoint, "10m")})
        daemon = fleet.daemon()
        with serving(fleet, daemon, interval=120.0, reread=120.0):
            deadline = time.monotonic() + 30
            while daemon.client.watching_heartbeats() != {"a1"}:
                assert time.monotonic() < deadline, "no held heartbeat read for the soaking node"
                time.sleep(0.1)
            endpoint.set(503, b"down")
            failed = wait_for(fleet, lambda s: s.get("r", {}).get("phase") == "paused", 40)
        assert failed["r"]["hold"]["reason"] == "health_failed"
        assert "health check ready failed" in failed["r"]["nodes"][0]["error"]
    finally:
        fleet.close()
        endpoint.close()


def test_a_fleet_answering_heartbeats_at_once_is_polled_as_before(tmp_path: Path) -> None:
    """The plain behaviour: an agent that ignores ``newerThan`` and ``wait``
    answers at once; the daemon stops holding heartbeat reads there and the
    interval brings the soak's end."""
    nodes = {"web-1": {"role": "web"}}
    behaviour = "default: {action: succeed, delay: 0.1}\n"  # simulated checks hold
    kit = FleetKit.create(tmp_path, nodes, behaviour=behaviour, sim_args=("--ignore-wait",))
    try:
        check = "{name: ready, http: {url: 'http://127.0.0.1:9/ready'}}"
        health = f"{{soak: 1s, interval: 1s, checks: [{check}]}}"
        rollout = rollout_yaml("r", selector={"role": "web"}, live=True, health=health)
        kit.push({"rollouts/r.yaml": rollout})
        daemon = kit.daemon()
        with serving(kit, daemon, interval=1.5):
            done = wait_for(kit, completed, 60)
            held = daemon.client.watching_heartbeats()
        assert done["r"]["nodes"][0]["state"] == "succeeded"
        assert held == set()
    finally:
        kit.close()
