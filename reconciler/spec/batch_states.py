"""A batch's state as people and status files see it (docs/rollouts.md).

The engine keeps a batch ``pending``, ``running`` or ``done``: where it is
in its life. What a batch *is* also depends on its nodes: a batch with a
failed or timed-out node is ``failed``, whether the engine still runs it
(the rollout holds) or has settled it; a running batch the rollout holds
on, or with a node whose verdict is unknown, is ``held`` (an unknown node
is no verdict: never called failed while its batch runs, never green or
blue either). Status files, ``status``, the dashboard and the web
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
    {"failed", "timed_out", "stopped", "rollback_failed", "rollback_pending"}
)
# A node with no verdict at all: its running batch is "held" (the rollout
# holds on it, never green or blue), and never called failed while it runs.
UNKNOWN_NODE_STATES = frozenset({"unknown"})

# (engine state, what its worst node is, the rollout held on it) -> shown state;
# a node is "failing", "unknown" or "fine".
SHOWN = {
    (life, worst, held): shown
    for life, worst, held, shown in (
        ("pending", "fine", False, "pending"),
        ("pending", "fine", True, "pending"),
        ("pending", "unknown", False, "pending"),
        ("pending", "unknown", True, "pending"),
        ("pending", "failing", False, "pending"),
        ("pending", "failing", True, "pending"),
        ("running", "fine", False, "running"),
        ("running", "fine", True, "held"),
        ("running", "unknown", False, "held"),
        ("running", "unknown", True, "held"),
        ("running", "failing", False, "failed"),
        ("running", "failing", True, "failed"),
        ("done", "fine", False, "done"),
        ("done", "fine", True, "done"),
        ("done", "unknown", False, "failed"),
        ("done", "unknown", True, "failed"),
        ("done", "failing", False, "failed"),
        ("done", "failing", True, "failed"),
    )
}


def shown_state(life: str, node_states: Iterable[str], held: bool) -> str:
    """The state of a batch in ``life`` whose nodes are in ``node_states``;
    ``held``: the rollout holds with this batch open (a held node in it, or
    the rollout paused while it runs)."""
    states = set(node_states)
    if states & FAILING_NODE_STATES:
        worst = "failing"
    elif states & UNKNOWN_NODE_STATES:
        worst = "unknown"
    else:
        worst = "fine"
    return SHOWN[(life, worst, held)]


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
