"""RFC 3339 UTC timestamps: the one text form of time in status files,
job payloads and agent answers. Pure: the clock is read by callers."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache


def format_time(moment: datetime) -> str:
    """``2026-12-01T09:00:00Z``; sub-second parts are kept only when present."""
    if moment.tzinfo is None:
        # Local time: equal naive times can differ in ``fold``, so not cached.
        return _format_utc(moment.astimezone(UTC))
    return _format_aware(moment)


@lru_cache(maxsize=4096)
def _format_aware(moment: datetime) -> str:
    # A status write formats the same few times (a batch's dispatch, its
    # deadline) for thousands of node records. Equal aware times are the
    # same instant, whatever their zone, so they share one text.
    return _format_utc(moment.astimezone(UTC))


def _format_utc(moment: datetime) -> str:
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
