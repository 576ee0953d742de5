"""Numbers as the web page shows them to people (docs/web.md): three
significant digits, fractions as percentages, durations in words, times
of day. Never the raw float of a status file.

Pure: values in, text out.
"""

from __future__ import annotations

import math
from datetime import datetime

SIGNIFICANT = 3


def rounded(value: float | None) -> str:
    """``0.000123`` -> ``0.000123``, ``2.34567`` -> ``2.35``, ``12345.6``
    -> ``12,300``; None -> ``—``."""
    if value is None or not math.isfinite(value):
        return "—" if value is None else str(value)
    if value == 0:
        return "0"
    places = SIGNIFICANT - 1 - math.floor(math.log10(abs(value)))
    shown = round(value, places)
    if places <= 0:
        return f"{shown:,.0f}"
    return f"{shown:.{places}f}".rstrip("0").rstrip(".")


def percent(fraction: float | None) -> str:
    """A fraction as a percentage: ``0.0312`` -> ``3.12%``."""
    return "—" if fraction is None else f"{rounded(fraction * 100)}%"


def signed_percent(fraction: float | None) -> str:
    """A change: ``+12.3%``, ``−4.5%``."""
    if fraction is None:
        return "—"
    return ("+" if fraction >= 0 else "−") + percent(abs(fraction))


def seconds(value: float | None) -> str:
    """A duration: ``850 ms``, ``4.2 s``, ``3 min 20 s``."""
    if value is None:
        return "—"
    if value < 1:
        return f"{rounded(value * 1000)} ms"
    if value < 60:
        return f"{rounded(value)} s"
    minutes, rest = divmod(round(value), 60)
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"


def time_of_day(moment: datetime | None) -> str:
    """``14:03:07`` (UTC, as every status time)."""
    return "—" if moment is None else moment.strftime("%H:%M:%S")


__all__ = ["percent", "rounded", "seconds", "signed_percent", "time_of_day"]
