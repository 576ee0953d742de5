"""The shortcuts of held reads at scale (docs/protocol.md, held reads),
each pinned against the plain behaviour: a fleet that ignores ``wait`` and
is read by every pass. Passes run one by one in the test's thread; the held
reads start as under ``serve`` (``Daemon._wake`` set). The simulated fleet
is a real process on 127.0.0.1; signatures are real."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from test_event_driven import serving, status_commit_messages, wait_for

from reconciler.daemon import agent_reads, observer
from reconciler.daemon.agent_reads import watch_limit
from reconciler.daemon.crashpoints import CrashPoints
from reconciler.daemon.loop import Daemon
from reconciler.protocol.evidence import derived_agent_key
from tests.kit.documents import node_states, node_yaml, rollout_yaml
from tests.kit.fleets import FleetKit

NODES = {f"web-{i}": {"role": "web"} for i in range(1, 4)}
SEED = "held-answers"


def make_kit(root: Path, behaviour: str, *, ignore_wait: bool, key_seed: str | None = None,
             agent_seed: str | None = None) -> FleetKit:  # fmt: skip
    """The simulated fleet signing with per-node keys from ``key_seed``;
    the node files name the keys of ``agent_seed``."""
    sim_args: tuple[str, ...] = ("--ignore-wait",) if ignore_wait else ()
    if key_seed is not None:
        sim_args += ("--key-seed", key_seed)
    kit = FleetKit.create(root, NODES, behaviour=behaviour, sim_args=sim_args)
    if agent_seed is not None:
        kit.push(
            {
                f"nodes/{n}.yaml": node_yaml(
                    n,
                    kit.fleet.url,
                    labels,
                    agent_key=derived_agent_key(agent_seed, n).public_openssh,
                )
                for n, labels in NODES.items()
            }
        )
    return kit


class Clock:
    """The daemon's clock, moved on by the test: how old an answer is does
    not depend on how slow the machine is."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def held_daemon(kit: FleetKit, clock: Clock | None = None) -> tuple[Daemon, threading.Event]:
    """A daemon whose passes start held reads, as under ``serve``."""
    daemon = kit.daemon(clock=clock) if clock is not None else kit.daemon()
    woken = threading.Event()
    daemon._wake = woken.set
    return daemon, woken


def requests(kit: FleetKit) -> int:
    """Requests the simulated fleet has served (the stats read itself not counted)."""
    return int(kit.fleet.stats()["requests"])


def wait_held(daemon: Daemon, count: int) -> set[str]:
    deadline = time.monotonic() + 15
    while len(held := daemon.client.watching()) < count:
        assert time.monotonic() < deadline, f"held reads: {held}"
        time.sleep(0.05)
    return held


def dispatched(kit: FleetKit, daemon: Daemon) -> dict[str, Any]:
    kit.push({"rollouts/r.yaml": rollout_yaml("r", selector={"role": "web"}, batchSize=3)})
    return kit.run_until(daemon, lambda s: len(s.get("r", {}).get("nodes", [])) == 3)


def comparable(status: dict[str, Any]) -> dict[str, Any]:
    """What a pass decided, without the ids and times that differ between runs."""
    return {
        "phase": status["phase"],
        "nodes": node_states(status),
        "conditions": sorted(
            (c.get("type"), c.get("message", "").split(":")[0])
            for c in status.get("conditions", [])
        ),
    }


def test_passes_do_not_read_jobs_whose_held_reads_are_in_flight(tmp_path: Path) -> None:
    """Jobs that hang: with held reads the passes after the dispatch ask the
    fleet nothing and decide what passes reading every job decide."""
    held_kit = make_kit(tmp_path / "held", "default: hang\n", ignore_wait=False)
    plain_kit = make_kit(tmp_path / "plain", "default: hang\n", ignore_wait=True)
    try:
        held, _ = held_daemon(held_kit)
        plain, _ = held_daemon(plain_kit)
        dispatched(held_kit, held)
        dispatched(plain_kit, plain)
        wait_held(held, 3)
        assert plain.client.watching() == set()  # it answers at once: nothing is held
        before_held, before_plain = requests(held_kit), requests(plain_kit)
        for _ in range(3):
            held.run_pass()
            plain.run_pass()
        assert requests(held_kit) - before_held == 1  # the stats read above, nothing else
        assert requests(plain_kit) - before_plain >= 3 * 3  # every pass read every job
        assert comparable(held_kit.statuses()["r"]) == comparable(plain_kit.statuses()["r"])
        assert held.quiet is not None  # nothing to ask: not run again
    finally:
        held_kit.close()
        plain_kit.close()


def counted_steps(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per pass that stepped the rollouts (a quiet pass does not)."""
    steps: list[int] = []
    step = daemon._step

    def counting(*args: Any) -> Any:
        steps.append(1)
        return step(*args)

    monkeypatch.setattr(daemon, "_step", counting)
    return steps


def test_the_pass_after_a_dispatch_left_to_held_reads_is_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass that dispatches the batch commits and sends; every job sent
    waits on its held read and nothing else is asked. A pass right after
    would step what that pass made with no new observation: it is not run
    (the fast daemon) until a held read ends, and then the pass that runs
    decides what the plain daemon, which runs every pass, decides."""
    kit = make_kit(tmp_path / "fast", "default: hang\n", ignore_wait=False)
    plain_kit = make_kit(tmp_path / "plain", "default: hang\n", ignore_wait=False)
    try:
        daemon, _ = held_daemon(kit)
        plain = plain_kit.daemon(plain=True)
        plain._wake = threading.Event().set
        dispatched(kit, daemon)
        dispatched(plain_kit, plain)
        wait_held(daemon, 3)
        wait_held(plain, 3)
        steps, plain_steps = counted_steps(daemon, monkeypatch), counted_steps(plain, monkeypatch)
        for _ in range(3):
            daemon.run_pass()
            plain.run_pass()
        assert (len(steps), len(plain_steps)) == (0, 3)
        assert comparable(kit.statuses()["r"]) == comparable(plain_kit.statuses()["r"])
        _nodes_go_down(kit)
        _nodes_go_down(plain_kit)
        for one in (daemon, plain):
            deadline = time.monotonic() + 15
            while one.client.watching():
                assert time.monotonic() < deadline, "held reads still in flight"
                time.sleep(0.05)
        daemon.run_pass()
        plain.run_pass()
        assert len(steps) == 1  # the held reads ended: news
        assert set(daemon.observer.unreachable) == set(plain.observer.unreachable) == set(NODES)
    finally:
        kit.close()
        plain_kit.close()


def test_a_held_answer_older_than_its_limit_is_read_again(tmp_path: Path) -> None:
    clock = Clock()
    kit = make_kit(tmp_path, "default: hang\n", ignore_wait=False)
    try:
        daemon, _ = held_daemon(kit, clock)
        dispatched(kit, daemon)
        wait_held(daemon, 3)
        before = requests(kit)
        daemon.run_pass()
        assert requests(kit) - before == 1  # the POSTs' answers stand in
        clock.advance(observer.HELD_ANSWER_SECONDS)
        before = requests(kit)
        daemon.run_pass()  # not quiet: the answers it used are too old now
        assert requests(kit) - before == 1 + 3  # each job read, as without held reads
    finally:
        kit.close()


class SlowCommit(CrashPoints):
    """Kills nothing: the clock moves on by ``seconds`` once the status
    commit is made, before its jobs are sent, as it does when the commit
    and the send take seconds on a loaded machine."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        super().__init__()
        self.clock = clock
        self.seconds = seconds

    def reach(self, point: str) -> None:
        if point == "after_push":
            self.clock.advance(self.seconds)


def test_an_answer_to_a_job_sent_late_in_a_pass_counts_from_the_send(tmp_path: Path) -> None:
    """The pass steps, then its commit takes HELD_ANSWER_SECONDS before the
    jobs go out. Their agents answered them accepted when they were sent,
    not when the pass stepped: the next pass, at once, leaves them to their
    held reads rather than reading them again."""
    clock = Clock()
    kit = make_kit(tmp_path, "default: hang\n", ignore_wait=False)
    try:
        daemon = kit.daemon(
            clock=clock, crash_points=SlowCommit(clock, observer.HELD_ANSWER_SECONDS)
        )
        daemon._wake = threading.Event().set
        dispatched(kit, daemon)
        wait_held(daemon, 3)
        before = requests(kit)
        daemon.run_pass()
        assert requests(kit) - before == 1  # the stats read above, no job read
    finally:
        kit.close()


def _fleet_stops(kit: FleetKit) -> None:
    kit.fleet.stop()


def _nodes_go_down(kit: FleetKit) -> None:
    # A real agent that goes down drops the reads it holds; the simulated
    # fleet answers them as the new behaviour says (503), at once.
    kit.fleet.set_behaviour(f"names: [{', '.join(NODES)}]\ndefault: unreachable\n")


@pytest.mark.parametrize(
    "go_away", [_fleet_stops, _nodes_go_down], ids=["fleet stops", "nodes go down"]
)
def test_held_reads_ended_by_the_fleet_end_the_quiet_and_the_jobs_are_read(
    tmp_path: Path, go_away: Callable[[FleetKit], None]
) -> None:
    """The fleet goes away, or its nodes go down, while their jobs are held:
    the held reads end, and the next pass reads the jobs and finds the nodes
    unreachable, as passes reading every job do."""
    kit = make_kit(tmp_path, "default: hang\n", ignore_wait=False)
    try:
        daemon, _ = held_daemon(kit)
        dispatched(kit, daemon)
        wait_held(daemon, 3)
        daemon.run_pass()
        assert daemon.quiet is not None and not daemon.observer.unreachable
        go_away(kit)
        deadline = time.monotonic() + 15
        while daemon.client.watching():
            assert time.monotonic() < deadline, "held reads still in flight"
            time.sleep(0.05)
        daemon.run_pass()
        assert set(daemon.observer.unreachable) == set(NODES)
    finally:
        kit.close()


def test_an_answer_not_believed_is_found_when_read_as_without_held_reads(tmp_path: Path) -> None:
    """The fleet signs with other keys than the node files name. Nothing of
    a job waiting on its held read is believed or reported until it is read:
    once it is HELD_ANSWER_SECONDS old (the daemon's clock moved on), the
    pass reads it and reports it unverified, as passes reading every job do
    at once."""
    found = {}
    for mode, ignore in (("held", False), ("plain", True)):
        kit = make_kit(tmp_path / mode, "default: hang\n", ignore_wait=ignore,
                       key_seed="the-fleet", agent_seed="someone-else")  # fmt: skip
        try:
            clock = Clock()
            daemon, _ = held_daemon(kit, clock)
            dispatched(kit, daemon)
            if not ignore:
                wait_held(daemon, 3)
                before = requests(kit)
                daemon.run_pass()
                assert requests(kit) - before == 1  # nothing read, nothing believed
                assert "unverified_evidence" not in str(kit.statuses()["r"].get("conditions"))
                clock.advance(observer.HELD_ANSWER_SECONDS)
            before = requests(kit)
            daemon.run_pass()
            assert requests(kit) - before == 1 + 3  # each job read
            found[mode] = comparable(kit.statuses()["r"])
        finally:
            kit.close()
    assert found["held"] == found["plain"]
    assert ("unverified_evidence", "answers not signed by the node's agentKey are no evidence") in (
        found["held"]["conditions"]
    )


@pytest.mark.parametrize("change", ["deadline", "node removed"])
def test_a_held_job_is_read_when_its_deadline_passes_or_its_node_goes(
    tmp_path: Path, change: str
) -> None:
    """Where an unobserved job would be judged otherwise than one seen
    running (past its deadline, its node gone from nodes/), it is read, and
    the verdict is the one passes reading every job reach."""
    found = {}
    for mode, ignore in (("held", False), ("plain", True)):
        kit = make_kit(tmp_path / mode, "default: hang\n", ignore_wait=ignore)
        try:
            daemon, _ = held_daemon(kit)
            timeout = "2s" if change == "deadline" else "10m"
            rollout = rollout_yaml(
                "r", selector={"role": "web"}, batchSize=3, healthTimeout=timeout
            )
            kit.push({"rollouts/r.yaml": rollout})
            kit.run_until(daemon, lambda s: len(s.get("r", {}).get("nodes", [])) == 3)
            if not ignore:
                wait_held(daemon, 3)
            if change == "node removed":
                kit.push({"nodes/web-2.yaml": None})
            done = kit.run_until(
                daemon,
                lambda s: any(n["state"] != "dispatched" for n in s["r"]["nodes"]),
                timeout=30,
            )
            found[mode] = {n["name"]: (n["state"], n.get("error", "")) for n in done["r"]["nodes"]}
        finally:
            kit.close()
    assert found["held"] == found["plain"]
    if change == "deadline":
        assert found["held"]["web-1"] == ("timed_out", "deadline passed: job still running")
    else:
        assert found["held"]["web-2"][0] == "unknown"


def test_signed_answers_held_reach_the_same_verdicts_as_plain_reads(tmp_path: Path) -> None:
    """With per-node keys that the node files name, a rollout completes the
    same way with held answers standing in as with every job read."""
    found = {}
    for mode, ignore in (("held", False), ("plain", True)):
        kit = make_kit(tmp_path / mode, "default: {action: succeed, delay: 0.5}\n",
                       ignore_wait=ignore, key_seed=SEED, agent_seed=SEED)  # fmt: skip
        try:
            daemon, _ = held_daemon(kit)
            kit.push({"rollouts/r.yaml": rollout_yaml("r", selector={"role": "web"}, batchSize=1)})
            done = kit.run_until(daemon, lambda s: s.get("r", {}).get("phase") == "completed")
            found[mode] = comparable(done["r"])
        finally:
            kit.close()
    assert found["held"] == found["plain"]
    assert set(found["held"]["nodes"].values()) == {"succeeded"}


def test_a_batch_finishing_over_longer_than_the_gather_is_one_status_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finishes 1 s apart with a gather of 1.5 s: each finish waits the
    gather again, so the three verdicts make one pass and one commit (a
    gather counted from the first finish would end between the second and
    the third)."""
    monkeypatch.setattr(agent_reads, "GATHER_SECONDS", 1.5)
    commits = gathered_commits(tmp_path, monkeypatch, limit=10)
    assert len(commits) == 1, commits


def test_the_gather_ends_at_its_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same finishes with the gather limited to 1.5 s from the first:
    the last verdict comes in a later pass."""
    monkeypatch.setattr(agent_reads, "GATHER_SECONDS", 1.5)
    commits = gathered_commits(tmp_path, monkeypatch, limit=1)
    assert len(commits) >= 2, commits


def test_the_interval_does_not_cut_a_gather_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same finishes with a pass due every 0.2 s while the rollout is
    active: every job in flight waits on its held read, so no pass runs
    until the gather ends, and the three verdicts are still one commit."""
    monkeypatch.setattr(agent_reads, "GATHER_SECONDS", 1.5)
    commits = gathered_commits(tmp_path, monkeypatch, limit=10, interval=0.2)
    assert len(commits) == 1, commits


def gathered_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: float, interval: float = 120.0
) -> list[str]:
    monkeypatch.setattr(agent_reads, "GATHER_LIMIT", limit)
    behaviour = (
        "default: succeed\nnodes:\n"
        "  web-2: {action: succeed, delay: 1.0}\n"
        "  web-3: {action: succeed, delay: 2.0}\n"
    )
    kit = make_kit(tmp_path, behaviour, ignore_wait=False)
    try:
        kit.push({"rollouts/r.yaml": rollout_yaml("r", selector={"role": "web"}, batchSize=3)})
        daemon = kit.daemon()
        with serving(kit, daemon, interval=interval, reread=120.0):
            done = wait_for(kit, lambda s: s.get("r", {}).get("phase") == "completed", 60)
        assert set(node_states(done["r"]).values()) == {"succeeded"}
        return [m for m in status_commit_messages(kit) if "-> succeeded" in m]
    finally:
        kit.close()


# -- open files --------------------------------------------------------------------


def test_held_reads_are_limited_by_the_open_files_limit() -> None:
    assert watch_limit(1 << 20) == agent_reads.MAX_WATCHES
    # a third each for held job reads, held heartbeat reads and idle connections
    assert watch_limit(1024) == (1024 - agent_reads.FD_RESERVE) // 3
    assert watch_limit(0) == 16  # never none: an agent's jobs are held, or polled past it


def test_the_soft_open_files_limit_is_raised_to_the_hard_one() -> None:
    script = (
        "import resource\n"
        "from reconciler.protocol.long_poll import raise_open_files_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "print(raise_open_files_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.split()
    returned, soft, hard = (int(v) for v in out)
    expected = 1 << 20 if hard < 0 else hard
    assert returned == soft == expected


def test_the_simulated_fleet_holds_more_reads_than_an_agent_serves_connections(
    tmp_path: Path,
) -> None:
    """600 held heartbeat reads at once, over the 512 connections one agent
    serves: the simulated fleet, one process for every node, answers all."""
    kit = make_kit(tmp_path, "default: succeed\n", ignore_wait=False)
    host, port = kit.fleet.url.removeprefix("http://").split(":")
    query = "newerThan=2026-01-01T00:00:00Z&wait=2s"
    request = (f"GET /v1/nodes/web-1/heartbeat?{query} HTTP/1.1\r\nHost: {host}\r\n\r\n").encode()

    async def one() -> bytes:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 30)
        writer.close()
        return line

    async def all_at_once() -> list[bytes | BaseException]:
        return await asyncio.gather(*(one() for _ in range(600)), return_exceptions=True)

    try:
        answers = asyncio.run(all_at_once())
        assert answers.count(b"HTTP/1.1 200 \r\n") + answers.count(b"HTTP/1.1 200 OK\r\n") == 600, {
            repr(a)[:80] for a in answers
        }
    finally:
        kit.close()


def test_the_simulated_fleet_listens_with_room_for_a_batch_of_connects(tmp_path: Path) -> None:
    """A batch's held reads open hundreds of connections within moments; a
    backlog of 256 overflowed (the kernel dropped SYNs, and each dropped
    connect waited out a 1 s retry). ``ss`` shows a listening socket's
    backlog as its Send-Q."""
    if shutil.which("ss") is None and os.environ.get("CI") != "true":
        pytest.skip("ss (iproute2) is not installed")
    kit = make_kit(tmp_path, "default: succeed\n", ignore_wait=False)
    try:
        port = kit.fleet.url.rsplit(":", 1)[1]
        listing = subprocess.run(
            ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
        ).stdout.split()
        assert listing[0] == "LISTEN" and int(listing[2]) >= 1000, listing
    finally:
        kit.close()
