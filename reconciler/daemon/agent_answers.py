"""What agents answer, read into observation values (docs/protocol.md): a job
record, a heartbeat, a backup list, an error's ``code: message``. Anything
unusable raises ``Unreachable`` with what is wrong with it.

Must not talk to anyone: the bytes come in, values come out.
"""

from __future__ import annotations

import json
from typing import Any

from reconciler.daemon.agent_http import Unreachable
from reconciler.protocol.evidence import split_answer
from reconciler.protocol.observations import (
    BackupList,
    Heartbeat,
    JobObservation,
    RuntimeReport,
    SignedAnswer,
    parse_backup_list,
    parse_check_reports,
)
from reconciler.spec.artifact_records import ROUTED_AT, TIMING_KEYS

AGENT_JOB_STATES = frozenset({"accepted", "running", "succeeded", "failed"})


def read_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep
        raise Unreachable(f"answer is not JSON: {body[:60]!r}") from None


def error_text(status: int, body: bytes) -> str:
    """``code: message`` from an error answer, or what we can say about it."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep
        data = None
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        message = data.get("message")
        return f"{data['error']}: {message}" if isinstance(message, str) else data["error"]
    excerpt = body[:80].decode("utf-8", "replace").strip()
    return f"http_{status}: {excerpt}" if excerpt else f"http_{status}"


def signed_error(body: bytes) -> SignedAnswer | None:
    """The evidence of an error answer (a signed refusal), if it has any."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep
        return None
    return split_answer(data) if isinstance(data, dict) else None


def _optional_str(record: dict[str, Any], key: str) -> str | None:
    value = record.get(key)
    if value is None or isinstance(value, str):
        return value
    raise Unreachable(f"job record field {key} is not text: {value!r}")


def job_observation(job_id: str, body: bytes) -> JobObservation:
    record = read_json(body)
    if not isinstance(record, dict):
        raise Unreachable("job record is not a JSON object")
    if record.get("jobId") != job_id:
        raise Unreachable(f"answer is about job {record.get('jobId')!r}, not {job_id!r}")
    state = record.get("state")
    if state not in AGENT_JOB_STATES:
        raise Unreachable(f"job record has no valid state: {state!r}")
    return JobObservation(
        job_id=job_id,
        state=state,
        error=_optional_str(record, "error") or "",
        backup_id=_optional_str(record, "backupId"),
        finished_at=_optional_str(record, "finishedAt"),
        source_commit=_optional_str(record, "sourceCommit"),
        detail=_optional_str(record, "detail") or "",
        signed=split_answer(record),
        timings=_timings(record.get("timings")),
        signature=_signature(record.get("signature")),
        evals=_evals(record.get("evals")),
        standby=_standby(record.get("standby")),
    )


def _evals(value: Any) -> tuple[dict[str, Any], ...] | None:
    """A job record's ``evals`` (docs/evals.md), or None when absent."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(_eval_result(v) for v in value):
        raise Unreachable("job record evals is not a list of eval results")
    return tuple(value)


def _eval_result(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("name"), str)
        and isinstance(value.get("suiteSha256"), str)
        and all(type(value.get(k)) is int for k in ("passed", "total"))
        and isinstance(value.get("passRate"), int | float)
        and isinstance(value.get("cases"), list)
        and all(
            isinstance(c, dict)
            and isinstance(c.get("name"), str)
            and isinstance(c.get("ok"), bool)
            and isinstance(c.get("answer"), str)
            and isinstance(c.get("detail"), str)
            for c in value["cases"]
        )
    )


def _signature(value: Any) -> dict[str, str] | None:
    """A stage job record's ``signature`` (docs/protocol.md), or None when absent."""
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("signer"), str)
        or not isinstance(value.get("sha256"), str)
    ):
        raise Unreachable(f"job record signature is not {{signer, sha256}}: {value!r}")
    return {"signer": value["signer"], "sha256": value["sha256"]}


def _timings(value: Any) -> dict[str, str | None] | None:
    """A job record's ``timings`` (docs/protocol.md), or None when absent."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        v is None or isinstance(v, str) for v in value.values()
    ):
        raise Unreachable(f"job record timings is not an object of times: {value!r}")
    timings = {key: value.get(key) for key in TIMING_KEYS}
    if value.get(ROUTED_AT) is not None:  # a standby switch (docs/rollouts.md#warm-standby)
        timings[ROUTED_AT] = value[ROUTED_AT]
    return timings


def _standby(value: Any) -> dict[str, Any] | None:
    """A job record's ``standby`` (an apply or restore on slots), or None when absent."""
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or not all(
            value.get(k) is None or isinstance(value.get(k), str) for k in ("slot", "serving")
        )
        or not isinstance(value.get("warm", False), bool)
    ):
        raise Unreachable(f"job record standby is not {{slot, serving}}: {value!r}")
    return dict(value)


def _text(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise Unreachable(f"field {key} is missing or not text")
    return value


def heartbeat_of(node: str, body: bytes) -> Heartbeat:
    data = read_json(body)
    if not isinstance(data, dict):
        raise Unreachable("heartbeat is not a JSON object")
    if data.get("node") != node:
        raise Unreachable(f"heartbeat names node {data.get('node')!r}, not {node!r}")
    runtimes = data.get("runtimes")
    if not isinstance(runtimes, list) or not all(isinstance(r, dict) for r in runtimes):
        raise Unreachable("heartbeat runtimes is not a list of objects")
    agent_version = data.get("agentVersion")
    try:
        checks = parse_check_reports(data.get("checks"))
    except ValueError as exc:
        raise Unreachable(str(exc)) from None
    return Heartbeat(
        node=node,
        time=_text(data, "time"),
        agent_version=agent_version if isinstance(agent_version, str) else "",
        runtimes=tuple(
            RuntimeReport(
                type=_text(r, "type"),
                provider=_text(r, "provider"),
                model=_text(r, "model"),
                profile=_text(r, "profile"),
                config_digest=r["configDigest"] if isinstance(r.get("configDigest"), str) else "",
            )
            for r in runtimes
        ),
        checks=checks,
        signed=split_answer(data),
    )


def backups_of(node: str, body: bytes) -> BackupList:
    """A backup list: the object form (``?signed=1``) with its evidence, or
    a bare list, which carries none."""
    data = read_json(body)
    signed = None
    if isinstance(data, dict):
        if data.get("node") != node:
            raise Unreachable(f"backup list names node {data.get('node')!r}, not {node!r}")
        signed = split_answer(data)
        data = data.get("backups")
    try:
        return BackupList(parse_backup_list(data), signed)
    except ValueError as exc:
        raise Unreachable(str(exc)) from None


def transient(status: int) -> bool:
    """Answers that say nothing about the job: try again later."""
    return status >= 500 or status in (408, 429)
