"""One log line, the same shape on both sides of a job: ``time level event
message`` and the fields for people, or those keys as one JSON object a line
for machines, so one log search covers the daemon and its agents.

Must not: write anything (each side owns its stream and its lock), or drop
a field a caller passed, other than an empty one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from reconciler.spec.times import format_time

FORMATS = ("text", "json")


def now_text() -> str:
    """The time a line says, to the second."""
    return format_time(datetime.now(UTC).replace(microsecond=0))


def log_line(
    fmt: str, now: str, level: str, event: str, message: str, fields: Mapping[str, Any]
) -> str:
    """One line without its newline; empty fields (None, "") are left out."""
    fields = {k: v for k, v in fields.items() if v is not None and v != ""}
    if fmt == "json":
        record = {"time": now, "level": level, "event": event, "message": message, **fields}
        return json.dumps(record, ensure_ascii=False, default=str)
    pairs = " ".join(f"{k}={_text(v)}" for k, v in fields.items())
    return f"{now} {level:<7} {event:<16} {message}" + (f"  {pairs}" if pairs else "")


def _text(value: Any) -> str:
    text = str(value)
    return json.dumps(text, ensure_ascii=False) if (" " in text or not text) else text
