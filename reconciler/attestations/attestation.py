"""Deployment attestations (docs/attestations.md): what a finished
rollout's attestation states, built from its committed status, and the
DSSE envelope the daemon's key signs around it.

The attestation is an in-toto Statement v1. Its ``subject`` names what is
now deployed: one entry per node that succeeded on signed evidence, named
``NODE/RUNTIME``, with the SHA-256 of the model artifacts the rollout put
there or, without artifacts, of the runtime's config as the node's own
signed heartbeat reported it. Its ``predicate`` (``PREDICATE_TYPE``,
schema ``schemas/deployment-attestation.schema.json``) carries the chain
that subject rests on: the rollout's ``specCommit`` and ``startCommit``,
the status commit it was read at, the approvals counted, the frozen
policy, and every node record exactly as the status holds it, signed
evidence included.

The envelope and keys are securesystemslib's (the in-toto project's own),
so in-toto's tools check what we sign; its exceptions are translated here.
``statement_of`` is pure: the same status gives the same bytes. Reading
Git is left to the callers' ``Branch``; this module decides nothing about
rollouts and never writes a file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from jsonschema.exceptions import best_match  # type: ignore[import-untyped]
from securesystemslib.dsse import Envelope
from securesystemslib.signer import CryptoSigner, SSlibKey

from reconciler.attestations.evidence_check import check_evidence
from reconciler.git.branch import Branch
from reconciler.protocol.signing import SigningKey, TrustedKey, canonical_json
from reconciler.readers.status_reader import read_snapshot
from reconciler.spec import schemas
from reconciler.spec.errors import ReconcilerError
from reconciler.spec.paths import status_path
from reconciler.spec.rollout_status import TERMINAL_PHASES, RolloutStatus, to_record

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PREDICATE_TYPE = "https://reconciler.dev/attestation/deployment/v1"
PREDICATE_SCHEMA = "deployment-attestation"
DIGEST_PREFIX = "sha256:"


class AttestationError(ReconcilerError):
    """An attestation cannot be made: the rollout is unfinished, its
    evidence does not verify, or nothing was deployed on signed evidence."""


def statement_of(status: RolloutStatus, status_commit: str) -> dict[str, Any]:
    """The in-toto Statement for ``status``, read at ``status_commit``."""
    record = to_record(status)
    predicate: dict[str, Any] = {
        "rollout": status.name,
        "phase": record["phase"],
        "reason": record["reason"],
        "specCommit": record["specCommit"],
        "startCommit": record["startCommit"],
        "statusCommit": status_commit,
        "startedAt": record["startedAt"],
        "finishedAt": record["finishedAt"],
        "approvals": [
            {"principal": a["principal"], "keyId": a["keyId"], "rules": list(a.get("rules", ()))}
            for a in record.get("approvedBy", ())
        ],
        "frozen": record["frozen"],
        "nodes": record["nodes"],
    }
    if record.get("evalBaseline"):  # absent without matchesBaseline cases
        predicate["evalBaseline"] = record["evalBaseline"]
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects_of(predicate),
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }


def subjects_of(predicate: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The statement's subject, derived from its predicate alone, so a
    verifier can derive it again: every node of a live rollout that
    succeeded on signed evidence, in frozen order."""
    frozen = predicate.get("frozen") or {}
    if not frozen.get("live"):
        return []  # a dry-run changed nothing on any node
    target = frozen.get("target") or {}
    runtime = str(target.get("runtime", ""))
    artifacts = frozen.get("artifacts") or ()  # status keeps them beside the target
    subjects: list[dict[str, Any]] = []
    for node in predicate.get("nodes") or ():
        if node.get("state") != "succeeded" or not node.get("evidence"):
            continue
        name = f"{node['name']}/{runtime}"
        if artifacts:
            subjects += [
                {
                    "name": name,
                    "digest": {"sha256": a["sha256"]},
                    "annotations": {"artifact": a["name"]},
                }
                for a in artifacts
            ]
            continue
        digest = reported_digest(node["evidence"], runtime)
        if digest:
            subjects.append({"name": name, "digest": {"sha256": digest}})
    return subjects


def predicate_problem(predicate: Any) -> str:
    """Why ``predicate`` does not match its schema; "" when it does."""
    if schemas.fast_check(PREDICATE_SCHEMA)(predicate):
        return ""  # the compiled check; jsonschema only to put a failure in words
    error = best_match(schemas.validator(PREDICATE_SCHEMA).iter_errors(predicate))
    if error is None:
        return ""
    where = ".".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else str(error.message)


def reported_digest(evidence: Mapping[str, Any], runtime: str) -> str:
    """The hex SHA-256 of ``runtime``'s config in the node's signed
    heartbeat, or "" when the heartbeat reports none."""
    beat = evidence.get("heartbeat")
    runtimes = beat.get("runtimes") if isinstance(beat, Mapping) else None
    for entry in runtimes if isinstance(runtimes, list) else ():
        if isinstance(entry, Mapping) and entry.get("type") == runtime:
            value = entry.get("configDigest")
            if isinstance(value, str) and value.startswith(DIGEST_PREFIX):
                return value[len(DIGEST_PREFIX) :]
    return ""


# -- making one --------------------------------------------------------------


Unacted = Callable[[RolloutStatus, str], list[str]]  # (status, its commit) -> why not acted on


def attest(
    source: Branch, name: str, key: SigningKey, unacted: Unacted | None = None
) -> dict[str, Any]:
    """The signed envelope (as JSON data) attesting rollout ``name`` as the
    branch's committed status holds it. Refuses, with what to do, an
    unfinished rollout, a status the daemon would not act on (``unacted``
    says why, under the daemon's policy), evidence that does not verify
    against the agent keys at its specCommit (the daemon's key would vouch
    for it), and a rollout that deployed nothing on signed evidence."""
    snapshot = read_snapshot(source)
    status = snapshot.statuses.get(name)
    if status is None or snapshot.commit is None:
        raise AttestationError(
            f"no readable status for rollout {name!r} on branch {source.branch} of {source.label}",
            "check the name with: reconciler status",
        )
    _refuse_unfinished(status)
    reasons = unacted(status, snapshot.commit) if unacted is not None else []
    if reasons:
        raise AttestationError(
            f"rollout {name}: the daemon would not act on {status_path(name)} at "
            f"{snapshot.commit[:12]}: "
            + "; ".join(reasons)
            + "; the attestation would vouch for a deployment the daemon never made",
            f"see: reconciler verify --evidence {name} --repo {source.label} with the "
            "daemon's own flags",
        )
    failed = [v for v in check_evidence(source, status) if not v.ok]
    if failed:
        raise AttestationError(
            f"rollout {name}: the recorded evidence does not verify for "
            + "; ".join(f"{v.node} ({v.message})" for v in failed)
            + f", in {status_path(name)} at {snapshot.commit[:12]}; the attestation would vouch for it",
            f"see every node with: reconciler verify --evidence {name} --repo {source.label}",
        )
    statement = statement_of(status, snapshot.commit)
    problem = predicate_problem(statement["predicate"])
    if problem:
        raise AttestationError(
            f"{status_path(name)} at {snapshot.commit[:12]} does not make a valid attestation: "
            f"{problem}",
            "the status file is not one the daemon wrote; see: reconciler status " + name,
        )
    if not statement["subject"]:
        raise AttestationError(*_nothing_deployed(status))
    return sign(statement, key)


def _nothing_deployed(status: RolloutStatus) -> tuple[str, str]:
    """Why ``status`` has no subject, and what to do: the reason that holds,
    a dry-run, no node that succeeded, or succeeded nodes without signed
    evidence (only then are agent keys the cause)."""
    name = status.name
    head = f"rollout {name}: nothing to attest: "
    if status.frozen is not None and not status.frozen.live:
        return (
            head + "it was a dry-run, which changes nothing on any node",
            "attestations describe live rollouts",
        )
    succeeded = [n.name for n in status.nodes if n.state == "succeeded"]
    if not succeeded:
        states = ", ".join(f"{n.name} {n.state}" for n in status.nodes[:10])
        more = f" and {len(status.nodes) - 10} more" if len(status.nodes) > 10 else ""
        return (
            head + f"no node succeeded ({states}{more}), so nothing was deployed",
            f"see why with: reconciler status {name}",
        )
    return (
        head + f"no node that succeeded has signed evidence of what it now runs "
        f"({', '.join(succeeded[:10])}{' ...' if len(succeeded) > 10 else ''})",
        "attestations cover nodes whose spec.agentKey the agent signs with "
        "(reconciler agent --key)",
    )


def _refuse_unfinished(status: RolloutStatus) -> None:
    if not status.started:
        raise AttestationError(
            f"rollout {status.name} never started ({status.phase}): nothing was deployed",
            "an attestation describes a rollout that ran; check with: "
            f"reconciler status {status.name}",
        )
    if status.phase not in TERMINAL_PHASES:
        raise AttestationError(
            f"rollout {status.name} is {status.phase}: an attestation describes a finished rollout",
            "attest it once it has completed, failed or been aborted "
            f"(reconciler status {status.name})",
        )


def sign(statement: Mapping[str, Any], key: SigningKey) -> dict[str, Any]:
    """``statement`` in a DSSE envelope signed by ``key``; the signature's
    keyid is the key's ``SHA256:...`` fingerprint."""
    envelope = Envelope(canonical_json(statement), PAYLOAD_TYPE, {})
    try:
        signer = CryptoSigner(key.private_key, sslib_key(key.trusted()))
        envelope.sign(signer)
    except (ValueError, TypeError) as exc:
        raise AttestationError(
            f"cannot sign with {key.source or key.key_id}: {exc}",
            "pass the daemon's key as reconciler keys generate writes it",
        ) from exc
    signed: dict[str, Any] = envelope.to_dict()
    return signed


def sslib_key(key: TrustedKey) -> SSlibKey:
    """``key`` as securesystemslib's Ed25519 key, named by its fingerprint."""
    return SSlibKey.from_crypto(key.public_key, keyid=key.key_id)
