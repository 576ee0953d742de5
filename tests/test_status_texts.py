"""Status files written with node texts kept from their last write: byte for
byte ``dump_yaml`` of the same data, whatever changed in between."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from reconciler.spec import status_texts
from reconciler.spec.rollout_status import (
    PAGE_SIZE,
    CheckOutcome,
    NodeEvidence,
    NodeRecord,
    RolloutStatus,
    changed_files,
)
from reconciler.spec.safe_yaml import dump_yaml
from reconciler.spec.status_texts import StatusTexts

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def done(node: NodeRecord, **changes: Any) -> NodeRecord:
    return replace(
        node,
        state="succeeded",
        attempt=1,
        job_id=f"{node.name}-job",
        source_commit="a" * 40,
        dispatched_at=T0,
        deadline=T0 + timedelta(minutes=5),
        finished_at=T0 + timedelta(seconds=3),
        checks=(CheckOutcome("probe", True, "exit 0"),),
        **changes,
    )


def rollout(count: int) -> RolloutStatus:
    nodes = tuple(NodeRecord(name=f"node-{i:03d}", batch=i // 10 + 1) for i in range(count))
    return RolloutStatus(name="web", phase="running", nodes=nodes, spec_commit="b" * 40)


def written(texts: StatusTexts, old: RolloutStatus | None, new: RolloutStatus) -> dict[str, bytes]:
    """Each changed file, written both ways: they must agree."""
    files, _ = changed_files(old, new)
    out = {}
    for path, data in files.items():
        out[path] = texts.write(new, path, data)
        assert out[path] == dump_yaml(data), path
    return out


def batches(status: RolloutStatus, size: int = 10) -> list[RolloutStatus]:
    """The status after each batch of ``size`` nodes succeeded, in turn."""
    steps = []
    for start in range(0, len(status.nodes), size):
        nodes = list(status.nodes)
        for i in range(start, min(start + size, len(nodes))):
            nodes[i] = done(nodes[i])
        status = replace(status, nodes=tuple(nodes))
        steps.append(status)
    return steps


@pytest.mark.parametrize("count", [1, 100, PAGE_SIZE + 50])
def test_every_write_of_a_rollout_is_what_dump_yaml_writes(count: int) -> None:
    texts = StatusTexts()
    old = None
    for new in batches(rollout(count), size=37):
        written(texts, old, new)
        old = new


def test_records_the_fast_writer_leaves_to_the_emitter_are_written_by_it() -> None:
    texts = StatusTexts()
    first = rollout(20)
    written(texts, None, first)
    nodes = list(first.nodes)
    nodes[3] = done(nodes[3], error="line one\nline two")  # a literal block
    nodes[4] = done(
        nodes[4],
        evidence=NodeEvidence("SHA256:k", {"state": "succeeded", "ratio": 0.5}, "c2ln"),
    )
    second = replace(first, nodes=tuple(nodes))
    written(texts, first, second)
    third = replace(second, nodes=(*second.nodes[:3], *second.nodes[5:]))  # two gone
    written(texts, second, third)


def test_an_equal_record_that_is_another_object_is_written_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only the very record a text was written from reuses it; the others,
    # and only those, are written again.
    written_items: list[Any] = []
    real = status_texts.entry_text

    def counted(item: Any) -> str | None:
        written_items.append(item["name"])
        return real(item)

    monkeypatch.setattr(status_texts, "entry_text", counted)
    texts = StatusTexts()
    first, second = batches(rollout(30))[:2]
    written(texts, None, first)
    assert len(written_items) == 30
    written_items.clear()
    copy = replace(second.nodes[25])  # equal, not the same object
    third = replace(second, nodes=(*second.nodes[:25], copy, *second.nodes[26:]))
    written(texts, first, third)
    assert written_items == [f"node-{i:03d}" for i in range(10, 20)] + ["node-025"]


def test_the_texts_kept_are_bounded() -> None:
    texts = StatusTexts(kept_nodes=50)
    for name in ("a", "b", "c"):
        status = replace(rollout(30), name=name)
        written(texts, None, status)
    assert sum(len(kept) for kept in texts._files.values()) <= 50
    assert list(texts._files) == ["status/c.yaml"]
