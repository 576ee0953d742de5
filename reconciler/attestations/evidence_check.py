"""Offline check of a rollout's recorded evidence (docs/trust.md):
for ``reconciler verify --evidence NAME``.

Each node record that keeps ``evidence`` is checked against the
``agentKey`` of its node file at the rollout's ``specCommit``: every kept
answer's signature over its canonical JSON, and that the job record is about
the node's recorded job. A node decided (passed or failed) without recorded
evidence while its node file has an ``agentKey`` fails too: the daemon
records evidence for every verdict it believed from such a node, except
one an Alertmanager alert failed: that verdict is the daemon's own, and the
record keeps the alert (``failedByAlert``) instead. A node's
restore (a rollback) is checked the same way: its kept job record must be
signed by the key and be about the restore job, and a restore decided by an
answer without kept evidence fails when the node has an ``agentKey``.

Reads Git through ``Branch``; decides nothing about rollouts.
"""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.engine.evidence import NO_RESTORE_EVIDENCE
from reconciler.git.branch import Branch
from reconciler.protocol.evidence import parse_agent_key, signature_problem
from reconciler.protocol.signing import TrustedKey
from reconciler.spec.compare import FiringAlert
from reconciler.spec.documents import parse_file
from reconciler.spec.paths import node_path
from reconciler.spec.rollout_status import NodeEvidence, NodeRecord, RolloutStatus

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
    apply = _check_apply(record, key)
    restore = _check_restore(record, key)
    if restore is None:
        return apply
    if not apply.ok:
        return apply
    if not restore.ok:
        return restore
    return NodeVerdict(record.name, True, f"{apply.message}; {restore.message}")


def _check_apply(record: NodeRecord, key: TrustedKey | str | None) -> NodeVerdict:
    verdict = _check_answers(record, key)
    alert = record.failed_by_alert
    if alert is None or not verdict.ok or record.verdict != "failed":
        return verdict
    said = f"failed by alert {alert_said(alert)}: the daemon's verdict on Alertmanager's answer"
    if record.evidence is None:
        return NodeVerdict(record.name, True, f"{said}, before any agent answer")
    return NodeVerdict(record.name, True, f"{said}; {verdict.message}")


def alert_said(alert: FiringAlert) -> str:
    """An alert in words: its name, labels and since when it fires."""
    labels = ", ".join(f"{k}={v}" for k, v in alert.labels if k != "alertname")
    return f"{alert.alertname} (labels {labels}; firing since {alert.starts_at})"


def _check_answers(record: NodeRecord, key: TrustedKey | str | None) -> NodeVerdict:
    name, evidence = record.name, record.evidence
    if evidence is None:
        if record.verdict == "failed" and record.failed_by_alert is not None:
            return NodeVerdict(name, True, "no agent answer")
        if record.verdict not in DECIDED:
            return NodeVerdict(name, True, "no verdict on evidence (nothing to check)")
        if key is None:
            return NodeVerdict(name, True, "unsigned evidence: the node has no agentKey")
        return NodeVerdict(
            name,
            False,
            f"verdict {record.verdict} without recorded evidence, but the node has an agentKey",
        )
    if not isinstance(key, TrustedKey):
        return _unusable_key(name, key, "evidence")
    problem = _job_record_problem(evidence, record.job_id, key)
    if problem:
        return NodeVerdict(name, False, f"job record: {problem}")
    refusal = _is_refusal(evidence)
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


def _check_restore(record: NodeRecord, key: TrustedKey | str | None) -> NodeVerdict | None:
    """The node's restore (rollback) against the same key: None when it has
    none yet decided by an answer, so there is nothing to say."""
    name, restore = record.name, record.restore
    if restore is None or restore.finished_at is None:
        return None
    evidence = restore.evidence
    if evidence is None:
        if restore.error == NO_RESTORE_EVIDENCE or key is None:
            return None  # decided by its deadline, or unsigned evidence as said above
        return NodeVerdict(
            name,
            False,
            f"restore {record.state} without recorded evidence, but the node has an agentKey",
        )
    if not isinstance(key, TrustedKey):
        return _unusable_key(name, key, "restore evidence")
    problem = _job_record_problem(evidence, restore.job_id, key)
    if problem:
        return NodeVerdict(name, False, f"restore job record: {problem}")
    what = "restore refusal" if _is_refusal(evidence) else "restore job record"
    outcome = "rollback_failed" if restore.error else "rolled_back"
    return NodeVerdict(name, True, f"{what} signed by {key.key_id} ({outcome})")


def _unusable_key(name: str, key: str | None, what: str) -> NodeVerdict:
    """Evidence is recorded but cannot be checked: the node file's agentKey
    is unreadable (``key`` says why) or absent."""
    if key is None:
        key = f"{what} recorded, but the node file has no agentKey"
    return NodeVerdict(name, False, key)


def _is_refusal(evidence: NodeEvidence) -> bool:
    """A signed refusal of the POST (an error answer) names no job."""
    return "jobId" not in evidence.job_record and "error" in evidence.job_record


def _job_record_problem(evidence: NodeEvidence, job_id: str | None, key: TrustedKey) -> str:
    problem = signature_problem(evidence.job_record, evidence.key_id, evidence.job_signature, key)
    if problem:
        return problem
    if not _is_refusal(evidence) and evidence.job_record.get("jobId") != job_id:
        return f"it is about job {evidence.job_record.get('jobId')!r}, not the recorded {job_id}"
    return ""
