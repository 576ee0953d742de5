"""Offline check of a rollout's recorded evidence (DESIGN.md section 12):
for ``reconciler verify --evidence NAME``.

Each node record that keeps ``evidence`` is checked against the
``agentKey`` of its node file at the rollout's ``specCommit``: every kept
answer's signature over its canonical JSON, and that the job record is about
the node's recorded job. A node decided (passed or failed) without recorded
evidence while its node file has an ``agentKey`` fails too: the daemon
records evidence for every verdict it believed from such a node.

Reads Git through ``Branch``; decides nothing about rollouts.
"""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.git.branch import Branch
from reconciler.protocol.evidence import parse_agent_key, signature_problem
from reconciler.protocol.signing import TrustedKey
from reconciler.spec.documents import parse_file
from reconciler.spec.paths import node_path
from reconciler.spec.rollout_status import NodeRecord, RolloutStatus

DECIDED = frozenset({"passed", "failed"})


@dataclass(frozen=True)
class NodeVerdict:
    node: str
    ok: bool
    message: str


def check_evidence(source: Branch, status: RolloutStatus) -> list[NodeVerdict]:
    """One line per node of ``status``, in frozen order."""
    keys: dict[str, TrustedKey | str | None] = {}

    def key(node: str) -> TrustedKey | str | None:
        """The node's agentKey at specCommit, None without one, or why it is unusable."""
        if node not in keys:
            keys[node] = _agent_key(source, status.spec_commit, node)
        return keys[node]

    return [_check_node(record, key(record.name)) for record in status.nodes]


def _agent_key(source: Branch, commit: str, node: str) -> TrustedKey | str | None:
    path = node_path(node)
    data = source.read(commit, path) if commit else None
    if data is None:
        return f"no {path} at specCommit {commit[:12] or '(none)'}"
    parsed = parse_file(path, data)
    if parsed.node is None:
        return f"{path} at specCommit {commit[:12]} is not a valid node file"
    if parsed.node.agent_key is None:
        return None
    try:
        return parse_agent_key(parsed.node.agent_key, path)
    except ValueError as exc:
        return f"{path} at {commit[:12]}: spec.agentKey {exc}"


def _check_node(record: NodeRecord, key: TrustedKey | str | None) -> NodeVerdict:
    name, evidence = record.name, record.evidence
    if evidence is None:
        if record.verdict not in DECIDED:
            return NodeVerdict(name, True, "no verdict on evidence (nothing to check)")
        if key is None:
            return NodeVerdict(name, True, "unsigned evidence: the node has no agentKey")
        return NodeVerdict(
            name,
            False,
            f"verdict {record.verdict} without recorded evidence, but the node has an agentKey",
        )
    if isinstance(key, str):
        return NodeVerdict(name, False, key)
    if key is None:
        return NodeVerdict(name, False, "evidence recorded, but the node file has no agentKey")
    problem = signature_problem(evidence.job_record, evidence.key_id, evidence.job_signature, key)
    if problem:
        return NodeVerdict(name, False, f"job record: {problem}")
    refusal = "jobId" not in evidence.job_record and "error" in evidence.job_record
    if not refusal and evidence.job_record.get("jobId") != record.job_id:
        return NodeVerdict(
            name,
            False,
            f"job record is about job {evidence.job_record.get('jobId')!r}, "
            f"not the recorded {record.job_id}",
        )
    if evidence.heartbeat is not None:
        problem = signature_problem(
            evidence.heartbeat, evidence.key_id, evidence.heartbeat_signature or "", key
        )
        if problem:
            return NodeVerdict(name, False, f"heartbeat: {problem}")
        if evidence.heartbeat.get("node") != name:
            return NodeVerdict(name, False, "heartbeat names another node")
    what = "refusal" if refusal else "job record"
    what += " and heartbeat" if evidence.heartbeat is not None else ""
    return NodeVerdict(name, True, f"{what} signed by {key.key_id} ({record.verdict})")
