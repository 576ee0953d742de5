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

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from tests.kit.ports import start_on_free_port
from tests.kit.servers import ReadyServer, require_binary


def require_alertmanager() -> str:
    return require_binary(
        "RECONCILER_ALERTMANAGER",
        "/usr/bin/prometheus-alertmanager",
        "prometheus-alertmanager",
        "to run the alert tests against a real server",
    )


def _time(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


class AlertmanagerServer(ReadyServer):
    name = "alertmanager"

    def __init__(self, root: Path) -> None:
        self.binary = require_alertmanager()
        super().__init__(root)
        self.config = self.root / "alertmanager.yml"
        self.config.write_text("route: {receiver: nobody}\nreceivers: [{name: nobody}]\n")
        self.port = start_on_free_port(self.start)
        self.wait_ready()

    def arguments(self, port: int) -> list[str]:
        return [
            self.binary,
            f"--config.file={self.config}",
            f"--storage.path={self.root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ]

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

    def __enter__(self) -> AlertmanagerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
