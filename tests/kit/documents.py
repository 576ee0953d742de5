"""Documents for tests: node and rollout files as a person writes them,
status files as the daemon writes them, and readers of committed statuses.

    node_yaml("gpu-a1", agent_url, {"role": "gpu"})
    rollout_yaml("r", selector={"role": "gpu"}, batchSize=2, live=True)
    status_text(make_status("r", "running", [("gpu-a1", 1, "succeeded")]))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from reconciler.spec.model import Target
from reconciler.spec.rollout_status import (
    BatchRecord,
    FrozenSpec,
    Hold,
    NodeRecord,
    RolloutStatus,
    TransitionRecord,
    count_progress,
    status_files,
)
from reconciler.spec.safe_yaml import dump_yaml

TARGET = "{runtime: hermes, provider: ollama, model: llama3.1-8b, profile: default}"
DEFAULT_AGENT = "http://127.0.0.1:8710"


def node_yaml(
    name: str,
    agent: str = DEFAULT_AGENT,
    labels: Mapping[str, str] | str = "{role: canary}",
    maintenance: bool | None = False,
    agent_key: str | None = None,
    cert_pin: str | None = None,
) -> str:
    """A node document. ``labels`` as a mapping or as YAML flow text;
    ``maintenance`` None leaves the field out."""
    if isinstance(labels, str):
        label_text = labels
    else:
        label_text = "{" + ", ".join(f"{k}: {v}" for k, v in labels.items()) + "}"
    text = (
        "apiVersion: reconciler/v1\nkind: Node\n"
        f"metadata: {{name: {name}}}\n"
        f"spec:\n  agent: {agent}\n  labels: {label_text}\n"
    )
    if maintenance is not None:
        text += f"  maintenance: {'true' if maintenance else 'false'}\n"
    return (
        text
        + (f'  agentKey: "{agent_key}"\n' if agent_key else "")
        + (f'  agentCertSha256: "{cert_pin}"\n' if cert_pin else "")
    )


def flow(value: Any) -> str:
    """``value`` as YAML flow text: mappings, lists, booleans, numbers, text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    return str(value)


def rollout_yaml(name: str, **spec: Any) -> str:
    """A rollout document; keyword arguments are spec fields, written as
    YAML flow text (``target`` defaults to ``TARGET``)."""
    lines = [
        "apiVersion: reconciler/v1",
        "kind: Rollout",
        f"metadata: {{name: {name}}}",
        "spec:",
        f"  target: {spec.pop('target', TARGET)}",
    ]
    lines += [f"  {key}: {flow(value)}" for key, value in spec.items()]
    return "\n".join(lines) + "\n"


T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def make_status(
    name: str,
    phase: str,
    nodes: Sequence[tuple[str, int, str]] = (),
    *,
    live: bool = True,
    hold: str | None = None,
    hold_nodes: Sequence[str] = (),
    operator_paused: bool = False,
    batch_size: int = 1,
    transitions: Sequence[tuple[str, str, str]] = (),
    **fields: Any,
) -> RolloutStatus:
    """A status as the engine records it: ``nodes`` are (name, batch, state)."""
    records = tuple(
        NodeRecord(
            name=node,
            batch=batch,
            state=state,
            attempt=0 if state == "pending" else 1,
            job_id=None if state == "pending" else f"{name}-{node}-1",
            verdict={"succeeded": "passed", "failed": "failed"}.get(state),
            error="agent: exit 1" if state == "failed" else "",
        )
        for node, batch, state in nodes
    )
    states_by_batch: dict[int, set[str]] = {}
    for record in records:
        states_by_batch.setdefault(record.batch, set()).add(record.state)

    def batch_state(states: set[str]) -> str:
        if states == {"succeeded"}:
            return "done"
        return "pending" if states == {"pending"} else "running"

    batches = tuple(
        BatchRecord(index, batch_state(states)) for index, states in sorted(states_by_batch.items())
    )
    started = phase not in ("pending", "scheduled")
    return RolloutStatus(
        name=name,
        phase=phase,
        hold=Hold(
            hold,
            f"{', '.join(hold_nodes) or 'a node'}: {hold}",
            T0,
            tuple(hold_nodes),
            len(hold_nodes),
        )
        if hold
        else None,
        operator_paused=operator_paused,
        spec_commit="0" * 40,
        start_commit="0" * 40 if started else None,
        first_seen_commit="0" * 40,
        frozen=FrozenSpec(
            target=Target("hermes", "ollama", "llama3.1-8b"),
            batch_size=batch_size,
            live=live,
            on_failure="pause",
            selector=(("role", "canary"),),
        )
        if started
        else None,
        started_at=T0 if started else None,
        progress=count_progress(records),
        batches=batches,
        nodes=records,
        transitions=tuple(
            TransitionRecord(T0, before, after, reason, "0" * 40)
            for before, after, reason in transitions
        ),
        **fields,
    )


def status_text(status: RolloutStatus) -> dict[str, str]:
    """The status files of ``status`` as the daemon writes them."""
    return {path: dump_yaml(record).decode() for path, record in status_files(status).items()}


def node_map(status: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A status's node records by name."""
    return {n["name"]: n for n in status.get("nodes", [])}


def node_states(status: Mapping[str, Any]) -> dict[str, str]:
    """``{node: state}`` of a status."""
    return {n["name"]: n["state"] for n in status.get("nodes", [])}


def rollback_outcomes(record: Mapping[str, Any]) -> dict[str, str]:
    """``{node: outcome}`` of one rollback record of a status."""
    return {n["name"]: n["outcome"] for n in record.get("nodes", [])}
