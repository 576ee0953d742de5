"""Job payloads: built from a ``SendJob`` and checked against
``schemas/job.schema.json``.

The daemon builds a payload from status alone plus the time it signs it, so
the same job id always carries the same payload apart from ``issuedAt`` and
``expiresAt`` (docs/architecture.md). Agents compare payloads with
``same_job`` to tell a resend from a conflicting job.

Must not sign, verify, do HTTP or read the clock: time comes in as arguments.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from jsonschema.protocols import Validator  # type: ignore[import-untyped]
from referencing import Registry, Resource

from reconciler.protocol.effects import SendJob
from reconciler.spec import evals as eval_rules
from reconciler.spec import health, schemas
from reconciler.spec.artifacts import WARMUP_METHODS, Artifact, Warmup
from reconciler.spec.times import format_time, parse_time

SCHEMA_ID = "reconciler.job/v1"
# How long a live apply with a standby keeps the previous slot running.
KEEP_PREVIOUS = ("untilSoaked", "untilCompleted")
JOB_TTL = timedelta(minutes=15)
MAX_STAGE_TIMEOUT = 31_536_000  # seconds (a year): what the schema takes
# Fields that differ between two sends of one job (fresh signature, fresh times).
SEND_TIME_FIELDS = frozenset({"issuedAt", "expiresAt"})


def build_payload(job: SendJob, issued_at: datetime) -> dict[str, Any]:
    """The payload the daemon signs for ``job`` issued at ``issued_at``."""
    payload: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "jobId": job.job_id,
        "kind": job.kind,
        "node": job.node,
        "rollout": job.rollout,
        "attempt": job.attempt,
        "mode": job.mode,
        "target": {
            "runtime": job.target.runtime,
            "provider": job.target.provider,
            "model": job.target.model,
            "profile": job.target.profile,
        },
        "sourceCommit": job.source_commit,
    }
    payload["issuedAt"] = format_time(issued_at)
    payload["expiresAt"] = format_time(issued_at + JOB_TTL)
    if job.kind == "restore":
        payload["backupId"] = job.backup_id
    if job.health is not None and job.health.agent_checks:
        payload["checks"] = health.to_payload(job.health, job.node)
    if job.artifacts:
        payload["artifacts"] = [_artifact_payload(a) for a in job.artifacts]
    if job.kind == "stage" and job.stage_timeout is not None:
        payload["timeoutSeconds"] = min(job.stage_timeout, MAX_STAGE_TIMEOUT)
    if job.signature is not None:
        payload["signature"] = {
            "url": job.signature.url,
            "sha256": job.signature.sha256,
            "size": job.signature.size,
        }
        payload["signers"] = [{"name": s.name, "publicKey": s.public_key} for s in job.signers]
    if job.drain is not None:
        # A preset arrives expanded (url and metrics): the agent reads the
        # same fields either way. One metric stays a name, as agents before
        # lists read it.
        metrics = job.drain.idle_metrics
        payload["drain"] = {
            "timeoutSeconds": job.drain.timeout_seconds,
            "idle": {
                "url": health.for_node(job.drain.idle_url, job.node),
                "metric": metrics[0] if len(metrics) == 1 else list(metrics),
                "max": job.drain.idle_max,
            },
        }
    if job.warmup:
        payload["warmup"] = [_warmup_payload(w, job.node) for w in job.warmup]
    if job.evals:
        payload["evals"] = eval_rules.to_payload(job.evals, job.node, job.baseline_answers)
    if job.standby is not None:
        payload["standby"] = {"keepPrevious": job.standby}
    return payload


def _artifact_payload(artifact: Artifact) -> dict[str, Any]:
    """Its fields; ``path`` only when one was written, so the payloads of a
    rollout without paths stay what agents before model directories read."""
    entry: dict[str, Any] = {
        "name": artifact.name,
        "url": artifact.url,
        "sha256": artifact.sha256,
        "size": artifact.size,
    }
    if artifact.path:
        entry["path"] = artifact.path
    return entry


def _warmup_payload(warmup: Warmup, node: str) -> dict[str, Any]:
    return {
        "url": health.for_node(warmup.url, node),
        "method": warmup.method,
        "body": warmup.body,
        "expectStatus": warmup.expect_status,
        "timeoutSeconds": warmup.timeout_seconds,
        "times": warmup.times,
    }


def same_job(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """True when two payloads are the same job apart from their send times."""
    keys = (set(a) | set(b)) - SEND_TIME_FIELDS
    return all(a.get(k) == b.get(k) for k in keys)


@cache
def _validators() -> tuple[Validator, Draft202012Validator]:
    schema = schemas.load_schema("job")
    payload_validator = schemas.validator("job")
    # The envelope definition refers to the payload as "#": validate it by
    # reference into the same resource, so "#" keeps meaning the payload.
    registry: Registry[Any] = Registry().with_resource(
        schema["$id"], Resource.from_contents(schema)
    )
    envelope_schema = {"$ref": schema["$id"] + "#/$defs/envelope"}
    envelope_validator = Draft202012Validator(envelope_schema, registry=registry)
    return payload_validator, envelope_validator


@cache
def _evals_validator() -> Validator:
    """A live apply's ``evals``: rare and nested, so the schema itself
    checks them, without the rest of the payload."""
    schema = schemas.load_schema("job")
    registry: Registry[Any] = Registry().with_resource(
        schema["$id"], Resource.from_contents(schema)
    )
    return Draft202012Validator({"$ref": schema["$id"] + "#/properties/evals"}, registry=registry)


def payload_problems(document: Any, *, envelope: bool = False) -> list[str]:
    """What is wrong with a payload (or an envelope); empty when it is valid."""
    if not _plainly_valid(document, envelope=envelope):
        payload_validator, envelope_validator = _validators()
        validator = envelope_validator if envelope else payload_validator
        if validator.is_valid(document):
            # The schema allows it but the fast check does not: a trailing
            # newline in a text field ("$" matches before one in Python
            # patterns), an integral float as a count, or two checks of
            # one name. All are refused.
            return [
                "a text field ends with a newline, a count is not a plain integer, "
                "or two checks share a name"
            ]
        problems = []
        for error in sorted(validator.iter_errors(document), key=lambda e: list(e.path)):
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            problems.append(f"{where}: {error.message}")
        return problems[:5]
    payload = document["payload"] if envelope else document
    try:
        issued = parse_time(payload["issuedAt"])
        expires = parse_time(payload["expiresAt"])
    except ValueError as exc:  # matches the pattern, yet no such date (month 13)
        return [f"issuedAt/expiresAt: {exc}"]
    if not issued < expires <= issued + JOB_TTL:
        return ["expiresAt: must be after issuedAt and at most 15 minutes later"]
    return []


# -- the fast path -------------------------------------------------------------
# jsonschema takes about 0.5 ms per payload, a quarter of the simulated fleet's
# budget per job. This check accepts what the schema accepts (a test compares
# both on generated documents) except two corners it refuses on purpose;
# jsonschema only explains failures.

_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")
_COMMIT = re.compile(r"[0-9a-f]{7,64}")
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z")
_KEY_ID = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")
_SIGNATURE = re.compile(r"[A-Za-z0-9+/]{86}==")
_PAYLOAD_KEYS = frozenset(
    ("schema", "jobId", "kind", "node", "rollout", "attempt", "mode", "target", "sourceCommit")
) | {"issuedAt", "expiresAt"}
_TARGET_KEYS = frozenset(("runtime", "provider", "model", "profile"))


def _matches(pattern: re.Pattern[str], value: Any) -> bool:
    # fullmatch, as a JSON Schema pattern anchored with ^...$ (no trailing newline)
    return type(value) is str and pattern.fullmatch(value) is not None


# Which fields beyond the common ones each kind and mode may carry.
_EXTRA_KEYS: dict[tuple[str, str], frozenset[str]] = {
    ("apply", "dry_run"): frozenset({"artifacts", "signature", "signers"}),
    ("apply", "live"): frozenset(
        {"artifacts", "checks", "drain", "warmup", "evals", "signature", "signers", "standby"}
    ),
    ("eval", "live"): frozenset({"evals"}),
    ("release", "live"): frozenset(),
    ("restore", "live"): frozenset({"backupId"}),
    ("stage", "dry_run"): frozenset({"artifacts", "timeoutSeconds", "signature", "signers"}),
    ("stage", "live"): frozenset({"artifacts", "timeoutSeconds", "signature", "signers"}),
}
# A signature comes with the keys to check it and the files it signs.
_SIGNED = frozenset({"signature", "signers", "artifacts"})
# ... and which of them it must carry.
_REQUIRED_EXTRA = {"restore": "backupId", "stage": "artifacts", "eval": "evals"}


def _plainly_valid(document: Any, *, envelope: bool) -> bool:
    if envelope:
        if type(document) is not dict or document.keys() != {"payload", "keyId", "signature"}:
            return False
        if not (
            _matches(_KEY_ID, document["keyId"]) and _matches(_SIGNATURE, document["signature"])
        ):
            return False
        document = document["payload"]
    if type(document) is not dict or not document.keys() >= _PAYLOAD_KEYS:
        return False
    kind, mode = document["kind"], document["mode"]
    if type(kind) is not str or type(mode) is not str:
        return False
    allowed = _EXTRA_KEYS.get((kind, mode))
    extra = document.keys() - _PAYLOAD_KEYS
    if allowed is None or not extra <= allowed:
        return False
    required = _REQUIRED_EXTRA.get(kind)
    if required is not None and required not in extra:
        return False
    if ("signature" in extra or "signers" in extra) and not extra >= _SIGNED:
        return False
    if not all(_EXTRA_CHECKS[key](document[key]) for key in extra):
        return False
    target = document["target"]
    attempt = document["attempt"]
    return (
        document["schema"] == SCHEMA_ID
        and _matches(_ID, document["jobId"])
        and _matches(_NAME, document["node"])
        and _matches(_NAME, document["rollout"])
        and type(attempt) is int
        and attempt >= 1
        and type(target) is dict
        and target.keys() == _TARGET_KEYS
        and all(_matches(_WORD, v) for v in target.values())
        and _matches(_COMMIT, document["sourceCommit"])
        and _matches(_TIME, document["issuedAt"])
        and _matches(_TIME, document["expiresAt"])
    )


_HTTP_KEYS = frozenset(("url", "expectStatus", "bodyContains", "timeoutSeconds"))
_TCP_KEYS = frozenset(("host", "port", "timeoutSeconds"))


def _count(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _plain_checks(checks: Any) -> bool:
    """The agent checks of a live apply (docs/health.md), as the schema says."""
    if type(checks) is not list or not 1 <= len(checks) <= 32:
        return False
    names = set()
    for check in checks:
        if type(check) is not dict or not _matches(_NAME, check.get("name")):
            return False
        names.add(check["name"])
        if not _count(check.get("intervalSeconds"), 1, 86400):
            return False
        kind = check.keys() - {"name", "intervalSeconds"}
        if kind == {"http"}:
            probe = check["http"]
            if type(probe) is not dict or probe.keys() != _HTTP_KEYS:
                return False
            url, body = probe["url"], probe["bodyContains"]
            if not (type(url) is str and 0 < len(url) <= 2048 and _HTTP_URL.match(url)):
                return False
            if not (type(body) is str and len(body) <= 1024):
                return False
            if not _count(probe["expectStatus"], 100, 599):
                return False
        elif kind == {"tcp"}:
            probe = check["tcp"]
            if type(probe) is not dict or probe.keys() != _TCP_KEYS:
                return False
            host = probe["host"]
            if not (type(host) is str and 0 < len(host) <= 255 and "\n" not in host):
                return False
            if not _count(probe["port"], 1, 65535):
                return False
        else:
            return False
        if not _count(probe["timeoutSeconds"], 1, 3600):
            return False
    return len(names) == len(checks)


_HTTP_URL = re.compile(r"https?://[^\n]*\Z")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MODEL_PATH = re.compile(r"(?!\.\.?(/|$))(?!.*/\.\.?(/|$))[a-z0-9._-]{1,63}(/[a-z0-9._-]{1,63})*")
_METRIC = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]{0,199}")
_ARTIFACT_KEYS = frozenset(("name", "url", "sha256", "size"))
_DRAIN_KEYS = frozenset(("timeoutSeconds", "idle"))
_IDLE_KEYS = frozenset(("url", "metric", "max"))
_WARMUP_KEYS = frozenset(("url", "method", "body", "expectStatus", "timeoutSeconds", "times"))


def _url(value: Any) -> bool:
    return type(value) is str and 0 < len(value) <= 2048 and _HTTP_URL.match(value) is not None


def _items(value: Any, keys: frozenset[str]) -> bool:
    """A list of 1 to 32 objects, each with exactly ``keys``."""
    return (
        type(value) is list
        and 1 <= len(value) <= 32
        and all(type(item) is dict and item.keys() == keys for item in value)
    )


def _plain_artifacts(artifacts: Any) -> bool:
    return (
        type(artifacts) is list
        and 1 <= len(artifacts) <= 32
        and all(
            type(a) is dict
            and (a.keys() == _ARTIFACT_KEYS or a.keys() == _ARTIFACT_KEYS | {"path"})
            for a in artifacts
        )
    ) and all(
        _matches(_NAME, a["name"])
        and ("path" not in a or (_matches(_MODEL_PATH, a["path"]) and len(a["path"]) <= 255))
        and _url(a["url"])
        and _matches(_SHA256, a["sha256"])
        and type(a["size"]) is int
        and a["size"] >= 1
        for a in artifacts
    )


def _plain_drain(drain: Any) -> bool:
    if type(drain) is not dict or drain.keys() != _DRAIN_KEYS:
        return False
    idle = drain["idle"]
    if type(idle) is not dict or idle.keys() != _IDLE_KEYS:
        return False
    most = idle["max"]
    return (
        _count(drain["timeoutSeconds"], 1, 86400)
        and _url(idle["url"])
        and _metrics(idle["metric"])
        and type(most) in (int, float)
        and most >= 0
    )


def _metrics(value: Any) -> bool:
    """One metric name, or a list of 1 to 16."""
    if type(value) is list:
        return 1 <= len(value) <= 16 and all(_matches(_METRIC, m) for m in value)
    return _matches(_METRIC, value)


def _plain_warmups(warmups: Any) -> bool:
    return _items(warmups, _WARMUP_KEYS) and all(
        _url(w["url"])
        and w["method"] in WARMUP_METHODS
        and type(w["body"]) is str
        and len(w["body"]) <= 65536
        and _count(w["expectStatus"], 100, 599)
        and _count(w["timeoutSeconds"], 1, 3600)
        and _count(w["times"], 1, 100)
        for w in warmups
    )


_SIGNATURE_KEYS = frozenset(("url", "sha256", "size"))
_SIGNER_KEYS = frozenset(("name", "publicKey"))


def _plain_signature(signature: Any) -> bool:
    return (
        type(signature) is dict
        and signature.keys() == _SIGNATURE_KEYS
        and _url(signature["url"])
        and _matches(_SHA256, signature["sha256"])
        and type(signature["size"]) is int
        and signature["size"] >= 1
    )


def _plain_signers(signers: Any) -> bool:
    return _items(signers, _SIGNER_KEYS) and all(
        _matches(_NAME, s["name"])
        and type(s["publicKey"]) is str
        and 1 <= len(s["publicKey"]) <= 4096
        for s in signers
    )


_EXTRA_CHECKS: dict[str, Callable[[Any], bool]] = {
    "signature": _plain_signature,
    "signers": _plain_signers,
    "backupId": lambda value: _matches(_ID, value),
    "artifacts": _plain_artifacts,
    "timeoutSeconds": lambda value: _count(value, 1, MAX_STAGE_TIMEOUT),
    "checks": _plain_checks,
    "drain": _plain_drain,
    "warmup": _plain_warmups,
    "evals": lambda value: _evals_validator().is_valid(value),
    "standby": lambda value: (
        type(value) is dict
        and value.keys() == {"keepPrevious"}
        and value["keepPrevious"] in KEEP_PREVIOUS
    ),
}
