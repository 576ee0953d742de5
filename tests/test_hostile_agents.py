"""Agents that fight the daemon's client, as small real servers on
127.0.0.1: an answer that streams an endless chunked body, one that never
comes, one that dribbles. Every answer is bounded in size and in time; a
node that did not answer in time is not waited for again, only probed one
request at a time; and a healthy rollout beside such agents completes while
the daemon's memory stays bounded."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_event_driven import serving
from test_event_driven import wait_for as wait_for_statuses

from reconciler.daemon.agent_client import AgentClient, fetch_backups
from reconciler.daemon.agent_http import MAX_ANSWER_BYTES
from reconciler.protocol.signing import SigningKey
from reconciler.spec.errors import AgentError
from tests.kit.agents import FleetThread
from tests.kit.documents import node_states, node_yaml, rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.jobs import job
from tests.kit.keys import make_key
from tests.kit.waiting import wait_for

MIB = 1024 * 1024
# What the kernel may hold between the two ends of a loopback connection
# (socket buffers grow to tens of MiB), on top of what the client reads.
KERNEL_SLACK = 80 * MIB


Behaviour = Callable[["HostileAgent", socket.socket, bytes, int], None]


class HostileAgent:
    """A listening socket (kept bound: nobody else can take its port) and a
    thread per connection running ``behaviour(agent, connection, head,
    index)`` once the request head is in (``index``: which connection).
    Counts connections and bytes sent."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.stop = threading.Event()
        self.answer = threading.Event()  # set: silent connections answer after all
        self.lock = threading.Lock()
        self.connections = 0
        self.sent: list[int] = []  # bytes sent, per connection
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                self.sent.append(0)
                index = len(self.sent) - 1
            threading.Thread(target=self._serve, args=(conn, index), daemon=True).start()

    def _serve(self, conn: socket.socket, index: int) -> None:
        with conn:
            head = b""
            try:
                while b"\r\n\r\n" not in head:
                    data = conn.recv(65536)
                    if not data:
                        return
                    head += data
                self.behaviour(self, conn, head, index)
            except OSError:
                return  # the client gave up on us: what it is meant to do

    def send(self, conn: socket.socket, data: bytes, index: int) -> None:
        conn.sendall(data)
        with self.lock:
            self.sent[index] += len(data)

    def close(self) -> None:
        self.stop.set()
        self.answer.set()
        self.listener.close()


def endless_chunked(agent: HostileAgent, conn: socket.socket, head: bytes, index: int) -> None:
    """200, chunked, and chunks that never end: one body byte per KiB of
    chunk extension, the costliest framing to read."""
    agent.send(conn, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", index)
    chunk = b"1;pad=" + b"p" * 1000 + b"\r\nx\r\n"
    while not agent.stop.is_set():
        agent.send(conn, chunk * 64, index)


def endless_head(agent: HostileAgent, conn: socket.socket, head: bytes, index: int) -> None:
    agent.send(conn, b"HTTP/1.1 200 OK\r\n", index)
    while not agent.stop.is_set():
        agent.send(conn, b"X-Pad: " + b"p" * 1000 + b"\r\n", index)


def silent(agent: HostileAgent, conn: socket.socket, head: bytes, index: int) -> None:
    """Never answers, until told to: then a heartbeat of the node asked about."""
    agent.answer.wait()
    if agent.stop.is_set():
        return
    node = head.split(b" ", 2)[1].split(b"/")[3]
    body = b'{"node": "%s", "time": "2026-12-01T09:00:00Z", "runtimes": []}' % node
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    agent.send(conn, answer, index)


def dribbling(agent: HostileAgent, conn: socket.socket, head: bytes, index: int) -> None:
    """A whole, valid answer, one byte at a time, slower than any deadline."""
    body = b'{"node": "d", "time": "2026-12-01T09:00:00Z", "runtimes": []}'
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    for byte in answer:
        if agent.stop.wait(0.1):
            return
        agent.send(conn, bytes([byte]), index)


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return make_key(tmp_path / "keys" / "reconciler").signing


@pytest.fixture
def fleet(tmp_path: Path, key: SigningKey) -> Iterator[FleetThread]:
    served = FleetThread(tmp_path / "sim", [key], names=["good"])
    yield served
    served.close()


def hostile(behaviour: Behaviour) -> HostileAgent:
    return HostileAgent(behaviour)


@pytest.mark.parametrize("behaviour", [endless_chunked, endless_head], ids=["body", "head"])
def test_an_answer_that_never_ends_is_cut_off_at_the_size_bound(
    key: SigningKey,
    fleet: FleetThread,
    behaviour: Behaviour,
) -> None:
    agent = hostile(behaviour)
    # A timeout far beyond the test: only the size bound can end these reads.
    client = AgentClient(key, timeout=600)
    try:
        beats = client.read_heartbeats([(agent.url, "h"), (fleet.url, "good")])
        jobs = client.read_jobs([(agent.url, job(node="h"))])
        stalled = client.stalled()
    finally:
        client.close()
        agent.close()

    assert beats["h"] is None and beats["good"] is not None
    seen = jobs["apply-0001"]
    assert seen is not None and seen.state == "unreachable"
    assert "over" in seen.error or "too large" in seen.error, seen.error
    assert stalled == set()  # cut off quickly: nothing to wait for
    assert agent.connections == 2
    assert all(sent <= MAX_ANSWER_BYTES + KERNEL_SLACK for sent in agent.sent), agent.sent


def test_a_silent_agent_is_waited_for_once_then_probed_one_request_at_a_time(
    key: SigningKey, fleet: FleetThread
) -> None:
    agent = hostile(silent)
    client = AgentClient(key, timeout=1.0)
    try:
        first = client.read_heartbeats([(agent.url, "s")])
        assert first == {"s": None}  # no answer within the timeout
        later = [client.read_heartbeats([(agent.url, "s"), (fleet.url, "good")]) for _ in range(10)]
        jobs = client.read_jobs([(agent.url, job(node="s"))])
        # The one probe in flight waits far longer than a request: the calls
        # above did not each open a connection to the silent agent.
        connections = agent.connections
        stalled = client.stalled()
        client.take_held([])
        client.watch_jobs([(agent.url, job(node="s"))], lambda: None)
        held = client.watching()  # after the watch: the loop runs calls in order
        news = client.has_news()  # a held read started and ended would be news
        agent.answer.set()  # the agent comes back: the probe gets its answer
        wait_for(lambda: client.stalled() == set(), what="the stall to end")
        back = client.read_heartbeats([(agent.url, "s")])
    finally:
        client.close()
        agent.close()

    assert all(beats["s"] is None and beats["good"] is not None for beats in later)
    seen = jobs["apply-0001"]
    assert seen is not None and seen.state == "unreachable"
    assert "no answer within 1s" in seen.error and "not waited for" in seen.error
    assert stalled == {"s"}
    assert held == set() and not news  # a stalled node is polled, not held
    assert connections == 2  # the request that timed out, and the one probe
    assert back["s"] is not None and back["s"].node == "s"


def test_a_silent_node_stalls_only_itself_on_an_agent_serving_many(
    key: SigningKey, tmp_path: Path
) -> None:
    """The simulated fleet serves every node from one address: one node that
    stops answering must not make its neighbours unreachable."""
    fleet = FleetThread(tmp_path / "many", [key], names=["a", "b"], script="nodes: {b: stall}\n")
    client = AgentClient(key, timeout=0.5)
    try:
        first = client.read_heartbeats([(fleet.url, "a"), (fleet.url, "b")])
        second = client.read_heartbeats([(fleet.url, "a"), (fleet.url, "b")])
        stalled = client.stalled()
    finally:
        client.close()
        fleet.close()

    assert first["a"] is not None and first["b"] is None
    assert second["a"] is not None and second["b"] is None
    assert stalled == {"b"}


def test_a_dribbling_agent_is_cut_off_by_the_deadline_bytes_do_not_extend(
    key: SigningKey,
) -> None:
    agent = hostile(dribbling)
    client = AgentClient(key, timeout=1.0)
    try:
        beats = client.read_heartbeats([(agent.url, "d")])
        stalled = client.stalled()
    finally:
        client.close()
        agent.close()

    assert beats == {"d": None}
    assert stalled == {"d"}
    assert 0 < agent.sent[0] < 100  # cut off long before its answer was whole


def test_reconciler_backups_cuts_off_an_endless_answer_and_a_dribbled_one() -> None:
    chunked, slow = hostile(endless_chunked), hostile(dribbling)
    try:
        with pytest.raises(AgentError, match=r"over \d+ bytes; cut off"):
            fetch_backups(chunked.url, "h", timeout=600)
        with pytest.raises(AgentError, match="no answer within 1s"):
            fetch_backups(slow.url, "d", timeout=1.0)
    finally:
        chunked.close()
        slow.close()

    assert chunked.sent[0] <= MAX_ANSWER_BYTES + KERNEL_SLACK


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_a_healthy_rollout_completes_beside_hostile_agents_in_bounded_memory(
    tmp_path: Path,
) -> None:
    chunked, quiet, slow = hostile(endless_chunked), hostile(silent), hostile(dribbling)
    kit = FleetKit.create(tmp_path, {"g1": {"role": "good"}, "g2": {"role": "good"}})
    peak = 0
    sampling = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not sampling.wait(0.02):
            peak = max(peak, _rss_bytes())

    try:
        kit.push(
            {
                "nodes/h1.yaml": node_yaml("h1", chunked.url, {"role": "bad"}),
                "nodes/h2.yaml": node_yaml("h2", quiet.url, {"role": "bad"}),
                "nodes/h3.yaml": node_yaml("h3", slow.url, {"role": "bad"}),
                "rollouts/bad.yaml": rollout_yaml("bad", selector={"role": "bad"}, batchSize=3),
            }
        )
        daemon = kit.daemon()
        before = _rss_bytes()
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        with serving(kit, daemon, interval=0.2, reread=5.0):
            wait_for_statuses(kit, lambda s: "bad" in s, 60)
            kit.push(
                {"rollouts/good.yaml": rollout_yaml("good", selector={"role": "good"}, batchSize=1)}
            )
            done = wait_for_statuses(
                kit, lambda s: s.get("good", {}).get("phase") == "completed", 120
            )
        sampling.set()
        sampler.join(5)
    finally:
        sampling.set()
        kit.close()
        for agent in (chunked, quiet, slow):
            agent.close()

    assert set(node_states(done["good"]).values()) == {"succeeded"}
    assert "succeeded" not in node_states(done["bad"]).values()
    assert chunked.connections >= 1 and quiet.connections >= 1  # they were asked
    # Each endless answer held at most MAX_ANSWER_BYTES: the process grew by
    # far less than the hundreds of MiB an unbounded client reaches.
    print(f"RSS grew by {(peak - before) / MIB:.0f} MiB")
    assert peak - before < 3 * MAX_ANSWER_BYTES + 64 * MIB, (before, peak)
