"""A batch's state as people and status files see it (docs/rollouts.md).

The engine keeps a batch ``pending``, ``running`` or ``done``: where it is
in its life. What a batch *is* also depends on its nodes: a batch with a
failed, timed-out or unknown node is ``failed``, whether the engine still
runs it (the rollout holds) or has settled it; a running batch the rollout
holds on is ``held``. Status files, ``status``, the dashboard and the web
page all say the state this module picks, from the tables below.

A shown state is written with ``settled`` (whether the engine is done with
the batch) so that reading a status file gives the engine its own state back.

Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Iterable

# What the engine records about a batch's life.
LIFE_STATES = ("pending", "running", "done")
# Every state a status file or a view shows.
SHOWN_STATES = ("pending", "running", "held", "failed", "done")

# A node in one of these states makes its started batch "failed".
FAILING_NODE_STATES = frozenset(
    {"failed", "timed_out", "unknown", "stopped", "rollback_failed", "rollback_pending"}
)

# (engine state, a node failing, the rollout held on it) -> shown state.
SHOWN = {
    ("pending", False, False): "pending",
    ("pending", False, True): "pending",
    ("pending", True, False): "pending",
    ("pending", True, True): "pending",
    ("running", False, False): "running",
    ("running", False, True): "held",
    ("running", True, False): "failed",
    ("running", True, True): "failed",
    ("done", False, False): "done",
    ("done", False, True): "done",
    ("done", True, False): "failed",
    ("done", True, True): "failed",
}


def shown_state(life: str, node_states: Iterable[str], held: bool) -> str:
    """The state of a batch in ``life`` whose nodes are in ``node_states``;
    ``held``: the rollout holds with this batch open (a held node in it, or
    the rollout paused while it runs)."""
    failing = any(state in FAILING_NODE_STATES for state in node_states)
    return SHOWN[(life, failing, held)]


def life_state(shown: str, settled: bool | None) -> str:
    """The engine's state of a batch read back from a status file: a shown
    ``failed`` or ``held`` batch is ``done`` when ``settled``, else ``running``."""
    if shown in LIFE_STATES:
        return shown
    return "done" if settled else "running"


__all__ = [
    "FAILING_NODE_STATES",
    "LIFE_STATES",
    "SHOWN",
    "SHOWN_STATES",
    "life_state",
    "shown_state",
]
