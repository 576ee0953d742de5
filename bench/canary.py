"""Judging a batch's comparisons against a real Prometheus (docs/health.md):
Debian's ``prometheus`` scrapes every second one exporter that shows a
latency and request counters for each of ``--nodes`` nodes; once it holds a
soak's worth of samples, the daemon's ``CanaryReadings`` judges a batch of
half of them (two comparisons each, a latency and an error rate) against
the other half, the rollout's nodes not yet dispatched.

    .venv/bin/python bench/canary.py                 # 2,000 nodes: a batch of 1,000
    .venv/bin/python bench/canary.py --nodes 200 --soak 10

Printed: the wall time of the judging pass, the CPU this process spent in
it (the daemon's side: HTTP, parsing, SciPy; the exporter runs in a child
process so its CPU is not counted), the range queries asked. A pass at the
soak's start comes first, as in the daemon: it starts the soaks and loads
SciPy. Targets: under 5 s of wall time and under 1 s of daemon CPU.

    .venv/bin/python bench/canary.py --profile       # and where the CPU went
    .venv/bin/python bench/canary.py --clients       # and h11 against httpx

``--profile`` runs the judging pass under cProfile (slower: its overhead
is in the figures) and prints the CPU split by where it was spent.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import multiprocessing
import pstats
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import scipy.stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests package

from _common import emit, row

from reconciler.daemon import range_queries
from reconciler.daemon.canary_readings import CanaryReadings
from reconciler.daemon.range_queries import RangeQueries, RangeQuery
from reconciler.protocol.canary_observations import CanaryWatch
from reconciler.protocol.observations import Observations
from reconciler.spec.documents import parse_file
from reconciler.spec.model import Node
from reconciler.spec.rollout_status import NodeRecord
from tests.kit.documents import make_status
from tests.kit.prometheus import PrometheusServer
from tests.kit.servers import metrics_server

HEALTH = (
    "  health:\n    soak: {soak}s\n    interval: 1s\n    compare:\n"
    "      - {{name: latency, query: 'latency_seconds{{node=\"{{node}}\"}}', tolerance: 10%}}\n"
    "      - {{name: errors, errors: 'errors_total{{node=\"{{node}}\"}}', "
    "total: 'requests_total{{node=\"{{node}}\"}}', tolerance: 0.5%}}\n"
)


class FleetExporter:
    """Each scrape: a new latency per node and counters grown by 1,000."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.scrapes = 0
        self.random = random.Random(1)
        self.server = metrics_server(self.text)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        # A child process: the exporter's CPU is not the daemon's.
        fork = multiprocessing.get_context("fork")
        self.process = fork.Process(target=self.server.serve_forever, daemon=True)
        self.process.start()

    def close(self) -> None:
        self.process.kill()
        self.process.join()
        self.server.server_close()

    def text(self) -> str:
        self.scrapes += 1
        lines = []
        for name in self.names:
            lines.append(f'latency_seconds{{node="{name}"}} {self.random.gauss(0.1, 0.005):.6f}')
            lines.append(f'requests_total{{node="{name}"}} {self.scrapes * 1000}')
            lines.append(f'errors_total{{node="{name}"}} {self.scrapes}')
        return "\n".join(lines) + "\n"


def compare_clients(url: str, queries: list[RangeQuery], rounds: int = 2) -> None:
    """The judging pass's queries asked again by each client and
    concurrency, alternately, against the same Prometheus: wall and CPU."""
    ways = {
        "h11, 8 at once": (8, False),
        "h11, 16 at once": (16, False),
        "h11, 32 at once": (32, False),
        "httpx, 8 threads": (8, True),
        "httpx, 16 threads": (16, True),
    }
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, (concurrency, httpx) in ways.items():
            # One request a query, as run --plain asks them: the clients' cost
            client = RangeQueries(concurrency=concurrency, batched=False)
            if httpx:  # the https path: asked here over http, the same server
                client._send_all = client._send_all_httpx  # type: ignore[method-assign]
            wall, cpu = time.perf_counter(), time.process_time()
            answers = client.ask_all(url, queries)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            assert not any(a.error for a in answers.values())
            figures[name].append((wall, cpu))
    print(f"the same {len(queries):,} range queries, best of {rounds}:")
    for name, runs in figures.items():
        wall = min(w for w, _ in runs)
        cpu = min(c for _, c in runs)
        per = cpu / len(queries) * 1e6
        print(f"  {name:20} wall {wall:6.2f} s  CPU {cpu:6.2f} s  ({per:.0f} µs a query)")


class Spent:
    """CPU seconds by part of the judging pass, without a profiler: the
    range-query round as a whole, and functions wrapped where they are
    looked up at each call."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def timing(self, label: str) -> Iterator[None]:
        began = time.process_time()
        try:
            yield
        finally:
            self.seconds[label] = self.seconds.get(label, 0.0) + time.process_time() - began

    def wrap(self, owner: object, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.timing(label):
                return inner(*args, **kwargs)

        setattr(owner, name, timed)

    def show(self, cpu: float) -> None:
        parts = dict(self.seconds)
        ranges = parts.pop("range queries (HTTP client, JSON, parsing)", 0.0)
        parsing = parts.get("JSON parsing and matrices", 0.0)
        rows = {"HTTP client (requests, keep-alive, h11)": ranges - parsing, **parts}
        rows["our own bookkeeping (the rest)"] = (
            cpu - ranges - sum(v for k, v in parts.items() if k.startswith("SciPy"))
        )
        print(f"daemon CPU of the judging pass, {cpu:.2f} s:")
        for label, seconds in rows.items():
            print(f"  {label:45} {seconds:6.3f} s")


# Where a function's own time goes, by the file it is in (first match wins).
SPLIT = (
    (
        "HTTP client (httpx, h11, asyncio, sockets)",
        (
            "httpx",
            "httpcore",
            "h11",
            "asyncio",
            "socket",
            "selectors",
            "ssl",
            "anyio",
            "agent_http",
            "range_queries",
            "urllib",
        ),
    ),
    ("JSON parsing", ("json",)),
    ("SciPy and NumPy", ("scipy", "numpy")),
    ("threads", ("threading", "concurrent", "queue")),
    ("our own bookkeeping", ("reconciler",)),
)


def _label(file: str, name: str) -> str:
    where = file + " " + name
    return next((k for k, marks in SPLIT if any(m in where for m in marks)), "")


def print_split(profile: cProfile.Profile, cpu: float) -> None:
    """The profiled CPU by where it was spent: each function's own time,
    and a built-in's (a socket's send, a dict's get) by its callers'."""
    totals: dict[str, float] = {}
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    for (file, _, name), (_, _, own, _, callers) in stats.items():
        label = _label(file, name)
        if label or not callers:
            totals[label or "other"] = totals.get(label or "other", 0.0) + own
            continue
        spent = sum(c[2] for c in callers.values()) or 1.0
        for (c_file, _, c_name), c in callers.items():
            by = _label(c_file, c_name) or "other"
            totals[by] = totals.get(by, 0.0) + own * c[2] / spent
    print(f"profile of the judging pass ({cpu:.2f} s CPU under cProfile):")
    for label, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {label:45} {seconds:7.3f} s")
    pstats.Stats(profile).sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--soak", type=int, default=15)
    parser.add_argument("--profile", action="store_true", help="print where the CPU went")
    parser.add_argument(
        "--plain", action="store_true", help="each range query a request (run --plain)"
    )
    parser.add_argument(
        "--clients", action="store_true", help="then the same queries by each client, alternately"
    )
    args = parser.parse_args()
    names = [f"n{i:05d}" for i in range(args.nodes)]
    batch = args.nodes // 2
    with tempfile.TemporaryDirectory() as tmp:
        exporter = FleetExporter(names)
        with PrometheusServer(Path(tmp), exporter) as prom:
            source = (
                "apiVersion: reconciler/v1\nkind: Rollout\nmetadata: {name: r}\nspec:\n"
                "  target: {runtime: hermes, provider: ollama, model: llama3.1-8b}\n"
                "  selector: {role: gpu}\n  live: true\n" + HEALTH.format(soak=args.soak)
            )
            spec = parse_file("rollouts/r.yaml", source.encode()).rollout
            assert spec is not None and spec.health is not None
            deadline = time.monotonic() + 60
            while not prom.query("count(latency_seconds)")["data"]["result"]:
                assert time.monotonic() < deadline, "prometheus never scraped the exporter"
                time.sleep(0.2)
            began = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
            time.sleep((began - datetime.now(UTC)).total_seconds() + args.soak + 2)
            states = [
                (n, 1 if i < batch else 2, "dispatched" if i < batch else "pending")
                for i, n in enumerate(names)
            ]
            status = make_status("r", "running", states, batch_size=batch)
            assert status.frozen is not None
            status = replace(status, frozen=replace(status.frozen, health=spec.health))
            fleet = {n: Node(n, "http://127.0.0.1:1", (("role", "gpu"),)) for n in names}
            queries = RangeQueries(batched=not args.plain)
            now = [began]
            judge = CanaryReadings(queries, lambda: now[0])
            for record in status.nodes[:batch]:
                assert isinstance(record, NodeRecord) and record.job_id is not None
                judge.watches[record.name] = CanaryWatch(record.job_id, began)
            judge.observe([status], Observations(), fleet, prom.url)  # a pass during the soak
            now[0] = began + timedelta(seconds=args.soak)
            asked: list[int] = []
            spent = Spent()
            spent.wrap(range_queries, "_split", "JSON parsing and matrices")
            for test in ("mannwhitneyu", "poisson_means_test", "binomtest"):
                spent.wrap(scipy.stats, test, f"SciPy {test}")
            ask_all = queries.ask_all

            asked_queries: list[RangeQuery] = []

            def counted(url, qs):  # type: ignore[no-untyped-def]
                qs = list(dict.fromkeys(qs))
                asked.append(len(qs))
                asked_queries.extend(qs)
                with spent.timing("range queries (HTTP client, JSON, parsing)"):
                    return ask_all(url, qs)

            queries.ask_all = counted  # type: ignore[method-assign]
            requests: list[int] = []
            send_all = queries._send_all

            def sent(url, asks):  # type: ignore[no-untyped-def]
                requests.append(len(asks))
                return send_all(url, asks)

            queries._send_all = sent  # type: ignore[method-assign]
            profile = cProfile.Profile(time.process_time) if args.profile else None
            wall, cpu = time.perf_counter(), time.process_time()
            if profile is not None:
                profile.enable()
            watches = judge.observe([status], Observations(), fleet, prom.url)
            if profile is not None:
                profile.disable()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            verdicts = [v.verdict for w in watches.values() for v in w.verdicts.values()]
            spent.show(cpu)  # before the clients are compared, through the same wrappers
            if args.clients:
                compare_clients(prom.url, asked_queries)
        exporter.close()
    judged = len(verdicts)
    print(
        f"{batch} nodes judged, {judged} comparisons, {sum(asked)} range queries "
        f"in {sum(requests)} requests"
    )
    print(f"verdicts: {sorted(set(verdicts))}")
    if profile is not None:
        print_split(profile, cpu)
    emit(
        [
            row(f"judging a {batch:,}-node batch, two comparisons, wall", wall, "s", 5, "target <"),
            row(f"judging a {batch:,}-node batch, daemon CPU", cpu, "s", 1, "target <"),
        ]
    )


if __name__ == "__main__":
    main()
