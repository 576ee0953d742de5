"""A real Prometheus for tests: Debian's ``prometheus`` started on a
loopback port with a temporary config and data directory, scraping (every
second) a small exporter the test runs on loopback and whose values it
changes. Nothing listens anywhere but 127.0.0.1.

    with Exporter() as exporter, PrometheusServer(tmp_path, exporter) as prom:
        exporter.set("http_errors_ratio", 0.5, node="gpu-a1")
        prom.wait_for_value('http_errors_ratio{node="gpu-a1"}', 0.5)

Without the binary the test is skipped, saying why; in CI (``CI=true``,
where ``.ci/run`` installs the package) a missing binary fails instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.kit.ports import start_on_free_port
from tests.kit.servers import ReadyServer, metrics_server, require_binary


def require_prometheus() -> str:
    """The prometheus binary, or skip (outside CI) / fail (in CI)."""
    return require_binary(
        "RECONCILER_PROMETHEUS",
        "/usr/bin/prometheus",
        "prometheus",
        "to run the health-check tests against a real server",
    )


class Exporter:
    """``GET /metrics`` on 127.0.0.1 in the text exposition format, with the
    gauges set last."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.lock = threading.Lock()
        self.server = metrics_server(self.text)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def set(self, name: str, value: float, **labels: str) -> None:
        with self.lock:
            self.values[(name, tuple(sorted(labels.items())))] = value

    def text(self) -> str:
        with self.lock:
            lines = []
            for (name, labels), value in sorted(self.values.items()):
                shown = ",".join(f'{k}="{v}"' for k, v in labels)
                lines.append(f"{name}{{{shown}}} {value}")
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PrometheusServer(ReadyServer):
    """One ``prometheus`` process on 127.0.0.1:PORT scraping ``exporter``
    (prometheus cannot bind port 0 and say which it got, so it starts on a
    port held until then, and on another if it lost that one)."""

    name = "prometheus"

    def __init__(
        self, root: Path, exporter: Exporter | None = None, *, targets: Sequence[Any] = ()
    ) -> None:
        """``exporter`` scraped as is, and each of ``targets`` (with
        ``address`` and ``node``) with the label ``node`` set to its node."""
        self.binary = require_prometheus()
        super().__init__(root)
        self.config = self.root / "prometheus.yml"
        static = [f"{{targets: ['{exporter.address}']}}"] if exporter is not None else []
        static += [f"{{targets: ['{t.address}'], labels: {{node: {t.node}}}}}" for t in targets]
        self.config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            "  - job_name: exporter\n"
            f"    static_configs: [{', '.join(static)}]\n"
        )
        self.port = start_on_free_port(self.start)
        self.wait_ready()

    def arguments(self, port: int) -> list[str]:
        return [
            self.binary,
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
        ]

    def query(self, query: str) -> Any:
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": query}, timeout=5)
        return answer.json()

    def range_queries_answered(self) -> float:
        """Prometheus's own count of the range queries it has answered, from
        its ``/metrics``."""
        text = httpx.get(self.url + "/metrics", timeout=5).text
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "prometheus_http_requests_total"
            and sample.labels.get("handler") == "/api/v1/query_range"
        )

    def wait_for_value(self, query: str, value: float, timeout: float = 20) -> None:
        """Until the query's first sample shows ``value`` (scrapes take a second)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(query).get("data", {}).get("result", [])
            if result and float(result[0]["value"][1]) == value:
                return
            time.sleep(0.2)
        raise AssertionError(f"prometheus never showed {query} = {value}")

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
