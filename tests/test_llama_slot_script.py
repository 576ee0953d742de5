"""The slot commands shipped for llama-server behind nginx
(example-repo/deploy/llama-server-slot.sh), run directly as the agent
would run them: stop touches only its own server, route rewrites the
upstream include and puts it back when nginx does not reload. Starting
real slots and routing a real nginx is in test_standby_llama.py."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.kit.nginx import NginxRouter
from tests.kit.standby import slot_script


def _run(action: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    settings = {
        "RECONCILER_SLOT": "b",
        "RECONCILER_SLOT_PORT": "18082",
        "LLAMA_SERVER_MODE": "pidfile",
        "LLAMA_SERVER_RUN_DIR": str(tmp_path / "run"),
        "NGINX_UPSTREAM_FILE": str(tmp_path / "upstream.conf"),
        "NGINX_PID_FILE": str(tmp_path / "no-nginx.pid"),
        **env,
    }
    return subprocess.run(
        ["bash", str(slot_script()), action],
        env={**os.environ, **settings},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_route_points_the_upstream_include_at_the_slot(tmp_path: Path) -> None:
    (tmp_path / "upstream.conf").write_text("server 127.0.0.1:18081;\n")

    done = _run("route", tmp_path, NGINX_RELOAD="true")

    assert done.returncode == 0, done.stderr
    assert (tmp_path / "upstream.conf").read_text() == "server 127.0.0.1:18082;\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["upstream.conf"]


def test_a_failed_reload_puts_the_previous_include_back(tmp_path: Path) -> None:
    (tmp_path / "upstream.conf").write_text("server 127.0.0.1:18081;\n")

    done = _run("route", tmp_path, NGINX_RELOAD="false")

    assert done.returncode == 1
    assert "nginx reload failed" in done.stderr
    assert (tmp_path / "upstream.conf").read_text() == "server 127.0.0.1:18081;\n"


def test_stop_leaves_alone_a_process_that_took_its_stale_pid(tmp_path: Path) -> None:
    """The slot's server is gone and its pid went to another process:
    stopping the slot must not signal that one."""
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "18082.pid").write_text(f"{stranger.pid}\n")

        done = _run("stop", tmp_path)

        assert done.returncode == 0, done.stderr
        assert "no llama-server of ours running" in done.stdout
        assert stranger.poll() is None  # still running, never signalled
    finally:
        stranger.kill()
        stranger.wait()


def test_an_unknown_action_fails_saying_which_there_are(tmp_path: Path) -> None:
    done = _run("restart", tmp_path)

    assert done.returncode == 1
    assert "use start, stop or route" in done.stderr


class _StandIn(ThreadingHTTPServer):
    """An upstream on 127.0.0.1 that answers ``name``; with ``hold``, it
    keeps every request open until the event is set."""

    def __init__(self, name: str, hold: threading.Event | None = None) -> None:
        self.name, self.hold, self.received = name, hold, threading.Event()
        super().__init__(("127.0.0.1", 0), _StandInHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


class _StandInHandler(BaseHTTPRequestHandler):
    server: _StandIn
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.server.received.set()
        if self.server.hold is not None:
            self.server.hold.wait(60)
        body = self.server.name.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _replacing(tmp_path: Path) -> dict[str, str]:
    """What ``start`` needs to replace a slot's server without a real
    llama-server: a config naming a model file, and a stand-in binary that
    waits (it is not asked for /health)."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "model.gguf").write_bytes(b"GGUF")
    config = tmp_path / "hermes.yaml"
    config.write_text(f"modelDir: {model_dir}\n")
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\nexec sleep 600\n")
    binary.chmod(0o755)
    return {"RECONCILER_CONFIG": str(config), "LLAMA_SERVER": str(binary), "LLAMA_SERVER_WAIT": "0"}


@pytest.mark.parametrize("action", ["stop", "start"])
def test_route_returns_while_an_old_worker_finishes_and_the_old_slot_waits_for_it(
    tmp_path: Path, action: str
) -> None:
    """A real nginx routes to stand-in upstreams, because a real
    llama-server cannot be made to hold a request open for a controlled
    time. Route must return while the old worker still proxies a slow
    request to the old slot, and send new requests to the new one. Stopping
    the old slot's server, or starting another in its place (a warm slot
    taken by a later rollout), must wait until that request is answered."""
    release = threading.Event()
    old_slot, new_slot = _StandIn("old", hold=release), _StandIn("new")
    old_port, new_port = old_slot.server_address[1], new_slot.server_address[1]
    (tmp_path / "run").mkdir()
    # A process the stop command takes for the old slot's llama-server
    # (a command line with "--port PORT ").
    server = subprocess.Popen(
        ["python3", "-c", "import time; time.sleep(600)", "--port", str(old_port), "-m"]
    )
    threading.Thread(target=server.wait, daemon=True).start()  # reaped once stopped
    (tmp_path / "run" / f"{old_port}.pid").write_text(f"{server.pid}\n")
    router = NginxRouter(tmp_path / "nginx", tmp_path / "upstream.conf", old_port)
    slow: list[httpx.Response] = []
    try:
        client = threading.Thread(
            target=lambda: slow.append(httpx.get(router.base_url + "/slow", timeout=60))
        )
        client.start()
        assert old_slot.received.wait(30)
        nginx = {
            "NGINX_UPSTREAM_FILE": str(router.upstream),
            "NGINX_PID_FILE": str(router.root / "nginx.pid"),
            "NGINX_RELOAD": router.reload_command(),
            "NGINX_RELOAD_WAIT": "30",
        }

        routed = _run("route", tmp_path, RECONCILER_SLOT_PORT=str(new_port), **nginx)

        assert routed.returncode == 0, routed.stderr
        assert "after 30s" not in routed.stdout  # the bound was not hit
        assert client.is_alive()  # the old worker still holds the slow request
        assert httpx.get(router.base_url + "/next", timeout=30).text == "new"

        replacing = _replacing(tmp_path) if action == "start" else {}
        command = subprocess.Popen(
            ["bash", str(slot_script()), action],
            env={
                **os.environ,
                **nginx,
                **replacing,
                "RECONCILER_SLOT": "a",
                "RECONCILER_SLOT_PORT": str(old_port),
                "LLAMA_SERVER_MODE": "pidfile",
                "LLAMA_SERVER_RUN_DIR": str(tmp_path / "run"),
            },
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(1)  # room for a command that does not wait to stop the server
        still_running = server.poll() is None
        release.set()
        out, _ = command.communicate(timeout=60)
        client.join(60)

        assert still_running, out
        assert command.returncode == 0
        server.wait(timeout=10)  # stopped once the request was answered
        assert [r.text for r in slow] == ["old"] and slow[0].status_code == 200
        if action == "stop":
            assert "llama-server" in out and "stopped" in out
        else:  # another server now holds the slot's pid file
            started = int((tmp_path / "run" / f"{old_port}.pid").read_text())
            assert started != server.pid and "starting on" in out, out
    finally:
        release.set()
        router.close()
        server.kill()
        server.wait()
        _stop_started(tmp_path / "run" / f"{old_port}.pid", server.pid)
        old_slot.shutdown()
        new_slot.shutdown()


def _stop_started(pid_file: Path, stopped: int) -> None:
    """The stand-in server ``start`` left running, if any."""
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return
    if pid != stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
