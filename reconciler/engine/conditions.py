"""The conditions a step records and the words it ends a rollout with
(docs/rollouts.md): pure functions from what the step sees to a
condition's message, None when the condition does not hold. The step sets
or clears each condition by its type."""

from __future__ import annotations

from collections.abc import Sequence

from reconciler.protocol.observations import Observations
from reconciler.spec.health import HealthCheck
from reconciler.spec.rollout_status import NodeRecord


def frozen_words(changed: Sequence[str]) -> str | None:
    """The ``frozen_fields_changed`` condition, naming the frozen fields edited after start."""
    if not changed:
        return None
    return (
        f"changed after start and not applied: {', '.join(changed)}; the rollout "
        "carries on with the values frozen at start (start a new rollout to use them)"
    )


def end_words(
    nodes: Sequence[NodeRecord], succeeded: int, counts: Sequence[tuple[str, int]]
) -> tuple[str, str, str]:
    """(phase, reason, message) of a rollout whose last batch is done."""
    if succeeded == len(nodes):
        return "completed", "", f"all {len(nodes)} nodes succeeded"
    return (
        "failed",
        "not_all_succeeded",
        f"{succeeded} of {len(nodes)} nodes succeeded; "
        + ", ".join(f"{c} {s}" for s, c in counts if s != "succeeded"),
    )


def unverified_words(asked: Sequence[str], obs: Observations) -> str | None:
    """The ``unverified_evidence`` condition: the nodes among ``asked`` (in
    flight when the pass began) whose answers this pass did not believe (no
    or bad evidence for their agentKey). It stays while nothing is in
    flight (a hold), and goes once their answers are believed again."""
    unverified = obs.unverified
    named = [f"{name} ({unverified[name]})" for name in asked if name in unverified]
    if not named:
        return None
    return (
        "answers not signed by the node's agentKey are no evidence: "
        + "; ".join(named[:20])
        + (f"; and {len(named) - 20} more" if len(named) > 20 else "")
        + "; check the agent's --key against spec.agentKey in its node file"
    )


def prometheus_words(
    checks: Sequence[HealthCheck], configured: bool, nodes: Sequence[NodeRecord], obs: Observations
) -> tuple[tuple[str, str | None], ...]:
    """The conditions of a live rollout's prometheus checks that nothing
    can answer (docs/health.md): no server in settings, or a query the
    server refuses; (type, message or None) each."""
    return (
        ("prometheus_not_configured", unconfigured_words(checks, configured)),
        ("prometheus_query_rejected", rejected_words(checks, nodes, obs)),
    )


def unconfigured_words(checks: Sequence[HealthCheck], configured: bool) -> str | None:
    """The ``prometheus_not_configured`` condition of a started rollout."""
    if configured:
        return None
    return (
        f"prometheus checks {', '.join(c.name for c in checks)} need "
        "settings.spec.prometheus.url in reconciler.yaml; until it is set they have no "
        "evidence and their nodes become unknown at their deadlines"
    )


def rejected_words(
    checks: Sequence[HealthCheck], nodes: Sequence[NodeRecord], obs: Observations
) -> str | None:
    """The ``prometheus_query_rejected`` condition: queries the server refuses."""
    metrics = obs.metric_checks
    rejected = sorted(
        {
            (c.name, m.detail)
            for node in nodes
            if node.state == "dispatched"
            for c in checks
            if (m := metrics.get((node.name, c.name))) is not None and m.rejected
        }
    )
    if not rejected:
        return None
    return (
        "; ".join(
            f"Prometheus rejects the query of check {name}: {detail}" for name, detail in rejected
        )
        + "; fix the query in a new rollout (health is frozen at start)"
    )
