"""Named points where a test can kill the daemon with SIGKILL, to prove the
invariants of docs/architecture.md hold through a crash.

The only switch is the environment variable ``RECONCILER_CRASH_AT``, read
once here: ``NAME`` kills the process the first time it reaches point NAME,
``NAME:N`` the N-th time. Unset (production), ``reach`` is a dict lookup.

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


_TARGET = _parse(os.environ.get("RECONCILER_CRASH_AT", ""))
_reached: dict[str, int] = {}


def reach(point: str) -> None:
    """Called by the daemon at each named point; kills the process if asked to."""
    if _TARGET is None or _TARGET[0] != point:
        return
    _reached[point] = _reached.get(point, 0) + 1
    if _reached[point] == _TARGET[1]:
        os.kill(os.getpid(), signal.SIGKILL)
