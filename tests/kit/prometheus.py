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

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.kit.ports import start_on_free_port, wait_listening

PROMETHEUS = os.environ.get("RECONCILER_PROMETHEUS", "/usr/bin/prometheus")


def require_prometheus() -> str:
    """The prometheus binary, or skip (outside CI) / fail (in CI)."""
    found = PROMETHEUS if os.access(PROMETHEUS, os.X_OK) else shutil.which("prometheus")
    if found:
        return found
    reason = (
        f"prometheus is not installed ({PROMETHEUS} is missing): "
        "apt-get install prometheus to run the health-check tests against a real server"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason + "; .ci/run should have installed it")
    pytest.skip(reason)


class Exporter:
    """``GET /metrics`` on 127.0.0.1 in the text exposition format, with the
    gauges set last."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.lock = threading.Lock()
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


class PrometheusServer:
    """One ``prometheus`` process on 127.0.0.1:PORT scraping ``exporter``
    (prometheus cannot bind port 0 and say which it got, so it starts on a
    port held until then, and on another if it lost that one)."""

    def __init__(
        self, root: Path, exporter: Exporter | None = None, *, targets: Sequence[Any] = ()
    ) -> None:
        """``exporter`` scraped as is, and each of ``targets`` (with
        ``address`` and ``node``) with the label ``node`` set to its node."""
        self.binary = require_prometheus()
        self.root = root / "prometheus"
        self.root.mkdir(parents=True, exist_ok=True)
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
        self.process: subprocess.Popen[bytes] | None = None
        self.port = start_on_free_port(self._start)
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_ready()

    def _start(self, port: int) -> int:
        self.port = port
        log_path = self.root / "prometheus.log"
        log_path.write_bytes(b"")  # a lost race's log is not this attempt's
        log = open(log_path, "ab")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.root / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        wait_listening(self.process, port, log_path, "prometheus")
        return port

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(
                    "prometheus exited: " + (self.root / "prometheus.log").read_text()[-2000:]
                )
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("prometheus did not become ready in 30 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def query(self, query: str) -> Any:
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": query}, timeout=5)
        return answer.json()

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
