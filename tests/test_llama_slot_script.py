"""The slot commands shipped for llama-server behind nginx
(example-repo/deploy/llama-server-slot.sh), run directly as the agent
would run them: stop touches only its own server, route rewrites the
upstream include and puts it back when nginx does not reload. Starting
real slots and routing a real nginx is in test_standby_llama.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

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
