"""Held answers (README "Event-driven observation"): ``GET .../jobs/{id}?wait=20s``
is answered once the job is finished (``succeeded`` or ``failed``) or when
the wait ends, whichever comes first. Optional for agents: one that ignores
``wait`` answers at once, and the daemon then polls it as before.

Both sides read the parameter here, so they agree on its spelling and bounds.
"""

from __future__ import annotations

from urllib.parse import parse_qs

FINISHED_JOB_STATES = frozenset({"succeeded", "failed"})
MAX_WAIT_SECONDS = 60.0  # an agent holds an answer no longer than this
DAEMON_WAIT_SECONDS = 20  # what the daemon asks for: well under its 5 s timeout plus the wait


def wait_seconds(query: str) -> float | None:
    """The ``wait`` of a query string in seconds (``20s``, ``20`` or ``1.5s``),
    capped at MAX_WAIT_SECONDS; None without one. ValueError, with what is
    wrong, for a value that is not a duration."""
    values = parse_qs(query, keep_blank_values=True).get("wait")
    if not values:
        return None
    text = values[-1].strip()
    number = text[:-1] if text.endswith("s") else text
    try:
        seconds = float(number)
    except ValueError:
        raise ValueError(f"wait must be a duration in seconds like 20s, got {text!r}") from None
    if not seconds >= 0:  # also refuses NaN
        raise ValueError(f"wait must not be negative, got {text!r}")
    return min(seconds, MAX_WAIT_SECONDS)


def wait_query(seconds: float) -> str:
    return f"wait={seconds:g}s"
