"""When a batch may start (docs/rollouts.md): inside some deploy window
(when settings declare any) and outside every freeze. Pure: ``now`` is
passed in, and the windows carry zones already resolved by ``documents``,
so nothing here reads the zone database or the clock.

A window is a span of local wall-clock time on its days. Its bounds are
turned into UTC instants for each local date, so a window across a
daylight-saving change is as long as the clocks say (01:00-04:00 in
Europe/Berlin lasts two hours on the spring change and four on the autumn
one), and a local time that does not exist on the day is read as the zone
database reads it (the instant after the gap).

Rule table: what stops a batch from starting, in the order checked.

| condition at ``now``           | waiting reason   | until                         |
|--------------------------------|------------------|-------------------------------|
| inside a freeze                | ``freeze``       | the first instant both rules allow |
| windows set, inside none       | ``outside_window`` | the same                    |
| otherwise                      | (none: may start) |                              |
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime, time, timedelta

from reconciler.spec.model import Freeze, Window
from reconciler.spec.rollout_status import Waiting

__all__ = ["GATE_RULES", "batch_gate", "next_opening", "window_spans"]

# (reason, applies) in the order checked: the first that applies names the wait.
GATE_RULES: tuple[tuple[str, str], ...] = (
    ("freeze", "now is inside a freeze (from <= now < to)"),
    ("outside_window", "windows are set and now is inside none of them"),
)

# How far ahead to look for an opening: a week of windows, and enough
# rounds to step over freezes that follow one another.
_DAYS_AHEAD = 8
_MAX_ROUNDS = 1000


def window_spans(window: Window, around: datetime) -> Iterator[tuple[datetime, datetime]]:
    """UTC spans of ``window`` on the local dates from the day before
    ``around`` to a week after it, in order."""
    local_day = around.astimezone(window.zone).date()
    for offset in range(-1, _DAYS_AHEAD):
        day = local_day + timedelta(days=offset)
        if day.weekday() not in window.days:
            continue
        yield _instant(day, window.start, window), _instant(day, window.end, window)


def _instant(day: date, minutes: int, window: Window) -> datetime:
    if minutes >= 24 * 60:
        day, minutes = day + timedelta(days=1), minutes - 24 * 60
    local = datetime.combine(day, time(minutes // 60, minutes % 60), tzinfo=window.zone)
    # A wall time inside a spring-forward gap does not exist; converting it
    # through UTC and back names the instant after the gap.
    return local.astimezone(UTC)


def _freeze_at(freezes: Sequence[Freeze], moment: datetime) -> Freeze | None:
    return next((f for f in freezes if f.start <= moment < f.end), None)


def _window_at(windows: Sequence[Window], moment: datetime) -> bool:
    return any(start <= moment < end for w in windows for start, end in window_spans(w, moment))


def _next_window_start(windows: Sequence[Window], moment: datetime) -> datetime | None:
    starts = [
        start
        for w in windows
        for start, end in window_spans(w, moment)
        if start > moment and end > start
    ]
    return min(starts, default=None)


def next_opening(
    windows: Sequence[Window], freezes: Sequence[Freeze], now: datetime
) -> datetime | None:
    """The first instant at or after ``now`` inside some window (when any
    are set) and inside no freeze; None when none comes within a week of
    windows (no window has a day, say)."""
    moment = now
    for _ in range(_MAX_ROUNDS):
        freeze = _freeze_at(freezes, moment)
        if freeze is not None:
            moment = freeze.end
            continue
        if windows and not _window_at(windows, moment):
            following = _next_window_start(windows, moment)
            if following is None:
                return None
            moment = following
            continue
        return moment
    return None


def batch_gate(
    windows: Sequence[Window], freezes: Sequence[Freeze], now: datetime
) -> Waiting | None:
    """None when a batch may start at ``now``; else why not and until when
    (the table above). ``until`` is None when no opening is in sight."""
    if _freeze_at(freezes, now) is not None:
        reason = "freeze"
    elif windows and not _window_at(windows, now):
        reason = "outside_window"
    else:
        return None
    return Waiting(reason=reason, until=next_opening(windows, freezes, now))
