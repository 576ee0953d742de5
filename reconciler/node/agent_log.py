"""The agent's log: one line per job accepted, finished or refused, for
people (text) or machines (JSON, one object per line), on stderr.

Lines have the daemon's shape (``protocol.log_lines``), so one log search
covers both sides of a job. Must not: decide anything, or show a job's
payload beyond its id, kind, rollout and target.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import Any, TextIO

from reconciler.protocol.job_view import JobPayload
from reconciler.protocol.log_lines import FORMATS, log_line, now_text


class AgentLog:
    def __init__(self, fmt: str = "text", stream: TextIO | None = None) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"log format must be text or json, got {fmt!r}")
        self.fmt = fmt
        self.stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()  # the request loop and the job thread both write

    def accepted(self, job: JobPayload) -> None:
        self._write("info", "job_accepted", f"{job.kind} accepted", _job_fields(job))

    def finished(self, job: JobPayload, state: str, error: str = "") -> None:
        level = "info" if state == "succeeded" else "warning"
        message = f"{job.kind} {state}" + (f": {error}" if error else "")
        self._write(level, "job_finished", message, {**_job_fields(job), "state": state})

    def refused(self, status: int, code: str, message: str, job_id: str = "") -> None:
        fields = {"code": code, "status": status, "job": job_id}
        self._write("warning", "job_refused", message, fields)

    def ready(self, address: str) -> None:
        """Serving: as a line of the log in JSON, as the bare words people
        and scripts have read on stderr in text."""
        if self.fmt == "json":
            self._write("info", "ready", "agent: ready", {"address": address})
            return
        with self._lock:
            print("agent: ready", file=self.stream, flush=True)

    def _write(self, level: str, event: str, message: str, fields: Mapping[str, Any]) -> None:
        line = log_line(self.fmt, now_text(), level, event, message, fields)
        with self._lock:
            print(line, file=self.stream, flush=True)


def _job_fields(job: JobPayload) -> dict[str, Any]:
    return {
        "job": job.job_id,
        "kind": job.kind,
        "rollout": job.rollout,
        "runtime": job.target.runtime,
        "mode": job.mode,
    }
