"""``--log-format json`` writes nothing but JSON lines (docs/operating.md),
from the first line to the last, on both sides: real ``reconciler agent``
and ``reconciler run`` processes, serving and failing to start (a port in
use, a missing key file), and a daemon asking Debian's Alertmanager, whose
HTTP client must not add a line per request."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.kit.agents import listened_address
from tests.kit.alertmanager import AlertmanagerServer
from tests.kit.daemons import DaemonProcess
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.keys import make_key

pytestmark = pytest.mark.slow

START_TIMEOUT = 60  # seconds: a guard for a process that hangs, not a measure


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener.getsockname()[1]


def records(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as JSON; fails naming the first line that is not."""
    found = []
    for line in text.splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}\nin:\n{text}") from None
    assert all({"time", "level", "event", "message"} <= set(r) for r in found), found
    return found


def reconciler(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "reconciler", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=START_TIMEOUT)


def agent_args(tmp_path: Path, listen: str, trust_key: Path) -> list[str]:
    (tmp_path / "state" / "runtimes").mkdir(parents=True, exist_ok=True)
    return [
        "agent", "--node", "gpu-a1", "--state-dir", str(tmp_path / "state"),
        "--trust-key", str(trust_key), "--runtime", "hermes", "--listen", listen,
        "--log-format", "json",
    ]  # fmt: skip


def test_a_serving_agent_writes_only_json_on_stdout_and_stderr(tmp_path: Path) -> None:
    key = make_key(tmp_path / "keys" / "reconciler")
    process = subprocess.Popen(
        [sys.executable, "-m", "reconciler", *agent_args(tmp_path, "127.0.0.1:0", key.public)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    first = process.stdout.readline()
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=START_TIMEOUT)

    (listening, *rest) = records(first + out)
    assert rest == []
    address = listened_address(first)
    assert address is not None and address.startswith("127.0.0.1:")
    assert (listening["event"], listening["message"]) == ("listening", f"listening on {address}")
    assert [r["event"] for r in records(err)] == ["ready"]


def test_an_agent_that_cannot_start_says_why_in_json(tmp_path: Path, taken_port: int) -> None:
    key = make_key(tmp_path / "keys" / "reconciler")

    in_use = reconciler(agent_args(tmp_path, f"127.0.0.1:{taken_port}", key.public))
    no_key = reconciler(agent_args(tmp_path, "127.0.0.1:0", tmp_path / "missing.pub"))

    assert in_use.returncode == 1 and no_key.returncode == 1
    assert records(in_use.stdout) == [] and records(no_key.stdout) == []
    (port_line,) = records(in_use.stderr)
    assert (port_line["level"], port_line["event"]) == ("error", "fatal")
    assert f"cannot listen on 127.0.0.1:{taken_port}" in port_line["message"]
    assert "--listen" in port_line["hint"]
    (key_line,) = records(no_key.stderr)
    assert "missing.pub" in key_line["message"] and key_line["level"] == "error"


def test_a_daemon_that_cannot_start_says_why_in_json(tmp_path: Path, taken_port: int) -> None:
    kit = FleetKit.create(tmp_path, {"web-1": {"role": "web"}})
    try:
        run = ["run", "--repo", str(kit.bare), "--once", "--log-format", "json"]
        no_key = reconciler([*run, "--key", str(tmp_path / "missing")])
        in_use = reconciler(
            [*run, "--key", str(kit.key_path), "--metrics", f"127.0.0.1:{taken_port}"]
        )
    finally:
        kit.close()

    assert no_key.returncode == 1 and in_use.returncode != 0
    (key_line,) = records(no_key.stderr)
    assert (key_line["event"], key_line["level"]) == ("fatal", "error")
    assert "missing" in key_line["message"] and key_line["hint"]
    port_line = records(in_use.stderr)[-1]
    assert port_line["event"] == "fatal"
    assert f"--metrics 127.0.0.1:{taken_port}: cannot listen" in port_line["message"]


def test_a_daemon_asking_alertmanager_writes_no_line_per_request(
    tmp_path: Path,
) -> None:
    with AlertmanagerServer(tmp_path) as am:
        settings = (
            "apiVersion: reconciler/v1\nkind: Settings\nspec:\n"
            f"  alertmanager: {{url: '{am.url}'}}\n"
        )
        kit = FleetKit.create(
            tmp_path, {"web-1": {"role": "web"}}, files={"reconciler.yaml": settings}
        )
        try:
            health = "{soak: 30s, interval: 1s, alerts: {matchers: ['severity=\"page\"']}}"
            rollout = rollout_yaml("web", selector={"role": "web"}, live=True, health=health)
            kit.push({"rollouts/web.yaml": rollout})
            with DaemonProcess(
                kit.bare, kit.key_path, "--log-format", "json", "--interval", "0.2s"
            ) as daemon:
                # A batch starts only once Alertmanager has answered.
                daemon.wait_line(lambda line: "dispatched" in line, 60, "the job sent")
        finally:
            kit.close()

    logged = records("\n".join(daemon.lines))
    assert any(r["event"] == "stopped" for r in logged)
    assert [r for r in logged if r.get("logger", "").startswith(("httpx", "httpcore"))] == []


@pytest.mark.parametrize("asked", [["--log-format", "json"], ["--log-format=json"]])
def test_a_usage_error_of_a_json_logging_command_is_one_json_line(
    tmp_path: Path, asked: list[str]
) -> None:
    key = make_key(tmp_path / "keys" / "reconciler")
    done = reconciler(["run", "--repo", str(tmp_path), "--key", str(key.private), *asked, "-x"])

    assert done.returncode == 2
    assert records(done.stdout) == []
    (line,) = records(done.stderr)
    assert (line["level"], line["event"]) == ("error", "usage")
    assert "unrecognized arguments: -x" in line["message"] and line["exitCode"] == 2
