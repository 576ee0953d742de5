"""A simulated node's real download, for ``stage: fetch`` in the simulated
fleet's script: each artifact is fetched from its URL and its size and
SHA-256 are checked, so a demo or test that says a node staged a file by
its digest is telling the truth. Nothing is kept but the verdict.

Must not: write the fetched bytes anywhere, or stand in for the agent's
downloader (``artifact_download``): no resume, no rate cap, no redirect fence.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

TIMEOUT = 30.0  # seconds without a byte before a simulated download fails


def fetch_and_check(artifacts: Iterable[Mapping[str, Any]]) -> str | None:
    """None when every artifact was fetched with its size and digest; else the
    stage error the real agent would answer (``download_failed: ...`` or
    ``digest_mismatch: ...``)."""
    with httpx.Client(timeout=TIMEOUT) as client:
        for artifact in artifacts:
            url = artifact["url"]
            digest = hashlib.sha256()
            size = 0
            try:
                with client.stream("GET", url) as answer:
                    if answer.status_code != 200:
                        return (
                            f"download_failed: {url}: {answer.status_code} {answer.reason_phrase}"
                        )
                    for chunk in answer.iter_bytes():
                        digest.update(chunk)
                        size += len(chunk)
            except httpx.HTTPError as exc:
                return f"download_failed: {url}: {exc or type(exc).__name__}"
            got = digest.hexdigest()
            if size != artifact["size"] or got != artifact["sha256"]:
                return (
                    f"digest_mismatch: {artifact['name']}: expected {artifact['sha256']} "
                    f"({artifact['size']} bytes), got {got} ({size} bytes)"
                )
    return None
