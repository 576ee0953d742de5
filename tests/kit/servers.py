"""Servers tests start on loopback: Debian's, found by their binary (skipped
outside CI when it is missing, failed in CI, where ``.ci/run`` installs it)
and run as a process that serves on a port it was handed and says it is
ready on ``/-/ready`` (prometheus, Alertmanager); and the metrics endpoints
of the exporters those scrape."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.kit.ports import wait_listening


def require_binary(variable: str, default: str, package: str, purpose: str) -> str:
    """The binary at ``$variable`` (default ``default``) or on PATH."""
    wanted = os.environ.get(variable, default)
    found = wanted if os.access(wanted, os.X_OK) else shutil.which(Path(default).name)
    if found:
        return found
    reason = (
        f"{package} is not installed ({wanted} is missing): apt-get install {package} {purpose}"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason + "; .ci/run should have installed it")
    pytest.skip(reason)


class ReadyServer:
    """One server process listening on 127.0.0.1:``port``, its output in
    ``ROOT/NAME.log``; ``start`` raises ``PortTaken`` when it lost the port."""

    name = "server"

    def __init__(self, root: Path) -> None:
        self.root = root / self.name
        self.root.mkdir(parents=True, exist_ok=True)
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.url = ""

    def arguments(self, port: int) -> list[str]:
        raise NotImplementedError

    def start(self, port: int) -> int:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        log_path = self.root / f"{self.name}.log"
        log_path.write_bytes(b"")  # a lost race's log is not this attempt's
        log = open(log_path, "ab")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(self.arguments(port), stdout=log, stderr=log)
        log.close()
        wait_listening(self.process, port, log_path, self.name)
        return port

    def wait_ready(self, timeout: float = 30) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.root / f"{self.name}.log").read_text()[-2000:]
                raise AssertionError(f"{self.name} exited: {log}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{self.name} did not become ready in {timeout:.0f} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def metrics_server(text: Callable[[], str]) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 (port 0) answering every GET with
    ``text()`` in the Prometheus text format; the caller serves it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)
