"""The checks of a deployment attestation (docs/attestations.md), for
``reconciler verify --attestation FILE --key PUBKEY [--repo ...]``.

In order, each step trusting only what the one before proved:

1. the DSSE envelope is signed by the given key (securesystemslib's own
   check); nothing inside an envelope that fails it is read;
2. the payload is an in-toto Statement v1 whose predicate is ours and
   valid against ``schemas/deployment-attestation.schema.json``;
3. the subject is what the predicate's nodes say was deployed, node by
   node, and each node's evidence is about that node and its job;
4. with a repository: ``specCommit``, ``startCommit`` and ``statusCommit``
   exist, the predicate is what the rollout's status holds at
   ``statusCommit``, the daemon would act on that status under the policy
   given (its own flags: signed status commits, verified history), and
   every node's evidence is signed by the
   ``agentKey`` of its node file at ``specCommit`` (the checks of
   ``reconciler verify --evidence``). Without one, the agent keys and the
   commits cannot be read, and the report says they were not checked.

Reads Git through ``Branch``; decides nothing about rollouts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from securesystemslib.dsse import Envelope
from securesystemslib.exceptions import Error as SslibError

from reconciler.attestations.attestation import (
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    Unacted,
    predicate_problem,
    sslib_key,
    statement_of,
    subjects_of,
)
from reconciler.attestations.evidence_check import check_evidence
from reconciler.git.branch import Branch
from reconciler.protocol.signing import TrustedKey
from reconciler.readers.status_reader import read_statuses
from reconciler.spec.errors import StoreError
from reconciler.spec.paths import SETTINGS_PATH, status_path
from reconciler.spec.rollout_status import RolloutStatus, node_from_record

COMMITS = ("specCommit", "startCommit", "statusCommit")


@dataclass(frozen=True)
class Finding:
    """One line of the report: ``about`` is ``envelope``, ``statement``,
    ``commits``, ``status``, ``repository`` or a node's name. ``checked``
    is false for what could not be checked (it fails nothing)."""

    about: str
    ok: bool
    message: str
    checked: bool = True

    @property
    def verdict(self) -> str:
        return "not checked" if not self.checked else "ok" if self.ok else "FAILED"


@dataclass(frozen=True)
class AttestationReport:
    rollout: str  # "" when the statement could not be read
    findings: tuple[Finding, ...]

    @property
    def failed(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if not f.ok)


def check_attestation(
    data: bytes, key: TrustedKey, source: Branch | None, unacted: Unacted | None = None
) -> AttestationReport:
    """Every check above of the envelope file's bytes ``data`` against the
    daemon's public ``key``; the repository ones when ``source`` is given,
    with ``unacted`` (the daemon's policy) whether it would act on the
    status at ``statusCommit``."""
    statement, opened = open_envelope(data, key)
    if statement is None:
        return AttestationReport("", (opened,))
    problem = statement_problem(statement)
    predicate = statement.get("predicate")
    rollout = str(predicate.get("rollout", "")) if isinstance(predicate, dict) else ""
    if problem:
        return AttestationReport(rollout, (opened, Finding("statement", False, problem)))
    assert isinstance(predicate, dict)
    findings = [opened, Finding("statement", True, f"in-toto Statement v1 of {PREDICATE_TYPE}")]
    findings += _subject_strays(statement)
    if source is None:
        findings.append(
            Finding(
                "repository",
                True,
                "no --repo: each node's evidence against its agentKey at specCommit, the commits "
                "and the committed status; pass --repo with the fleet repository to check them",
                checked=False,
            )
        )
        problems = _merge(_subject_problems(statement), _evidence_consistency(predicate))
        findings += _node_findings(predicate, problems, {}, "consistent (keys not checked)")
        return AttestationReport(rollout, tuple(findings))
    findings += _repository_findings(statement, source, unacted)
    return AttestationReport(rollout, tuple(findings))


def open_envelope(data: bytes, key: TrustedKey) -> tuple[dict[str, Any] | None, Finding]:
    """The statement inside the DSSE envelope ``data`` (JSON) if ``key``
    signed it (None when not), and the finding that says so."""
    try:
        parsed = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        return None, Finding("envelope", False, f"not a DSSE envelope: not JSON: {exc}")
    if not isinstance(parsed, dict):
        return None, Finding("envelope", False, "not a DSSE envelope (a JSON object)")
    try:
        envelope = Envelope.from_dict(parsed)
    except (KeyError, TypeError, ValueError, AttributeError, SslibError) as exc:
        return None, Finding("envelope", False, f"not a DSSE envelope: {_describe(exc)}")
    if envelope.payload_type != PAYLOAD_TYPE:
        return None, Finding(
            "envelope", False, f"payloadType is {envelope.payload_type!r}, not {PAYLOAD_TYPE}"
        )
    if key.key_id not in envelope.signatures:
        signers = ", ".join(sorted(envelope.signatures)) or "nobody"
        return None, Finding(
            "envelope",
            False,
            f"not signed by the key given ({key.key_id}, {key.source}): signed by {signers}",
        )
    try:
        envelope.verify([sslib_key(key)], 1)
    except (SslibError, ValueError):
        return None, Finding(
            "envelope",
            False,
            f"the signature by {key.key_id} does not match the payload: "
            "the attestation was changed after it was signed",
        )
    try:
        statement = json.loads(envelope.payload)
    except (UnicodeDecodeError, ValueError) as exc:
        return None, Finding("envelope", False, f"signed, but the payload is not JSON: {exc}")
    if not isinstance(statement, dict):
        return None, Finding("envelope", False, "signed, but the payload is not a JSON object")
    return statement, Finding("envelope", True, f"signed by {key.key_id}")


def statement_problem(statement: Mapping[str, Any]) -> str:
    """Why ``statement`` is not an in-toto Statement v1 of our predicate
    type valid against its schema; "" when it is."""
    if statement.get("_type") != STATEMENT_TYPE:
        return f"_type is {statement.get('_type')!r}, not {STATEMENT_TYPE}"
    if statement.get("predicateType") != PREDICATE_TYPE:
        return f"predicateType is {statement.get('predicateType')!r}, not {PREDICATE_TYPE}"
    subject = statement.get("subject")
    if not isinstance(subject, list) or not all(_is_subject(s) for s in subject):
        return "subject is not a list of {name, digest: {sha256}} entries"
    predicate = statement.get("predicate")
    problem = predicate_problem(predicate)
    if problem:
        return f"predicate does not match its schema: {problem}"
    assert isinstance(predicate, dict)
    if predicate["frozen"].get("nodes") != [n["name"] for n in predicate["nodes"]]:
        return "predicate: the node records are not the frozen node list, in its order"
    return ""


def _is_subject(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("name"), str)
        and isinstance(entry.get("digest"), dict)
        and isinstance(entry["digest"].get("sha256"), str)
    )


# -- what the statement says about itself -------------------------------------


def _node_of(subject: Mapping[str, Any]) -> str:
    return str(subject["name"]).partition("/")[0]


def _subject_strays(statement: Mapping[str, Any]) -> list[Finding]:
    """Subject entries that name no node of the predicate."""
    nodes = {n["name"] for n in statement["predicate"]["nodes"]}
    strays = sorted({s["name"] for s in statement["subject"] if _node_of(s) not in nodes})
    if not strays:
        return []
    return [
        Finding("statement", False, f"subject names no node of the rollout: {', '.join(strays)}")
    ]


def _subject_problems(statement: Mapping[str, Any]) -> dict[str, list[str]]:
    """Per node, how its subject entries differ from what its record says
    was deployed (``subjects_of``)."""
    expected = _by_node(subjects_of(statement["predicate"]))
    given = _by_node(statement["subject"])
    problems: dict[str, list[str]] = {}
    for node in sorted(set(expected) | set(given)):
        want, got = expected.get(node, []), given.get(node, [])
        if _sorted(want) != _sorted(got):
            problems[node] = [f"subject says {_show(got)}, but its record shows {_show(want)}"]
    return problems


def _by_node(subjects: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    found: dict[str, list[Mapping[str, Any]]] = {}
    for subject in subjects:
        found.setdefault(_node_of(subject), []).append(subject)
    return found


def _sorted(subjects: Sequence[Mapping[str, Any]]) -> list[str]:
    return sorted(json.dumps(s, sort_keys=True) for s in subjects)


def _show(subjects: Sequence[Mapping[str, Any]]) -> str:
    if not subjects:
        return "nothing deployed"
    return ", ".join(f"{s['name']} sha256:{s['digest']['sha256'][:12]}" for s in subjects)


def _evidence_consistency(predicate: Mapping[str, Any]) -> dict[str, list[str]]:
    """Per node, evidence that is not about the node or its job: what can
    be told without the agent's key."""
    problems: dict[str, list[str]] = {}
    for node in predicate["nodes"]:
        name, evidence = node["name"], node.get("evidence")
        if not evidence:
            continue
        record, beat = evidence["jobRecord"], evidence["heartbeat"]
        refusal = "jobId" not in record and "error" in record
        if not refusal and record.get("jobId") != node.get("jobId"):
            problems.setdefault(name, []).append(
                f"evidence is about job {record.get('jobId')!r}, not the recorded {node.get('jobId')}"
            )
        if isinstance(beat, dict) and beat.get("node") != name:
            problems.setdefault(name, []).append(
                f"evidence heartbeat is from node {beat.get('node')!r}"
            )
    return problems


def _merge(*parts: Mapping[str, list[str]]) -> dict[str, list[str]]:
    merged: dict[str, list[str]] = {}
    for part in parts:
        for node, problems in part.items():
            merged.setdefault(node, []).extend(problems)
    return merged


def _node_findings(
    predicate: Mapping[str, Any],
    problems: Mapping[str, list[str]],
    verdicts: Mapping[str, str],
    fallback: str,
) -> list[Finding]:
    """One finding per node, in frozen order: its problems, or what was
    found good about it."""
    findings: list[Finding] = []
    deployed = _by_node(subjects_of(predicate))
    for node in predicate["nodes"]:
        name = node["name"]
        if problems.get(name):
            findings.append(Finding(name, False, "; ".join(problems[name])))
            continue
        message = verdicts.get(name, fallback)
        if name in deployed:
            message += f"; deployed {_show(deployed[name])}"
        vouched = node.get("signature")
        if isinstance(vouched, Mapping):
            message += (
                f"; model files signed by {vouched.get('signer')} "
                f"(signature {str(vouched.get('sha256'))[:12]})"
            )
        findings.append(Finding(name, True, message))
    return findings


# -- against the repository ----------------------------------------------------


def _repository_findings(
    statement: Mapping[str, Any], source: Branch, unacted: Unacted | None
) -> list[Finding]:
    predicate = statement["predicate"]
    findings: list[Finding] = []
    missing = [c for c in COMMITS if not _commit_exists(source, predicate[c])]
    if missing:
        findings.append(
            Finding(
                "commits",
                False,
                "not in " + source.label + ": " + ", ".join(f"{c} {predicate[c]}" for c in missing),
            )
        )
    else:
        findings.append(Finding("commits", True, f"{', '.join(COMMITS)} found in {source.label}"))
    status_finding, node_diffs = _against_status(predicate, source, "statusCommit" in missing)
    findings.append(status_finding)
    if unacted is not None and status_finding.ok:
        findings.append(_acted_on(predicate, source, unacted))
    verdicts: dict[str, str] = {}
    evidence_problems: dict[str, list[str]] = {}
    if "specCommit" in missing:
        evidence_problems = {
            n["name"]: ["evidence not checked: specCommit is not in the repository"]
            for n in predicate["nodes"]
        }
    else:
        try:
            attested = _status_of(predicate)
        except (KeyError, TypeError, ValueError) as exc:  # the schema cannot tell 13 months
            return [*findings, Finding("statement", False, f"a node record is unreadable: {exc}")]
        for verdict in check_evidence(source, attested):
            if verdict.ok:
                verdicts[verdict.node] = verdict.message
            else:
                evidence_problems[verdict.node] = [f"evidence: {verdict.message}"]
    problems = _merge(_subject_problems(statement), node_diffs, evidence_problems)
    return findings + _node_findings(predicate, problems, verdicts, "")


def _acted_on(predicate: Mapping[str, Any], source: Branch, unacted: Unacted) -> Finding:
    """Whether the daemon, under the policy given, would act on the status
    the predicate was made from (docs/trust.md)."""
    name, commit = predicate["rollout"], predicate["statusCommit"]
    status = read_statuses(source, commit).statuses[name]  # _against_status read it
    reasons = unacted(status, commit)
    if reasons:
        return Finding("daemon", False, "would not act on this status: " + "; ".join(reasons))
    return Finding(
        "daemon", True, f"would act on {status_path(name)} at statusCommit {commit[:12]}"
    )


def _commit_exists(source: Branch, commit: str) -> bool:
    try:
        source.reader.file_blob(commit, SETTINGS_PATH)  # reads the commit's tree
    except StoreError:
        return False
    return True


def _status_of(predicate: Mapping[str, Any]) -> RolloutStatus:
    """The status fields ``check_evidence`` reads, from the predicate."""
    return RolloutStatus(
        name=predicate["rollout"],
        spec_commit=predicate["specCommit"],
        nodes=tuple(node_from_record(n) for n in predicate["nodes"]),
    )


def _against_status(
    predicate: Mapping[str, Any], source: Branch, commit_missing: bool
) -> tuple[Finding, dict[str, list[str]]]:
    """Whether the predicate is what the committed status at its
    ``statusCommit`` makes of it, and per node the fields that differ."""
    name, commit = predicate["rollout"], predicate["statusCommit"]
    where = f"{status_path(name)} at statusCommit {commit[:12]}"
    if commit_missing:
        return Finding("status", False, f"not compared: statusCommit {commit} is not there"), {}
    status = read_statuses(source, commit).statuses.get(name)
    if status is None:
        return Finding("status", False, f"no readable {where}"), {}
    committed = statement_of(status, commit)["predicate"]
    fields = [k for k in sorted(set(predicate) | set(committed)) if k != "nodes"]
    differ = [k for k in fields if predicate.get(k) != committed.get(k)]
    recorded = {n["name"]: n for n in committed["nodes"]}
    attested = {n["name"]: n for n in predicate["nodes"]}
    if list(recorded) != list(attested):
        differ.append("nodes (names or order)")
    node_diffs: dict[str, list[str]] = {}
    for node, record in attested.items():
        if node not in recorded:
            node_diffs[node] = [f"not a node of the rollout in {where}"]
        elif record != recorded[node]:
            keys = sorted(
                k
                for k in set(record) | set(recorded[node])
                if record.get(k) != recorded[node].get(k)
            )
            node_diffs[node] = [f"differs from {where} in: {', '.join(keys)}"]
    if node_diffs:
        differ.append("the records of " + ", ".join(node_diffs))
    if differ:
        return Finding(
            "status", False, f"predicate differs from {where} in: {', '.join(differ)}"
        ), node_diffs
    return Finding("status", True, f"predicate matches {where}"), node_diffs


def _describe(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return f"field {exc.args[0]!r} is missing"
    return str(exc) or type(exc).__name__
