"""Job ids: derived, never drawn, so re-sending after a crash is harmless.

A job id is a digest of (rollout, start commit, node, attempt, kind, and for
restores the rollback request id or ``policy``) (docs/architecture.md,
invariant 2). Any daemon, after any restart, derives the same id for the
same decision. Pure.
"""

from __future__ import annotations

import hashlib

from reconciler.protocol.effects import JOB_KINDS

# 32 hex digits (128 bits) keep ids short in status files and far from collisions.
_DIGITS = 32


def job_id(
    rollout: str, start_commit: str, node: str, attempt: int, kind: str, restore_for: str = ""
) -> str:
    """``KIND-<hex>`` for KIND apply, restore, stage, eval or release.
    ``restore_for`` is the rollback request id, or ``policy`` for a restore
    the failure policy decided; it must be empty for every other kind."""
    if kind not in JOB_KINDS:
        raise ValueError(f"job kind must be one of {', '.join(JOB_KINDS)}, got {kind!r}")
    if (kind == "restore") != bool(restore_for):
        raise ValueError("a restore job needs restore_for; no other kind takes one")
    # Unit separators keep fields from running into each other ("a"+"bc" vs "ab"+"c").
    material = "\x1f".join(
        ("reconciler.job/v1", rollout, start_commit, node, str(attempt), kind, restore_for)
    )
    digest = hashlib.sha256(material.encode("utf-8")).hexdigest()[:_DIGITS]
    return f"{kind}-{digest}"
