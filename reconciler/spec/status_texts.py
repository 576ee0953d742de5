"""The bytes of status files, as ``dump_yaml`` writes their plain data, with
each node record's text kept from the file's last write.

A pass between two batches of a 100-node rollout changes ten node records
and writes the status file again: writing the other ninety again cost
more than the rest of the file. A kept text is used only for the very
record it was written from (frozen; the engine hands unchanged records on
as they were, and the status reader hands back what was written); tests
pin the bytes against ``dump_yaml`` of the whole file.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from reconciler.spec.rollout_status import NodeRecord, RolloutStatus, page_nodes
from reconciler.spec.safe_yaml import dump_yaml, dump_yaml_entries, entry_text

# Node texts kept, over the files written last (least recently written
# dropped first): a few hundred bytes each.
KEPT_NODES = 10_000


class StatusTexts:
    """Status files' bytes, node texts kept by file path and node name."""

    def __init__(self, kept_nodes: int = KEPT_NODES) -> None:
        self._kept_nodes = kept_nodes
        self._count = 0
        # path -> node name -> (the record, its entry text)
        self._files: OrderedDict[str, dict[str, tuple[NodeRecord, str | None]]] = OrderedDict()

    def write(self, status: RolloutStatus, path: str, data: Mapping[str, Any]) -> bytes:
        """``dump_yaml(data)`` for ``data``, one file of ``status`` (its main
        file or a node page, as ``rollout_status.changed_files`` gives them)."""
        records = data.get("nodes")
        if not records:
            return dump_yaml(data)
        page = data.get("page")
        nodes = status.nodes if page is None else page_nodes(status.nodes, page)
        if len(nodes) != len(records):
            return dump_yaml(data)
        kept = self._files.pop(path, None) or {}
        fresh: dict[str, tuple[NodeRecord, str | None]] = {}
        entries: list[str | None] = []
        for node, record in zip(nodes, records, strict=True):
            known = kept.get(node.name)
            text = known[1] if known is not None and known[0] is node else entry_text(record)
            fresh[node.name] = (node, text)
            entries.append(text)
        self._count += len(fresh) - len(kept)
        self._files[path] = fresh
        while self._count > self._kept_nodes and len(self._files) > 1:
            _, dropped = self._files.popitem(last=False)
            self._count -= len(dropped)
        return dump_yaml_entries(data, "nodes", entries)


__all__ = ["KEPT_NODES", "StatusTexts"]
