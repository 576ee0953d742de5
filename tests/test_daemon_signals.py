"""SIGTERM at any moment of the daemon's start-up ends it cleanly: exit 0
(or, before Python has even loaded the command, the plain signal exit), and
never a traceback."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.kit.git import make_bare_repo
from tests.kit.keys import make_key


@pytest.fixture
def daemon_args(tmp_path: Path) -> list[str]:
    key = make_key(tmp_path / "keys" / "reconciler").private
    bare = make_bare_repo(tmp_path, {"nodes/.keep": ""}, message="Seed the fleet")
    return [
        sys.executable,
        "-m",
        "reconciler",
        "run",
        "--repo",
        str(bare),
        "--key",
        str(key),
        "--interval",
        "1s",
    ]


def _terminate_after(args: list[str], delay: float) -> tuple[int, str]:
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    process.send_signal(signal.SIGTERM)
    try:
        _, err = process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
        raise AssertionError(f"the daemon did not stop within 20 s of SIGTERM:\n{err}") from None
    return process.returncode, err


@pytest.mark.parametrize("delay", [0.05, 0.2, 0.4, 0.6, 0.9, 1.3])
def test_sigterm_during_start_up_ends_cleanly(daemon_args: list[str], delay: float) -> None:
    code, err = _terminate_after(daemon_args, delay)

    assert "Traceback" not in err, err
    assert code in (0, -signal.SIGTERM), (code, err)


def _terminate_after_start(args: list[str], wait: float) -> tuple[int, str]:
    """SIGTERM ``wait`` seconds after the daemon logged that it started."""
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if "acting on" in line:
            break
    time.sleep(wait)
    process.send_signal(signal.SIGTERM)
    _, rest = process.communicate(timeout=20)
    return process.returncode, "".join(seen) + rest


def test_sigterm_right_after_the_start_line_is_not_lost(daemon_args: list[str]) -> None:
    # The gap between the start line and the serving loop's own handlers:
    # the signal used to kill the daemon there, or be forgotten by serve.
    code, err = _terminate_after_start(daemon_args, 0.0)

    assert "Traceback" not in err, err
    assert code == 0, err
    assert "clean stop" in err or "stopped by SIGTERM during start-up" in err


def test_sigterm_once_serving_finishes_the_pass_and_exits_0(daemon_args: list[str]) -> None:
    code, err = _terminate_after_start(daemon_args, 2.0)

    assert "Traceback" not in err, err
    assert code == 0, err
    assert "clean stop" in err
