"""The daemon's agent client against real servers on 127.0.0.1: every answer,
good or bad, becomes an observation; nothing raises."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from reconciler.daemon.agent_client import AgentClient
from reconciler.node.http_server import Request, Response, error_response, json_response
from reconciler.protocol.observations import Backup, JobObservation
from reconciler.protocol.signing import SigningKey
from reconciler.spec.model import Target
from tests.kit.agents import FleetThread, Served
from tests.kit.jobs import job
from tests.kit.keys import make_key
from tests.kit.ports import HeldPort
from tests.kit.waiting import wait_for

SCRIPT = """
nodes:
  busy: {action: refuse, status: 409, code: busy, message: try later}
  down: unreachable
  broken: error500
  noise: garbage
  gone: disconnect
  slow: stall
  liar: {action: impostor, as: ok}
"""
NAMES = ["ok", "busy", "down", "broken", "noise", "gone", "slow", "liar"]


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return make_key(tmp_path / "keys" / "reconciler").signing


@pytest.fixture
def fleet(tmp_path: Path, key: SigningKey) -> Iterator[FleetThread]:
    served = FleetThread(tmp_path / "sim", [key], names=NAMES, script=SCRIPT)
    yield served
    served.close()


@pytest.fixture
def client(key: SigningKey) -> Iterator[AgentClient]:
    agent_client = AgentClient(key, concurrency=4, timeout=0.5)
    yield agent_client
    agent_client.close()


def test_sent_jobs_are_observed_until_they_finish(fleet: FleetThread, client: AgentClient) -> None:
    now = datetime.now(UTC)
    send = job(node="ok")

    sent = client.send_jobs([(fleet.url, send)], now)

    assert sent == {
        "apply-0001": JobObservation("apply-0001", "accepted", source_commit=send.source_commit)
    }
    done = wait_for(
        lambda: (
            (r := client.read_jobs([(fleet.url, send)])["apply-0001"])
            and r.state == "succeeded"
            and r
        ),
        what="the job to succeed",
    )
    assert done.backup_id and done.finished_at and done.source_commit == send.source_commit
    payload = fleet.call(lambda: fleet.fleet.nodes["ok"].jobs["apply-0001"].payload)
    assert payload["issuedAt"] == now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_refusals_and_failures_become_observations(
    tmp_path: Path, fleet: FleetThread, client: AgentClient, held_port: HeldPort
) -> None:
    stranger = AgentClient(make_key(tmp_path / "stranger" / "reconciler").signing, timeout=0.5)
    jobs = [
        (fleet.url, job(f"apply-{name}", node=name))
        for name in ("busy", "down", "broken", "noise", "gone", "slow")
    ]
    jobs.append((held_port.url, job("apply-closed", node="ok")))
    jobs.append(("not a url", job("apply-bad-url", node="ok")))
    try:
        seen = client.send_jobs(jobs, datetime.now(UTC))
        untrusted = stranger.send_jobs([(fleet.url, job(node="ok"))], datetime.now(UTC))
    finally:
        stranger.close()

    states = {job_id: (o.state, o.error) for job_id, o in seen.items()}
    assert states["apply-busy"] == ("refused", "busy: try later")
    assert states["apply-down"] == ("unreachable", "unavailable: simulated outage")
    assert states["apply-broken"] == ("unreachable", "internal: simulated server error")
    assert states["apply-noise"][0] == "unreachable"
    assert "not JSON" in states["apply-noise"][1]
    assert states["apply-gone"][0] == "unreachable"
    assert states["apply-slow"] == ("unreachable", "no answer within 0.5s")
    assert states["apply-closed"][0] == "unreachable"
    assert "cannot connect" in states["apply-closed"][1]
    assert states["apply-bad-url"][0] == "unreachable"
    assert untrusted["apply-0001"].state == "refused"
    assert untrusted["apply-0001"].error.startswith("untrusted_key: key SHA256:")


def test_reading_an_unknown_job_is_none_and_failures_are_unreachable(
    fleet: FleetThread, client: AgentClient, held_port: HeldPort
) -> None:
    seen = client.read_jobs(
        [
            (fleet.url, job("apply-x", node="ok")),
            (fleet.url, job("apply-y", node="down")),
            (held_port.url, job("apply-z", node="ok")),
        ]
    )

    assert seen["apply-x"] is None
    assert seen["apply-y"] is not None and seen["apply-y"].state == "unreachable"
    assert seen["apply-z"] is not None and seen["apply-z"].state == "unreachable"


def test_heartbeats_from_the_right_node_only(fleet: FleetThread, client: AgentClient) -> None:
    beats = client.read_heartbeats(
        [(fleet.url, "ok"), (fleet.url, "liar"), (fleet.url, "noise"), (fleet.url, "slow")]
    )

    assert beats["ok"] is not None and beats["ok"].node == "ok"
    hermes = beats["ok"].runtime("hermes")
    assert hermes is not None and (hermes.provider, hermes.model) == ("sim", "base-model")
    assert hermes.config_digest.startswith("sha256:")
    assert beats["liar"] is None  # it answered as node "ok"
    assert beats["noise"] is None and beats["slow"] is None


def test_backups_newest_first(fleet: FleetThread, client: AgentClient) -> None:
    for attempt, model in ((1, "m1"), (2, "m2")):
        target = Target("hermes", "vllm", model, "default")
        send = job(f"apply-{attempt}", node="ok", attempt=attempt, target=target)
        client.send_jobs([(fleet.url, send)], datetime.now(UTC))
        wait_for(
            lambda s=send: (
                (r := client.read_jobs([(fleet.url, s)])[s.job_id]) and r.state == "succeeded"
            ),
            what="apply",
        )

    backups = client.read_backups([(fleet.url, "ok"), (fleet.url, "down")])

    assert backups["down"] is None
    assert backups["ok"] is not None
    listed = backups["ok"].backups
    assert [(b.job_id, b.model) for b in listed] == [("apply-2", "m1"), ("apply-1", "base-model")]
    assert all(isinstance(b, Backup) and b.runtime == "hermes" for b in listed)


def test_an_answer_about_another_job_or_a_retry_later_is_unreachable(
    key: SigningKey, client: AgentClient
) -> None:
    def handler(request: Request) -> Response:
        if request.path.endswith("/busy/jobs"):
            return error_response(429, "slow_down", "too many requests")
        return json_response(200, {"jobId": "apply-other", "state": "succeeded"})

    served = Served(handler)
    try:
        sent = client.send_jobs([(served.url, job(node="busy"))], datetime.now(UTC))
        read = client.read_jobs([(served.url, job())])
    finally:
        served.close()

    assert sent["apply-0001"].state == "unreachable"
    assert sent["apply-0001"].error == "slow_down: too many requests"
    observed = read["apply-0001"]
    assert observed is not None and observed.state == "unreachable"
    assert "apply-other" in observed.error


class _OldStyleHandler(BaseHTTPRequestHandler):
    """Chunked answers for heartbeats, close-delimited HTTP/1.0 ones for backups."""

    def do_GET(self) -> None:
        if self.path.endswith("/heartbeat"):
            self.protocol_version = "HTTP/1.1"
            body = b'{"node": "old", "time": "2026-12-01T09:00:00Z", "runtimes": []}'
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (body[:10], body[10:]):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.protocol_version = "HTTP/1.0"
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"[]")
            self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_chunked_and_close_delimited_answers(client: AgentClient) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OldStyleHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        beats = client.read_heartbeats([(url, "old")] * 3)
        backups = client.read_backups([(url, "old")])
    finally:
        server.shutdown()
        server.server_close()

    assert beats["old"] is not None and beats["old"].time == "2026-12-01T09:00:00Z"
    assert backups["old"] is not None and backups["old"].backups == ()


class _HeadRecorder(BaseHTTPRequestHandler):
    """Answers a heartbeat or accepts a job, keeping each request's line and
    headers as they came: what every agent gets to read."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, list[tuple[str, str]]]]

    def do_GET(self) -> None:
        self.seen.append((self.requestline, list(self.headers.items())))
        self._answer(200, {"node": "a", "time": "2026-12-01T09:00:00Z", "runtimes": []})

    def do_POST(self) -> None:
        self.seen.append((self.requestline, list(self.headers.items())))
        posted = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._answer(202, {"jobId": posted["payload"]["jobId"], "state": "accepted"})

    def _answer(self, status: int, data: dict[str, object]) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_requests_carry_only_the_headers_an_agent_reads(client: AgentClient) -> None:
    """Reads (again and again on one connection) name the host and the
    daemon; a job adds its body's type and length. Nothing else is sent."""
    seen: list[tuple[str, list[tuple[str, str]]]] = []
    handler = type("Recorder", (_HeadRecorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    url = f"http://127.0.0.1:{port}/agent"
    try:
        for _ in range(3):
            assert client.read_heartbeats([(url, "a")])["a"] is not None
        sent = client.send_jobs([(url, job("apply-7", node="a"))], datetime.now(UTC))
    finally:
        server.shutdown()
        server.server_close()

    host = [("Host", f"127.0.0.1:{port}"), ("User-Agent", "reconciler-daemon")]
    read = ("GET /agent/v1/nodes/a/heartbeat HTTP/1.1", host)
    assert seen[:3] == [read, read, read]
    line, headers = seen[3]
    assert line == "POST /agent/v1/nodes/a/jobs HTTP/1.1"
    assert headers[:3] == [*host, ("Content-Type", "application/json")]
    assert headers[3][0] == "Content-Length" and len(headers) == 4
    assert sent["apply-7"].state == "accepted"


def test_keep_alive_connections_are_reused_and_renewed_when_the_agent_drops_them(
    fleet: FleetThread, client: AgentClient
) -> None:
    nodes = [(fleet.url, "ok")] * 20
    assert all(client.read_heartbeats(nodes).values())
    open_before = fleet.call(lambda: len(fleet.server.connections))

    def drop_all() -> None:
        for conn in list(fleet.server.connections):
            if conn.transport is not None:
                conn.transport.close()

    fleet.call(drop_all)
    beats = client.read_heartbeats(nodes)

    assert 1 <= open_before <= client.concurrency
    assert all(beats.values())


def test_many_jobs_at_once(tmp_path: Path, key: SigningKey) -> None:
    names = [f"n{i:03d}" for i in range(300)]
    fleet = FleetThread(tmp_path / "many", [key], names=names)
    client = AgentClient(key, concurrency=16)
    try:
        jobs = [(fleet.url, job(f"apply-{n}", node=n)) for n in names]
        sent = client.send_jobs(jobs, datetime.now(UTC))
        read = client.read_jobs(jobs)
        connections = fleet.call(lambda: len(fleet.server.connections))
    finally:
        client.close()
        fleet.close()

    assert len(sent) == 300 and {o.state for o in sent.values()} == {"accepted"}
    assert all(o is not None and o.state in ("running", "succeeded") for o in read.values())
    assert connections <= 16


def test_a_closed_client_says_so(key: SigningKey) -> None:
    client = AgentClient(key)
    client.close()
    client.close()  # twice is fine

    with pytest.raises(RuntimeError, match="closed"):
        client.read_heartbeats([("http://127.0.0.1:1", "a")])


def test_held_reads_start_once_every_job_is_out(tmp_path: Path, key: SigningKey) -> None:
    """An agent serving many nodes gets every job before the first held
    read: the jobs are the work, the reads only wait for it. Each accepted
    job still gets its held read, which reports its finish."""
    names = [f"n{i:02d}" for i in range(12)]
    fleet = FleetThread(tmp_path / "order", [key], names=names)
    asked: list[str] = []
    handle = fleet.fleet.handle

    def recording(request: Request) -> Response | asyncio.Future[Response]:
        asked.append("held" if "wait=" in request.query else request.method)
        return handle(request)

    fleet.server.handler = recording
    client = AgentClient(key, concurrency=2)  # the POSTs go out over several rounds
    finished = threading.Event()
    try:
        jobs = [(fleet.url, job(f"apply-{n}", node=n)) for n in names]
        sent = client.send_jobs(jobs, datetime.now(UTC), on_finished=finished.set)
        assert finished.wait(10), "no held read reported a finish"
        taken = client.take_finished([j.job_id for _, j in jobs])
    finally:
        client.close()
        fleet.close()

    assert {o.state for o in sent.values()} == {"accepted"}
    assert asked.count("POST") == 12 and asked.count("held") >= 1 and taken
    last_post = max(i for i, what in enumerate(asked) if what == "POST")
    assert all(what != "held" for what in asked[:last_post])


def test_a_second_batch_of_held_reads_opens_no_new_connections(
    tmp_path: Path, key: SigningKey
) -> None:
    """The pool keeps as many idle connections as there are held reads: the
    second batch's POSTs and held reads go on the first batch's connections.
    600 jobs a batch (fewer under a low open files limit), more than a pool
    capped at 512 would keep."""
    client = AgentClient(key, concurrency=8)
    names = [f"n{i:03d}" for i in range(min(600, client.max_watches))]
    fleet = FleetThread(tmp_path / "reuse", [key], names=names)
    fleet.server.max_connections = 2 * len(names)  # the agent's own cap is not under test
    opened = []
    try:
        for batch in ("a", "b"):
            finished = threading.Event()
            jobs = [(fleet.url, job(f"apply-{batch}-{n}", node=n)) for n in names]
            client.send_jobs(jobs, datetime.now(UTC), on_finished=finished.set)
            wait_for(
                lambda jobs=jobs: not client.watching() & {j.job_id for _, j in jobs},
                timeout=30,
                what="every held read to end",
            )
            opened.append(client.connections_opened)
    finally:
        client.close()
        fleet.close()

    assert opened[0] >= len(names)  # the first batch's held reads each need one
    assert opened[1] == opened[0], opened


def test_a_job_whose_held_read_brought_its_finish_is_not_held_again(
    tmp_path: Path, key: SigningKey
) -> None:
    """A pass that found a job held hands it to ``watch_jobs`` again after
    its step; when the held read answered finished in between, the record
    waits for the next pass and the agent is not asked once more (during a
    batch that was one more read, and signature check, for most jobs)."""
    names = [f"n{i:02d}" for i in range(6)]
    fleet = FleetThread(tmp_path / "again", [key], names=names)
    asked: list[str] = []
    handle = fleet.fleet.handle

    def recording(request: Request) -> Response | asyncio.Future[Response]:
        if "wait=" in request.query:
            asked.append(request.path)
        return handle(request)

    fleet.server.handler = recording
    client = AgentClient(key, concurrency=2)
    try:
        jobs = [(fleet.url, job(f"apply-{n}", node=n)) for n in names]
        client.send_jobs(jobs, datetime.now(UTC), on_finished=lambda: None)
        wait_for(lambda: not client.watching(), timeout=30, what="every held read to end")
        held_reads = len(asked)
        client.watch_jobs(jobs, lambda: None)  # the pass's call, its answers not yet taken
        time_to_ask = client.watching()  # runs on the loop after watch_jobs
        taken = client.take_finished([j.job_id for _, j in jobs])
    finally:
        client.close()
        fleet.close()

    assert held_reads == len(names)
    assert not time_to_ask and len(asked) == held_reads, asked[held_reads:]
    assert set(taken) == {j.job_id for _, j in jobs}
