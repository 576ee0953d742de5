"""Node-local commands the operator configures (``--after-apply``, and the
drain commands): run through ``/bin/sh`` in a session of their own, bounded
in time and in the output kept.

Must not: take a command from a job (only the agent's own options name
them), or wait past a command's timeout.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping

OUTPUT_TAIL = 2000  # characters of a command's output kept in a job's result


def run_command(
    what: str, command: str, env: Mapping[str, str], timeout: float
) -> tuple[str, str] | None:
    """None when ``command`` succeeded, else (what happened, output tail);
    ``what`` names it in the message ("after-apply command")."""
    try:
        process = subprocess.Popen(
            ["/bin/sh", "-c", command],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group, so a timeout kills all of it
        )
    except OSError as exc:
        return f"{what} could not start: {exc.strerror}", ""
    assert process.stdout is not None
    output, finished = _read_bounded(process, timeout)
    if not finished:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        tail = output.decode("utf-8", "replace")[-OUTPUT_TAIL:]
        return f"{what} timed out after {timeout:g}s", tail
    tail = output.decode("utf-8", "replace")[-OUTPUT_TAIL:]
    if process.returncode != 0:
        how = (
            f"killed by signal {-process.returncode}"
            if process.returncode < 0
            else f"exit status {process.returncode}"
        )
        return f"{what} failed ({how})", tail
    return None


OUTPUT_GRACE = 1.0  # seconds to drain output after the command exited


def _read_bounded(process: subprocess.Popen[bytes], timeout: float) -> tuple[bytes, bool]:
    """The command's output, and whether it exited within ``timeout``.

    Never waits past ``timeout`` (plus a short grace to drain the pipe once
    the command exited): a background process the command started, even in
    a session of its own, may keep the pipe open for as long as it lives, so
    end of output is not awaited; the pipe is closed when we stop reading.
    """
    assert process.stdout is not None
    fd = process.stdout.fileno()
    os.set_blocking(fd, False)
    kept = bytearray()
    deadline = time.monotonic() + timeout
    exited_at: float | None = None
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if exited_at is None and process.poll() is not None:
                exited_at = now
            limit = deadline if exited_at is None else min(deadline, exited_at + OUTPUT_GRACE)
            if now >= limit:
                break
            if not selector.select(min(limit - now, 0.2)):
                continue
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:  # end of output: only the exit status is left to wait for
                selector.unregister(fd)
                remaining = deadline - time.monotonic()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=max(remaining, 0))
                break
            kept += chunk
            del kept[: max(0, len(kept) - 4 * OUTPUT_TAIL)]  # memory stays bounded
    process.stdout.close()
    return bytes(kept), process.poll() is not None
