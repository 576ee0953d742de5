"""A real Alertmanager for tests: Debian's ``prometheus-alertmanager``
started on a loopback port with a temporary config and storage, no
clustering (``--cluster.listen-address=`` empty), ready once ``/-/ready``
answers. Alerts are posted and silenced through its own API v2.

    with AlertmanagerServer(tmp_path) as am:
        am.post_alert("GpuHot", node="gpu-a1", severity="page")
        am.silence(alertname="GpuHot")

Without the binary the test is skipped, saying why; in CI a missing binary
fails instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.kit.ports import start_on_free_port, wait_listening

ALERTMANAGER = os.environ.get("RECONCILER_ALERTMANAGER", "/usr/bin/prometheus-alertmanager")


def require_alertmanager() -> str:
    found = (
        ALERTMANAGER
        if os.access(ALERTMANAGER, os.X_OK)
        else shutil.which("prometheus-alertmanager")
    )
    if found:
        return found
    reason = (
        f"prometheus-alertmanager is not installed ({ALERTMANAGER} is missing): "
        "apt-get install prometheus-alertmanager to run the alert tests against a real server"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(reason + "; .ci/run should have installed it")
    pytest.skip(reason)


def _time(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


class AlertmanagerServer:
    def __init__(self, root: Path) -> None:
        self.binary = require_alertmanager()
        self.root = root / "alertmanager"
        self.root.mkdir(parents=True, exist_ok=True)
        self.config = self.root / "alertmanager.yml"
        self.config.write_text("route: {receiver: nobody}\nreceivers: [{name: nobody}]\n")
        self.process: subprocess.Popen[bytes] | None = None
        self.port = start_on_free_port(self._start)
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_ready()

    def _start(self, port: int) -> int:
        self.port = port
        log_path = self.root / "alertmanager.log"
        log_path.write_bytes(b"")
        log = open(log_path, "ab")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.config}",
                f"--storage.path={self.root / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        wait_listening(self.process, port, log_path, "alertmanager")
        return port

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = (self.root / "alertmanager.log").read_text()[-2000:]
                raise AssertionError("alertmanager exited: " + log)
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("alertmanager did not become ready in 30 s")

    def post_alert(self, alertname: str, **labels: str) -> None:
        """A firing alert, through API v2, for the next hour."""
        now = datetime.now(UTC)
        alert = {
            "labels": {"alertname": alertname, **labels},
            "startsAt": _time(now),
            "endsAt": _time(now + timedelta(hours=1)),
        }
        answer = httpx.post(f"{self.url}/api/v2/alerts", json=[alert], timeout=5)
        answer.raise_for_status()

    def silence(self, **labels: str) -> str:
        """A silence of the alerts with these labels, through API v2."""
        now = datetime.now(UTC)
        body = {
            "matchers": [
                {"name": k, "value": v, "isRegex": False, "isEqual": True}
                for k, v in labels.items()
            ],
            "startsAt": _time(now - timedelta(seconds=1)),
            "endsAt": _time(now + timedelta(hours=1)),
            "createdBy": "tests",
            "comment": "silenced by the test",
        }
        answer = httpx.post(f"{self.url}/api/v2/silences", json=body, timeout=5)
        answer.raise_for_status()
        return str(answer.json()["silenceID"])

    def alerts(self, *matchers: str) -> Any:
        params = [("active", "true"), ("silenced", "false"), ("inhibited", "false")]
        params += [("filter", m) for m in matchers]
        return httpx.get(f"{self.url}/api/v2/alerts", params=params, timeout=5).json()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> AlertmanagerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
