"""``reconciler run`` as a real process: its stderr read line by line in a
thread, so a test can wait for a line and look at every line it wrote.

    with DaemonProcess(kit.bare, kit.key_path, "--metrics", "127.0.0.1:0") as daemon:
        address = daemon.metrics_address()
        ...
    daemon.lines          # every stderr line, the last ones included
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.kit.waiting import wait_for

_LISTENING = re.compile(r"listening on (127\.0\.0\.1:\d+)")


class DaemonProcess:
    def __init__(
        self,
        repo: Path | str,
        key: Path,
        *args: str,
        env: Mapping[str, str] | None = None,
        module: tuple[str, ...] = ("run",),
    ) -> None:
        command = [sys.executable, "-m", "reconciler", *module]
        if module == ("run",):
            command += ["--repo", str(repo), "--key", str(key)]
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            [*command, *args],
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def seen(self, check: Callable[[str], Any]) -> list[str]:
        with self._lock:
            return [line for line in self.lines if check(line)]

    def wait_line(self, check: Callable[[str], Any], timeout: float = 60, what: str = "") -> str:
        found: list[str] = wait_for(
            lambda: self.seen(check) or self._ended(), timeout, what or "a log line"
        )
        return found[0]

    def _ended(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(
                f"the daemon exited ({self.process.returncode}):\n" + "\n".join(self.lines[-30:])
            )

    def metrics_address(self, timeout: float = 60) -> str:
        """The HOST:PORT ``--metrics 127.0.0.1:0`` got, from its log line."""
        line = self.wait_line(lambda line: _LISTENING.search(line), timeout, "metrics")
        match = _LISTENING.search(line)
        assert match is not None
        return match.group(1)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, and the exit code; all of stderr has been read after it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(timeout)
        self._reader.join(timeout)
        return code

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
