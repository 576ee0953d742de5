"""Exporters for the canary tests, one per node, each on its own loopback
port: every scrape shows a new latency drawn from a normal distribution
(around 100 ms by default, times a factor the test sets) and request
counters that grow by a fixed number per scrape, with an error share the
test sets. Prometheus gives each target its ``node`` label.

    with NodeExporter("gpu-a1", factor=1.3) as slow, NodeExporter("gpu-a2") as base:
        with PrometheusServer(tmp_path, targets=[slow, base]) as prom: ...
"""

from __future__ import annotations

import random
import threading

from tests.kit.servers import metrics_server

LATENCY = 0.1  # seconds: the baseline's mean
SPREAD = 0.03  # the standard deviation, as a share of the mean
REQUESTS_PER_SCRAPE = 1000


class NodeExporter:
    def __init__(
        self, node: str, *, factor: float = 1.0, error_share: float = 0.001, seed: int = 0
    ) -> None:
        self.node = node
        self.factor = factor
        self.error_share = error_share
        self.random = random.Random(f"{node}:{seed}")
        self.requests = 0.0
        self.errors = 0.0
        self.lock = threading.Lock()
        self.server = metrics_server(self.scrape)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def set(self, *, factor: float | None = None, error_share: float | None = None) -> None:
        with self.lock:
            self.factor = self.factor if factor is None else factor
            self.error_share = self.error_share if error_share is None else error_share

    def scrape(self) -> str:
        with self.lock:
            mean = LATENCY * self.factor
            latency = max(0.0, self.random.gauss(mean, mean * SPREAD))
            self.requests += REQUESTS_PER_SCRAPE
            self.errors += REQUESTS_PER_SCRAPE * self.error_share
            ok = self.requests - self.errors
            return (
                f"request_latency_seconds {latency:.6f}\n"
                f'http_requests_total{{code="200"}} {ok:.0f}\n'
                f'http_requests_total{{code="500"}} {self.errors:.0f}\n'
            )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def __enter__(self) -> NodeExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
