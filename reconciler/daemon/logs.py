"""One line per event, for people (text) or for machines (JSON).

Every event names what it is about (rollout, node, commit) as fields, so a
log search for one rollout finds its whole story.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from reconciler.spec.errors import redact_url
from reconciler.spec.times import format_time

LEVELS = ("debug", "info", "warning", "error")


class EventLog:
    def __init__(
        self, fmt: str = "text", stream: TextIO | None = None, level: str = "info"
    ) -> None:
        if fmt not in ("text", "json"):
            raise ValueError(f"log format must be text or json, got {fmt!r}")
        self.fmt = fmt
        self.stream = stream or sys.stderr
        self.min_level = LEVELS.index(level)

    def event(self, event: str, message: str = "", *, level: str = "info", **fields: Any) -> None:
        if LEVELS.index(level) < self.min_level:
            return
        fields = {k: v for k, v in fields.items() if v is not None and v != ""}
        now = format_time(datetime.now(UTC).replace(microsecond=0))
        if self.fmt == "json":
            record = {"time": now, "level": level, "event": event, "message": message, **fields}
            line = json.dumps(record, ensure_ascii=False, default=str)
        else:
            pairs = " ".join(f"{k}={_text(v)}" for k, v in fields.items())
            line = f"{now} {level:<7} {event:<16} {message}" + (f"  {pairs}" if pairs else "")
        # Last line of defence for a token in a --repo URL: whatever a message
        # or field repeats (a library's exception text), no log line shows it.
        print(redact_url(line), file=self.stream, flush=True)

    def info(self, event: str, message: str = "", **fields: Any) -> None:
        self.event(event, message, level="info", **fields)

    def warning(self, event: str, message: str = "", **fields: Any) -> None:
        self.event(event, message, level="warning", **fields)

    def error(self, event: str, message: str = "", **fields: Any) -> None:
        self.event(event, message, level="error", **fields)


def _text(value: Any) -> str:
    text = str(value)
    return json.dumps(text, ensure_ascii=False) if (" " in text or not text) else text
