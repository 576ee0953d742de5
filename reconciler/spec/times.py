"""RFC 3339 UTC timestamps: the one text form of time in status files,
job payloads and agent answers. Pure: the clock is read by callers."""

from __future__ import annotations

from datetime import UTC, datetime


def format_time(moment: datetime) -> str:
    """``2026-12-01T09:00:00Z``; sub-second parts are kept only when present."""
    moment = moment.astimezone(UTC)
    if moment.microsecond:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    """Parse RFC 3339 text into an aware UTC datetime; ValueError if it is not one."""
    if not isinstance(text, str) or "T" not in text.upper():
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    value = text.strip()
    if value[-1] in "zZ":
        value = value[:-1] + "+00:00"
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        raise ValueError(f"RFC 3339 time needs a UTC offset or Z: {text!r}")
    return moment.astimezone(UTC)
