"""One line per event, for people (text) or for machines (JSON).

Every event names what it is about (rollout, node, commit) as fields, so a
log search for one rollout finds its whole story.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
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
        self._second: datetime | None = None
        self._second_text = ""

    def event(self, event: str, message: str = "", *, level: str = "info", **fields: Any) -> None:
        if LEVELS.index(level) < self.min_level:
            return
        self._write(self._line(self._now(), level, event, message, fields))

    def info_many(self, events: Iterable[tuple[str, str, Mapping[str, Any]]]) -> None:
        """``info(event, message, **fields)`` for each of ``events``, the same
        lines written at once (thousands per pass: a job sent or a node's
        verdict each), with the time they are written."""
        if LEVELS.index("info") < self.min_level:
            return
        now = self._now()
        lines = [self._line(now, "info", e, message, fields) for e, message, fields in events]
        if lines:
            self._write("\n".join(lines))

    def _now(self) -> str:
        # Formatted once a second: a pass logs thousands of lines in one.
        moment = datetime.now(UTC).replace(microsecond=0)
        if moment != self._second:
            self._second, self._second_text = moment, format_time(moment)
        return self._second_text

    def _line(
        self, now: str, level: str, event: str, message: str, fields: Mapping[str, Any]
    ) -> str:
        fields = {k: v for k, v in fields.items() if v is not None and v != ""}
        if self.fmt == "json":
            record = {"time": now, "level": level, "event": event, "message": message, **fields}
            line = json.dumps(record, ensure_ascii=False, default=str)
        else:
            pairs = " ".join(f"{k}={_text(v)}" for k, v in fields.items())
            line = f"{now} {level:<7} {event:<16} {message}" + (f"  {pairs}" if pairs else "")
        # Last line of defence for a token in a --repo URL: whatever a message
        # or field repeats (a library's exception text), no log line shows it.
        return redact_url(line)

    def _write(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def info(self, event: str, message: str = "", **fields: Any) -> None:
        self.event(event, message, level="info", **fields)

    def warning(self, event: str, message: str = "", **fields: Any) -> None:
        self.event(event, message, level="warning", **fields)

    def error(self, event: str, message: str = "", **fields: Any) -> None:
        self.event(event, message, level="error", **fields)


def _text(value: Any) -> str:
    text = str(value)
    return json.dumps(text, ensure_ascii=False) if (" " in text or not text) else text
