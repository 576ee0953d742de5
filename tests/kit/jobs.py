"""Jobs for tests: a ``SendJob`` as the engine makes one, and its signed
envelope as the daemon posts it.

    envelope(job("apply-0001", node="gpu-a1"), key)
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from reconciler.protocol.effects import SendJob
from reconciler.protocol.job_payload import build_payload
from reconciler.protocol.signing import SigningKey, make_envelope
from reconciler.spec.model import Target

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def job(job_id: str = "apply-0001", **changes: Any) -> SendJob:
    base = SendJob(
        job_id=job_id,
        kind="apply",
        node="node-a",
        rollout="llama",
        attempt=1,
        mode="live",
        target=Target("hermes", "vllm", "llama3.1-8b", "default"),
        source_commit=COMMIT,
    )
    return replace(base, **changes)


def envelope(send: SendJob, key: SigningKey, issued_at: datetime | None = None) -> dict[str, Any]:
    return make_envelope(build_payload(send, issued_at or datetime.now(UTC)), key)
