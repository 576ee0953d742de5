"""A model directory's id: the lowercase hex SHA-256 of the canonical JSON
(the bytes jobs are signed over) of the sorted ``[path, sha256]`` pairs of
its files. The same files at the same paths give the same id on every node
and in every tool, so a reviewer can tell which directory a node loads.

Pure. Must not touch files (the agent's ``model_dirs`` lays them out).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from reconciler.protocol.signing import canonical_json


def layout_pairs(artifacts: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    """The sorted ``[path, sha256]`` pairs of payload artifacts (a path
    not given is the artifact's name)."""
    return sorted([str(a.get("path") or a["name"]), str(a["sha256"])] for a in artifacts)


def manifest_bytes(pairs: list[list[str]]) -> bytes:
    return canonical_json(pairs)


def model_id(pairs: list[list[str]]) -> str:
    return hashlib.sha256(manifest_bytes(pairs)).hexdigest()
