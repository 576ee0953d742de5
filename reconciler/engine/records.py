"""Copy-on-write for node records: the machinery that keeps stepping a
large rollout cheap, apart from the rules. No rule lives here."""

from __future__ import annotations

from typing import Any

from reconciler.spec.rollout_status import NodeRecord

NODE_FIELDS = frozenset(NodeRecord.__dataclass_fields__)


def evolve(node: NodeRecord, **changes: Any) -> NodeRecord:
    """``dataclasses.replace`` for node records without its per-call field
    introspection, which dominated stepping large rollouts."""
    assert changes.keys() <= NODE_FIELDS, changes.keys() - NODE_FIELDS
    new = object.__new__(NodeRecord)
    new.__dict__.update(node.__dict__)
    new.__dict__.update(changes)
    return new
