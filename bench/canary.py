"""Judging a batch's comparisons against a real Prometheus (docs/health.md):
Debian's ``prometheus`` scrapes every second one exporter that shows a
latency and request counters for each of ``--nodes`` nodes; once it holds a
soak's worth of samples, the daemon's ``CanaryVerdicts`` judges a batch of
half of them (two comparisons each, a latency and an error rate) against
the other half, the rollout's nodes not yet dispatched.

    .venv/bin/python bench/canary.py                 # 2,000 nodes: a batch of 1,000
    .venv/bin/python bench/canary.py --nodes 200 --soak 10

Printed: the wall time of the judging pass, the CPU this process spent in
it (the daemon's side: HTTP, parsing, SciPy), the range queries asked.
Targets: under 5 s of wall time and under 1 s of daemon CPU.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests package

from _common import emit, row

from reconciler.daemon.canary_verdicts import CanaryVerdicts
from reconciler.daemon.range_queries import RangeQueries
from reconciler.protocol.canary_observations import CanaryWatch
from reconciler.protocol.observations import Observations
from reconciler.spec.documents import parse_file
from reconciler.spec.model import Node
from reconciler.spec.rollout_status import NodeRecord
from tests.kit.documents import make_status
from tests.kit.prometheus import PrometheusServer

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
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exporter.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def text(self) -> str:
        self.scrapes += 1
        lines = []
        for name in self.names:
            lines.append(f'latency_seconds{{node="{name}"}} {self.random.gauss(0.1, 0.005):.6f}')
            lines.append(f'requests_total{{node="{name}"}} {self.scrapes * 1000}')
            lines.append(f'errors_total{{node="{name}"}} {self.scrapes}')
        return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--soak", type=int, default=15)
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
            queries = RangeQueries()
            judge = CanaryVerdicts(queries, lambda: began + timedelta(seconds=args.soak))
            for record in status.nodes[:batch]:
                assert isinstance(record, NodeRecord) and record.job_id is not None
                judge.watches[record.name] = CanaryWatch(record.job_id, began)
            asked: list[int] = []
            ask_all = queries.ask_all

            def counted(url, qs):  # type: ignore[no-untyped-def]
                qs = list(dict.fromkeys(qs))
                asked.append(len(qs))
                return ask_all(url, qs)

            queries.ask_all = counted  # type: ignore[method-assign]
            wall, cpu = time.perf_counter(), time.process_time()
            watches = judge.observe([status], Observations(), fleet, prom.url)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            verdicts = [v.verdict for w in watches.values() for v in w.verdicts.values()]
            queries.close()
    judged = len(verdicts)
    print(f"{batch} nodes judged, {judged} comparisons, {sum(asked)} range queries")
    print(f"verdicts: {sorted(set(verdicts))}")
    emit(
        [
            row(f"judging a {batch:,}-node batch, two comparisons, wall", wall, "s", 5, "target <"),
            row(f"judging a {batch:,}-node batch, daemon CPU", cpu, "s", 1, "target <"),
        ]
    )


if __name__ == "__main__":
    main()
