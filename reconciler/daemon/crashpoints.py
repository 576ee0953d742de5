"""Named points where a test can kill the daemon with SIGKILL, to prove the
invariants of docs/architecture.md hold through a crash.

The only switch is the environment variable ``RECONCILER_CRASH_AT``, read
once when ``reconciler run`` starts (``CrashPoints.from_environ``): ``NAME``
kills the process the first time it reaches point NAME, ``NAME:N`` the N-th
time. Unset (production), ``reach`` is one comparison. The count of points
reached is soft state of the daemon that reaches them (forgotten on
restart, as the process it counts for is gone).

Points:
  after_step    the engine decided; nothing committed yet
  after_commit  the status commit exists locally; not yet pushed (remote) or
                the ref moved (local)
  after_push    the status is on the branch; no job sent yet
  mid_send      some of the pass's jobs were sent, not all
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

POINTS = ("after_step", "after_commit", "after_push", "mid_send")


def _parse(value: str) -> tuple[str, int] | None:
    if not value:
        return None
    name, _, count = value.partition(":")
    if name not in POINTS:
        raise ValueError(
            f"RECONCILER_CRASH_AT names an unknown point {name!r}; known: {', '.join(POINTS)}"
        )
    return name, int(count or "1")


class CrashPoints:
    """The point a test asked the daemon to die at, and how often it was reached."""

    def __init__(self, target: tuple[str, int] | None = None) -> None:
        self.target = target
        self._reached = 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> CrashPoints:
        return cls(_parse(environ.get("RECONCILER_CRASH_AT", "")))

    def reach(self, point: str) -> None:
        """Called by the daemon at each named point; kills the process if asked to."""
        target = self.target
        if target is None or target[0] != point:
            return
        self._reached += 1
        if self._reached == target[1]:
            os.kill(os.getpid(), signal.SIGKILL)
