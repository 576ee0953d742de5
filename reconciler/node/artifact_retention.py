"""Which artifacts the agent keeps: those the current and the previous
config of each runtime point to (a restore must not need a download), those
of jobs accepted and not yet applied, and past those the newest
``keep`` per runtime; the rest go, oldest first. A model directory goes
with its files: it is removed when any of them is, so every directory kept
has all its files.

Pure: configs, journal records and uses in, digests and model ids out.

Must not: read or delete files (``artifact_store`` does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from reconciler.node.journal import stored_time
from reconciler.node.state_dir import JobRecord

_WAITING = ("accepted", "running")


def config_artifacts(values: Mapping[str, Any]) -> set[str]:
    """The digests a runtime's config (``artifacts: {NAME: {path, sha256}}``) points to."""
    found = values.get("artifacts")
    if not isinstance(found, Mapping):
        return set()
    return {
        str(entry["sha256"])
        for entry in found.values()
        if isinstance(entry, Mapping) and isinstance(entry.get("sha256"), str)
    }


def job_artifacts(payload: Mapping[str, Any]) -> set[str]:
    found = payload.get("artifacts")
    if not isinstance(found, list):
        return set()
    signature = payload.get("signature")  # staged beside them
    found = [*found, signature] if isinstance(signature, Mapping) else found
    return {str(a["sha256"]) for a in found if isinstance(a, Mapping) and "sha256" in a}


def pinned_by_jobs(records: Iterable[JobRecord]) -> set[str]:
    """Artifacts of jobs not finished, and of staged rollouts not applied
    since: a succeeded stage job pins its files until a live apply of the
    same rollout and runtime succeeded after it (or the journal drops it)."""
    records = list(records)
    applied: dict[tuple[str, str], datetime] = {}  # (rollout, runtime) -> latest success
    for r in records:
        p = r.payload
        if p.get("kind") == "apply" and p.get("mode") == "live" and r.state == "succeeded":
            key = (str(p.get("rollout")), str(p["target"]["runtime"]))
            moment = stored_time(r.accepted_at)
            applied[key] = max(applied.get(key, moment), moment)
    pinned: set[str] = set()
    for r in records:
        p = r.payload
        if r.state in _WAITING:
            pinned |= job_artifacts(p)
        elif p.get("kind") == "stage" and r.state == "succeeded":
            key = (str(p.get("rollout")), str(p["target"]["runtime"]))
            if key not in applied or applied[key] < stored_time(r.accepted_at):
                pinned |= job_artifacts(p)
    return pinned


def artifacts_to_prune(
    uses: Mapping[str, Mapping[str, int]], held: Iterable[str], pinned: Iterable[str], keep: int
) -> list[str]:
    """Digests to delete, oldest first: of those ``held``, every one not
    ``pinned`` and not among the ``keep`` newest unpinned uses of some
    runtime. A held file with no recorded use is older than any."""
    pinned = set(pinned)
    kept = set(pinned)
    per_runtime: dict[str, list[tuple[int, str]]] = {}
    for sha256, by_runtime in uses.items():
        for runtime, moment in by_runtime.items():
            per_runtime.setdefault(runtime, []).append((moment, sha256))
    for entries in per_runtime.values():
        newest = [s for _, s in sorted(entries, reverse=True) if s not in pinned]
        kept.update(newest[:keep])

    def last_use(sha256: str) -> int:
        return max(uses.get(sha256, {}).values(), default=-1)

    return sorted((s for s in set(held) if s not in kept), key=lambda s: (last_use(s), s))


def model_dirs_to_remove(dirs: Mapping[str, Iterable[str]], doomed: Iterable[str]) -> list[str]:
    """Model ids (of ``dirs``: id -> its digests) that hold a doomed file."""
    doomed = set(doomed)
    return sorted(ident for ident, digests in dirs.items() if doomed & set(digests))
