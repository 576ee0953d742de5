"""Durations as people write them in rollout files: ``90s``, ``5m``, ``1h``,
``1h30m``. Pure."""

from __future__ import annotations

import re

_PART = re.compile(r"([0-9]+)([smh])")
_WHOLE = re.compile(r"^(?:[0-9]+[smh])+$")
_UNIT = {"s": 1, "m": 60, "h": 3600}


def parse_duration(text: str) -> int:
    """Seconds in ``text``; ValueError with a message a person can act on."""
    if not isinstance(text, str) or not _WHOLE.match(text):
        raise ValueError(
            f"not a duration: {text!r}; write a whole number with a unit s, m or h, "
            "such as 90s, 5m or 1h30m"
        )
    seconds = sum(int(n) * _UNIT[u] for n, u in _PART.findall(text))
    if seconds <= 0:
        raise ValueError(f"duration must be more than zero, got {text!r}")
    return seconds


def format_duration(seconds: int) -> str:
    """The shortest text that parses back to ``seconds``."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [
        f"{hours}h" if hours else "",
        f"{minutes}m" if minutes else "",
        f"{secs}s" if secs else "",
    ]
    return "".join(parts) or "0s"
