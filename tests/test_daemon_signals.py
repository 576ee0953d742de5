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
from gitutil import make_bare_repo

from reconciler.protocol.signing import generate_key


@pytest.fixture
def daemon_args(tmp_path: Path) -> list[str]:
    key, _ = generate_key(tmp_path / "keys")
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


def test_sigterm_once_serving_finishes_the_pass_and_exits_0(daemon_args: list[str]) -> None:
    process = subprocess.Popen(
        daemon_args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stderr is not None
    seen = []
    for line in process.stderr:  # wait until the daemon says it started
        seen.append(line)
        if " start " in f" {line} " or "start:" in line or "acting on" in line:
            break
    process.send_signal(signal.SIGTERM)
    _, rest = process.communicate(timeout=20)
    err = "".join(seen) + rest

    assert "Traceback" not in err, err
    assert process.returncode == 0, err
    assert "clean stop" in err
