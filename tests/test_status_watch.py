"""``reconciler status --watch`` in a real terminal (a pty): a new status
commit pushed by the daemon shows up without the operator doing anything."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.kit.documents import make_status, status_text
from tests.kit.git import OPERATOR, commit, git, git_env, make_repo

NODES = [("gpu-a1", 1, "succeeded"), ("gpu-a2", 2, "dispatched")]


def _interruptible() -> None:
    """Ctrl-C as in a terminal's foreground: a suite started in the
    background (``make test &``) runs with SIGINT ignored, which every child
    inherits, and Python leaves an ignored SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Terminal:
    """A process whose stdin, stdout and stderr are a pty, read as text."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            close_fds=True,
            preexec_fn=_interruptible,
        )
        os.close(slave)
        self.screen = ""

    def wait_for(self, text: str, timeout: float = 15.0) -> str:
        """Read until ``text`` appears after what was read so far; return the new output."""
        start = len(self.screen)
        deadline = time.monotonic() + timeout
        while text not in self.screen[start:]:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} did not appear; screen:\n{self.screen[start:]}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # the child closed the pty
                    chunk = b""
                assert chunk, f"process ended before {text!r}; screen:\n{self.screen}"
                self.screen += chunk.decode("utf-8", "replace")
        return self.screen[start:]

    def close(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=10)
        os.close(self.master)
        return code


def test_watch_redraws_when_a_new_status_commit_arrives(tmp_path: Path) -> None:
    env = git_env(*OPERATOR)
    # The fleet as the daemon left it, in a bare origin; the operator has a clone.
    seed = make_repo(
        tmp_path / "seed",
        status_text(make_status("llama-canary", "running", NODES)),
    )
    origin = tmp_path / "fleet.git"
    git("clone", "--quiet", "--bare", str(seed), str(origin), cwd=tmp_path, env=env)
    mine = tmp_path / "mine"
    git("clone", "--quiet", str(origin), str(mine), cwd=tmp_path, env=env)
    daemon = tmp_path / "daemon"
    git("clone", "--quiet", str(origin), str(daemon), cwd=tmp_path, env=env)

    term_env = {k: v for k, v in env.items() if k != "NO_COLOR"}
    term_env.update(TERM="xterm", COLUMNS="80", LINES="40")
    term = Terminal(
        [sys.executable, "-m", "reconciler", "status", "--watch", "--repo", str(mine)], term_env
    )
    try:
        first = term.wait_for("Ctrl-C to stop")
        assert "llama-canary" in first
        assert "\x1b[34mrunning" in first  # a terminal: coloured
        assert "paused" not in first

        held = make_status(
            "llama-canary",
            "paused",
            [("gpu-a1", 1, "succeeded"), ("gpu-a2", 2, "failed")],
            hold="health_failed",
            hold_nodes=["gpu-a2"],
        )
        commit(daemon, status_text(held), "status: llama-canary paused")
        git("push", "--quiet", "origin", "main", cwd=daemon, env=env)
        tip = git("rev-parse", "HEAD", cwd=daemon, env=env).strip()

        redrawn = term.wait_for(tip[:10])
        assert "\x1b[H\x1b[2J" in redrawn  # the screen was cleared and redrawn
        assert "\x1b[33mpaused" in redrawn
        assert "health_failed" in redrawn
        assert "✗1" in redrawn
    finally:
        code = term.close()
    assert code == 0  # Ctrl-C ends a watch normally
