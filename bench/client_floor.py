"""The agent client's thread alone, against the floor of its work: what a
job costs that thread end to end, what its parts cost alone
(``bench/job_parts.py``), and what a minimal asyncio + h11 client spends on
the same two requests a job makes.

    .venv/bin/python bench/client_floor.py              # 20,000 jobs, batches of 1,000
    .venv/bin/python bench/client_floor.py --quick      # 4,000 jobs, 1 run

A stand-in agent (a subprocess: its CPU is not counted) answers like the
simulated fleet, without its bookkeeping: a job's ``POST`` at once with its
signed ``accepted`` record, and its held read (``GET ...?wait=``) ``--hold``
seconds after the ``POST`` with its signed ``succeeded`` record. Per batch,
every job is posted (``--concurrency`` at once) and then held, each held
read on a connection of its own, as ``AgentClient.send_jobs`` does with
``on_finished``. Each figure is the CPU time (user + system) of the thread
running the event loop per job, the median of ``--runs`` rounds:

- agent client: ``AgentClient.send_jobs`` with held reads, until every
  finished record is taken, each finished answer's signature checked as
  it arrives (as the daemon's ``AnswerCheck.prepare`` does);
- its parts alone: ``bench/job_parts.py`` (sign, h11, read, check), measured
  in this process between the rounds;
- http client: the same requests through ``HttpClient.request`` alone,
  nothing signed, read or checked (the bodies are made beforehand);
- asyncio + h11 floor: the same requests by the least a client can do:
  one buffered protocol and one h11 state machine per connection, a
  coroutine per connection, a future per request, no timer, no pool
  bookkeeping, no bounds.

The parts this thread does are the four of ``job_parts`` less half the
checks: the passes check each ``POST``'s answer, this thread the finished
one. Its floor is those parts plus what the floor client spends beyond
h11 (asyncio and the sockets); the daemon's whole CPU per job adds the
passes (``bench/fleet.py --artifacts --with-parts``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import cast

import h11
import job_parts
from _common import announce, emit, median, row

from reconciler.daemon.agent_client import AgentClient
from reconciler.daemon.agent_http import HttpClient
from reconciler.protocol.effects import SendJob
from reconciler.protocol.evidence import derived_agent_key, signed_bytes_problem
from reconciler.protocol.job_payload import build_payload
from reconciler.protocol.long_poll import DAEMON_WAIT_SECONDS, raise_open_files_limit, wait_query
from reconciler.protocol.observations import SignedAnswer
from reconciler.protocol.signing import canonical_json, envelope_bytes

DAEMON_SEED = "bench-client-floor"
PARTS = ("sign", "h11", "read answers", "check answers")  # job_parts.measure's figures
JOB_ID = re.compile(rb'"jobId":"([^"]+)"')
CONTENT_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)", re.IGNORECASE)


# -- the stand-in agent -----------------------------------------------------------


class _Agent(asyncio.Protocol):
    """Answers one request at a time per connection, from answers signed beforehand."""

    def __init__(
        self, answers: dict[bytes, tuple[bytes, bytes]], posted: dict[bytes, float], hold: float
    ) -> None:
        self.answers = answers
        self.posted = posted  # job id -> loop time of its POST, shared by all connections
        self.hold = hold
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[: end + 4]
            length = CONTENT_LENGTH.search(head)
            size = int(length.group(1)) if length else 0
            if len(self.buffer) < end + 4 + size:
                return
            body = self.buffer[end + 4 : end + 4 + size]
            self.buffer = self.buffer[end + 4 + size :]
            self._answer(head, body)

    def _answer(self, head: bytes, body: bytes) -> None:
        loop = asyncio.get_running_loop()
        if head.startswith(b"POST"):
            found = JOB_ID.search(body)
            job_id = found.group(1) if found else b""
            self.posted[job_id] = loop.time()
            self._send(202, self.answers[job_id][0])
            return
        target = head.split(b" ", 2)[1]
        path, _, query = target.partition(b"?")
        job_id = path.rsplit(b"/", 1)[1]
        due = self.posted.get(job_id, 0.0) + self.hold if query else 0.0
        finished = self.answers[job_id][1]
        if due > loop.time():
            loop.call_at(due, self._send, 200, finished)
        else:
            self._send(200, finished)

    def _send(self, status: int, body: bytes) -> None:
        assert self.transport is not None
        head = b"HTTP/1.1 %d \r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        self.transport.write(head % (status, len(body)) + body)


def serve(count: int, hold: float) -> None:
    """The stand-in agent: prints ``listening on PORT`` and serves until killed."""
    raise_open_files_limit()
    answers = {
        j.job_id.encode(): (job_parts.answer(j, "accepted"), job_parts.answer(j, "succeeded"))
        for j in job_parts.jobs(count)
    }

    posted: dict[bytes, float] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: _Agent(answers, posted, hold), "127.0.0.1", 0, backlog=4096
        )
        print(f"listening on {server.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def start_agent(count: int, hold: float) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--jobs", str(count), "--hold", str(hold)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("listening on "):
        process.kill()
        raise RuntimeError(f"stand-in agent did not start: {line!r}")
    return process, f"http://127.0.0.1:{line.split()[-1]}"


# -- the clients --------------------------------------------------------------------


def batches(jobs: Sequence[SendJob], size: int) -> list[Sequence[SendJob]]:
    return [jobs[i : i + size] for i in range(0, len(jobs), size)]


def agent_client_round(url: str, jobs: Sequence[SendJob], batch: int, concurrency: int) -> float:
    """Thread CPU seconds of the agent client's loop for ``jobs``, batch by batch."""
    key = derived_agent_key(DAEMON_SEED, "daemon")
    trusted = {j.node: derived_agent_key(job_parts.SEED, j.node).trusted() for j in jobs}
    problems: list[str] = []

    def check(node: str, signed: SignedAnswer) -> None:  # as AnswerCheck.prepare does
        problem = signed_bytes_problem(
            canonical_json(signed.body), signed.key_id, signed.signature, trusted[node]
        )
        if problem:
            problems.append(problem)

    finished = threading.Event()
    with AgentClient(key, concurrency=concurrency, timeout=10.0, on_signed=check) as client:
        assert client._thread.ident is not None
        clock = time.pthread_getcpuclockid(client._thread.ident)
        started = time.clock_gettime(clock)
        for part in batches(jobs, batch):
            wanted = {j.job_id for j in part}
            seen = client.send_jobs(
                [(url, j) for j in part], datetime.now(UTC), on_finished=finished.set
            )
            assert all(o.state == "accepted" for o in seen.values()), seen
            while wanted:
                finished.wait(1.0)
                finished.clear()
                wanted -= set(client.take_finished(wanted))
        spent = time.clock_gettime(clock) - started
    assert not problems, problems[:3]
    return spent


def requests(url: str, jobs: Sequence[SendJob]) -> list[tuple[str, bytes, str]]:
    """Per job: the POST's path and signed body, the held read's path."""
    key = derived_agent_key(DAEMON_SEED, "daemon")
    now = datetime.now(UTC)
    wait = wait_query(DAEMON_WAIT_SECONDS)
    return [
        (
            f"/v1/nodes/{j.node}/jobs",
            envelope_bytes(build_payload(j, now), key),
            f"/v1/nodes/{j.node}/jobs/{j.job_id}?{wait}",
        )
        for j in jobs
    ]


async def _batched(
    work: Sequence[tuple[str, bytes, str]],
    batch: int,
    concurrency: int,
    post: Callable[[int, str, bytes], Awaitable[None]],
    get: Callable[[int, str], Awaitable[None]],
) -> None:
    """POST a batch ``concurrency`` at once, then hold all of its reads at once."""
    for start in range(0, len(work), batch):
        part = work[start : start + batch]
        queue = iter(part)

        async def poster(lane: int, queue: Iterator[tuple[str, bytes, str]]) -> None:
            for path, body, _ in queue:  # shared iterator: each job taken once
                await post(lane, path, body)

        await asyncio.gather(*(poster(lane, queue) for lane in range(min(concurrency, len(part)))))
        await asyncio.gather(*(get(lane, held) for lane, (_, _, held) in enumerate(part)))


def http_client_round(
    url: str, work: Sequence[tuple[str, bytes, str]], batch: int, concurrency: int
) -> float:
    async def run() -> float:
        http = HttpClient(10.0, max(batch, concurrency))
        started = time.thread_time()

        async def post(lane: int, path: str, body: bytes) -> None:
            status, _ = await http.request(url, "POST", path, body, node="n")
            assert status == 202

        async def get(lane: int, path: str) -> None:
            status, _ = await http.request(url, "GET", path, node="n", timeout=30.0)
            assert status == 200

        await _batched(work, batch, concurrency, post, get)
        spent = time.thread_time() - started
        http.close()
        return spent

    return asyncio.run(run())


class _Minimal(asyncio.BufferedProtocol):
    """The least an asyncio + h11 client connection does."""

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.wire = h11.Connection(h11.CLIENT)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[int] | None = None
        self.status = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # any loop's: uvloop's too

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view

    def buffer_updated(self, nbytes: int) -> None:
        wire = self.wire
        wire.receive_data(bytes(self.view[:nbytes]))
        while True:
            event = wire.next_event()
            if event is h11.NEED_DATA:
                return
            if type(event) is h11.Response:
                self.status = event.status_code
            elif type(event) is h11.EndOfMessage:
                wire.start_next_cycle()
                assert self.waiter is not None
                self.waiter.set_result(self.status)
                return

    async def ask(self, request: h11.Request, body: bytes | None) -> int:
        wire = self.wire
        data = wire.send(request) or b""
        if body:
            data += wire.send(h11.Data(data=body)) or b""
        data += wire.send(h11.EndOfMessage()) or b""
        self.waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(data)
        return await self.waiter


def floor_round(
    url: str, work: Sequence[tuple[str, bytes, str]], batch: int, concurrency: int
) -> float:
    port = int(url.rsplit(":", 1)[1])
    host = [(b"Host", b"127.0.0.1:%d" % port), (b"User-Agent", b"reconciler-daemon")]

    async def run() -> float:
        loop = asyncio.get_running_loop()
        view = memoryview(bytearray(64 * 1024))
        lanes: dict[int, _Minimal] = {}  # one connection per lane, opened when first used
        started = time.thread_time()

        async def lane(index: int) -> _Minimal:
            if index not in lanes:
                _, lanes[index] = await loop.create_connection(
                    lambda: _Minimal(view), "127.0.0.1", port
                )
            return lanes[index]

        async def post(index: int, path: str, body: bytes) -> None:
            length = b"%d" % len(body)
            headers = [*host, (b"Content-Type", b"application/json"), (b"Content-Length", length)]
            request = h11.Request(method="POST", target=path, headers=headers)
            assert await (await lane(index)).ask(request, body) == 202

        async def get(index: int, path: str) -> None:
            request = h11.Request(method="GET", target=path, headers=host)
            assert await (await lane(index)).ask(request, None) == 200

        await _batched(work, batch, concurrency, post, get)
        spent = time.thread_time() - started
        for conn in lanes.values():
            assert conn.transport is not None
            conn.transport.close()
        return spent

    return asyncio.run(run())


def measure(count: int, batch: int, concurrency: int, hold: float, runs: int) -> dict[str, float]:
    raise_open_files_limit()
    jobs = job_parts.jobs(count)
    found: dict[str, list[float]] = {}
    for _ in range(runs):
        # A fresh stand-in agent per round: its records of posted jobs start empty.
        agent, url = start_agent(count, hold)
        try:
            work = requests(url, jobs)
            spent = {
                "agent client": agent_client_round(url, jobs, batch, concurrency),
                "http client": http_client_round(url, work, batch, concurrency),
                "asyncio + h11 floor": floor_round(url, work, batch, concurrency),
            }
        finally:
            agent.kill()
            agent.wait()
        for name, seconds in spent.items():
            found.setdefault(name, []).append(seconds / count * 1e3)
        for name, ms in job_parts.measure(min(count, 10_000), 1).items():
            found.setdefault(name, []).append(ms)
    return {name: median(values) for name, values in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--concurrency", type=int, default=64, help="POSTs at once (the daemon's)")
    parser.add_argument("--hold", type=float, default=0.5, help="seconds a held read is held")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="4,000 jobs, 1 run")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.jobs, args.hold)
        return
    if args.quick:
        args.jobs, args.runs = 4_000, 1
    announce(
        f"client floor: {args.jobs:,} jobs in batches of {args.batch:,}, {args.runs} runs, "
        f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}"
    )
    figures = measure(args.jobs, args.batch, args.concurrency, args.hold, args.runs)
    parts = sum(figures[name] for name in PARTS)
    # The passes check each POST's answer; this thread checks the finished one.
    on_thread = parts - figures["check answers"] / 2
    floor = on_thread + figures["asyncio + h11 floor"] - figures["h11"]
    rows = [row(f"per job: {name}", ms, "ms") for name, ms in figures.items()]
    rows += [
        row("per job: the parts together (job_parts)", parts, "ms"),
        row("per job: the parts this thread does (half the checks)", on_thread, "ms"),
        row("per job: this thread's floor (its parts + asyncio beyond h11)", floor, "ms"),
        row(
            "per job: agent client / the parts this thread does",
            figures["agent client"] / on_thread,
            "x",
        ),
        row("per job: agent client / this thread's floor", figures["agent client"] / floor, "x"),
    ]
    emit(rows)
    print(f"  load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()
