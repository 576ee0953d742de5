"""Held answers (docs/protocol.md, held reads): ``GET .../jobs/{id}?wait=20s``
is answered once the job is finished (``succeeded`` or ``failed``) or when
the wait ends, whichever comes first; ``GET .../heartbeat?newerThan=T&wait=20s``
once the heartbeat changed after T or when the wait ends. Optional for agents: one that ignores
``wait`` answers at once, and the daemon then polls it as before.

Both sides read the parameter here, so they agree on its spelling and bounds.
"""

from __future__ import annotations

import resource
from dataclasses import replace
from urllib.parse import parse_qs, urlencode

from reconciler.protocol.observations import Heartbeat
from reconciler.spec.times import parse_time

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


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit and
    return the soft limit now in force: each held answer keeps a connection
    (a file descriptor) open on both sides, a batch of 1,000 jobs as many,
    and the usual soft limit of 1,024 would not leave room for the rest."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    if soft == unlimited:
        return 1 << 20
    wanted = 1 << 20 if hard == unlimited else hard
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass  # kept as it is: the caller holds fewer answers
    return soft


# -- heartbeats ------------------------------------------------------------------
#
# ``GET .../heartbeat?newerThan=T&wait=20s`` is answered once the agent's
# heartbeat has changed after T (agent clock; a change is one the agent made
# itself: a job finished, a check's outcome moved), or when the wait ends,
# with the heartbeat as it is then. Without ``wait`` (or from an agent that
# ignores both) it is an ordinary read.


def newer_than(query: str) -> str | None:
    """The ``newerThan`` of a query string (RFC 3339 text), None without one;
    ValueError, with what is wrong, for a value that is not a time."""
    values = parse_qs(query, keep_blank_values=True).get("newerThan")
    if not values:
        return None
    text = values[-1].strip()
    try:
        parse_time(text)
    except ValueError:
        raise ValueError(
            f"newerThan must be an RFC 3339 time like 2026-12-01T09:00:00Z, got {text!r}"
        ) from None
    return text


def heartbeat_query(newer: str, seconds: float) -> str:
    return urlencode({"newerThan": newer, "wait": f"{seconds:g}s"})


def heartbeat_content(beat: Heartbeat) -> tuple[object, ...]:
    """What a held heartbeat read waits to see change: everything but the
    times that move by themselves (``time``, each check's ``probedAt``)."""
    return (
        beat.runtimes,
        tuple(replace(c, probed_at=None) for c in beat.checks),
    )
