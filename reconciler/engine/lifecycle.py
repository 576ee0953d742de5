"""Which phase and node-state changes exist, as tables (docs/rollouts.md).

The engine checks every change it makes against these tables and raises on
one that is not listed (a bug, never an input problem), so the tables are the
whole truth about what can happen. The state diagrams of docs/rollouts.md
are rendered from them. Pure: no IO.
"""

from __future__ import annotations

from reconciler.engine.policy import render_policy_table
from reconciler.engine.releases import render_release_table
from reconciler.engine.staging import render_stage_table
from reconciler.spec.rollout_status import NODE_STATES, PHASES, TERMINAL_PHASES

# (from, to, when)
PHASE_TRANSITIONS: tuple[tuple[str, str, str], ...] = (
    ("pending", "scheduled", "valid, startAt ahead or no deploy window open"),
    ("pending", "running", "started"),
    ("pending", "aborted", "abort, or file removed"),
    ("scheduled", "pending", "a cause to wait appeared"),
    ("scheduled", "running", "startAt reached, a window open"),
    ("scheduled", "aborted", "abort, or file removed"),
    ("running", "paused", "hold"),
    ("paused", "running", "resume, or pause lifted"),
    ("running", "completed", "every node succeeded"),
    ("running", "failed", "ended, not every node succeeded"),
    ("paused", "completed", "resume settled the last batch"),
    ("paused", "failed", "resume settled the last batch"),
    ("running", "aborted", "abort, or file removed"),
    ("paused", "aborted", "abort, or file removed"),
)

# (from, to, when)
NODE_TRANSITIONS: tuple[tuple[str, str, str], ...] = (
    ("pending", "dispatched", "batch started, or resume"),
    # staging (rollouts with target.artifacts)
    ("pending", "staging", "batch within stage.ahead, a stage slot free"),
    ("staging", "staged", "every artifact held"),
    ("staging", "failed", "stage failed, refused or timed out"),
    ("staging", "unknown", "no evidence"),
    ("failed", "staging", "retry_once, or resume"),
    ("unknown", "staging", "resume"),
    ("staged", "dispatched", "batch started, or resume"),
    ("staged", "unknown", "removed from nodes/ before dispatch"),
    ("staged", "skipped", "skipNodes"),
    ("pending", "unknown", "removed from nodes/ before dispatch"),
    ("pending", "skipped", "skipNodes, or resume of a removed node"),
    ("dispatched", "succeeded", "passed"),
    ("dispatched", "failed", "job failed or refused, or drift"),
    ("dispatched", "timed_out", "deadline passed, agent reachable"),
    ("dispatched", "unknown", "no evidence"),
    ("failed", "dispatched", "retry_once, or resume"),
    ("timed_out", "dispatched", "retry_once, or resume"),
    ("unknown", "dispatched", "resume"),
    ("failed", "stopped", "policy stop"),
    ("timed_out", "stopped", "policy stop"),
    ("failed", "rollback_pending", "policy rollback"),
    ("timed_out", "rollback_pending", "policy rollback"),
    ("rollback_pending", "rolled_back", "restore succeeded"),
    ("rollback_pending", "rollback_failed", "restore failed or expired"),
    ("restoring", "rolled_back", "restore succeeded"),
    ("restoring", "rollback_failed", "restore failed or expired"),
    ("failed", "skipped", "skipNodes, or resume of a removed node"),
    ("timed_out", "skipped", "skipNodes, or resume of a removed node"),
    ("unknown", "skipped", "skipNodes, or resume of a removed node"),
    ("stopped", "skipped", "resume, or skipNodes"),
    ("rolled_back", "skipped", "resume, or skipNodes"),
    ("rollback_failed", "skipped", "resume, or skipNodes"),
    # rollbackRequest: any node this rollout changed, with no job in flight
    ("succeeded", "restoring", "rollbackRequest"),
    ("failed", "restoring", "rollbackRequest"),
    ("timed_out", "restoring", "rollbackRequest"),
    ("unknown", "restoring", "rollbackRequest"),
    ("stopped", "restoring", "rollbackRequest"),
    ("skipped", "restoring", "rollbackRequest"),
    ("rolled_back", "restoring", "rollbackRequest"),
    ("rollback_failed", "restoring", "rollbackRequest"),
)

_PHASE_EDGES = frozenset((a, b) for a, b, _ in PHASE_TRANSITIONS)
_NODE_EDGES = frozenset((a, b) for a, b, _ in NODE_TRANSITIONS)

assert all(a in PHASES and b in PHASES for a, b in _PHASE_EDGES)
assert all(a in NODE_STATES and b in NODE_STATES for a, b in _NODE_EDGES)
assert not any(a in TERMINAL_PHASES for a, _ in _PHASE_EDGES)


class IllegalTransition(RuntimeError):
    """The engine tried a change the tables do not list: a bug in the engine."""


def check_phase(rollout: str, old: str, new: str) -> None:
    if old != new and (old, new) not in _PHASE_EDGES:
        raise IllegalTransition(f"rollout {rollout}: phase {old} -> {new} is not allowed")


def check_node(rollout: str, node: str, old: str, new: str) -> None:
    if old != new and (old, new) not in _NODE_EDGES:
        raise IllegalTransition(f"rollout {rollout}, node {node}: {old} -> {new} is not allowed")


def render_state_diagram() -> str:
    """Mermaid diagrams of the rollout phases and of the node states."""
    lines = ["```mermaid", "stateDiagram-v2", "    direction LR", "    [*] --> pending"]
    lines += [f"    {a} --> {b}: {when}" for a, b, when in PHASE_TRANSITIONS]
    lines += [f"    {p} --> [*]" for p in PHASES if p in TERMINAL_PHASES]
    lines += ["```", "", "```mermaid", "stateDiagram-v2", "    [*] --> pending"]
    # Merge edges between the same two states into one labelled arrow.
    merged: dict[tuple[str, str], list[str]] = {}
    for a, b, when in NODE_TRANSITIONS:
        merged.setdefault((a, b), []).append(when)
    lines += [f"    {a} --> {b}: {'; '.join(whens)}" for (a, b), whens in merged.items()]
    lines.append("```")
    return "\n".join(lines) + "\n"


def render_engine_tables() -> str:
    """The block of docs/rollouts.md between ``<!-- engine-tables:begin -->`` and
    ``<!-- engine-tables:end -->``: diagrams and the policy table."""
    return (
        "Rollout phases (top) and node states (bottom), generated from "
        "`reconciler/engine/lifecycle.py`:\n\n"
        + render_state_diagram()
        + "\nFailure policy, generated from `reconciler/engine/policy.py` "
        "(`unknown` never retries, stops or rolls back):\n\n"
        + render_policy_table()
        + "\nStage verdicts of a rollout with artifacts, generated from "
        "`reconciler/engine/staging.py` (nothing on the node changed, so no policy stops "
        "or restores):\n\n"
        + render_stage_table()
        + "\nReleases of a rollout with `standby`, generated from "
        "`reconciler/engine/releases.py` (never while the node's apply or a restore is in "
        "flight or decided; a release holds nothing):\n\n" + render_release_table()
    )
