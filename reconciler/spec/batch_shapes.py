"""Batch sizes of a rollout (docs/rollouts.md): ``batchSize`` cuts the
frozen node list into equal chunks; ``batches: [1, "10%", "50%"]`` gives the
size of each successive batch, an integer or a percentage of the frozen node
count (rounded up, at least 1), the last size repeating until every node is
in a batch. The engine, the status checks and the views all cut batches
with ``batch_sizes``, so they agree. Pure."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

_PERCENT = re.compile(r"^([0-9]{1,3})%$")


def check_batch_entry(value: object) -> str | None:
    """Why ``value`` is not a batch size (None: it is one)."""
    if isinstance(value, bool | float):
        return (
            f'must be a whole number of nodes or a percentage in quotes such as "10%", '
            f"got {value!r}"
        )
    if isinstance(value, int):
        return None if value >= 1 else f"must be at least 1 node, got {value}"
    if isinstance(value, str):
        match = _PERCENT.match(value)
        if match is None:
            return f'must be a whole number of nodes or a percentage such as "10%", got "{value}"'
        percent = int(match.group(1))
        if not 1 <= percent <= 100:
            return f'a percentage must be from "1%" to "100%", got "{value}"'
        return None
    return f'must be a whole number of nodes or a percentage such as "10%", got {value!r}'


def entry_size(entry: int | str, count: int) -> int:
    """Nodes in a batch of size ``entry`` out of ``count`` frozen nodes."""
    if isinstance(entry, int):
        return entry
    percent = int(entry.rstrip("%"))
    return max(1, -(-count * percent // 100))


def batch_sizes(batches: Sequence[int | str], batch_size: int, count: int) -> tuple[int, ...]:
    """The size of every batch of ``count`` nodes; the last may be smaller."""
    return _sizes(tuple(batches), batch_size, count)


@lru_cache(maxsize=4096)
def _sizes(batches: tuple[int | str, ...], batch_size: int, count: int) -> tuple[int, ...]:
    entries = batches or (batch_size,)
    sizes: list[int] = []
    placed = 0
    k = 0
    while placed < count:
        size = entry_size(entries[min(k, len(entries) - 1)], count)
        size = min(size, count - placed)
        sizes.append(size)
        placed += size
        k += 1
    return tuple(sizes)


def batch_starts(batches: Sequence[int | str], batch_size: int, count: int) -> tuple[int, ...]:
    """Index of each batch's first node, plus ``count`` at the end."""
    return _starts(tuple(batches), batch_size, count)


@lru_cache(maxsize=4096)
def _starts(batches: tuple[int | str, ...], batch_size: int, count: int) -> tuple[int, ...]:
    starts = [0]
    for size in _sizes(batches, batch_size, count):
        starts.append(starts[-1] + size)
    return tuple(starts)


def batch_numbers(batches: Sequence[int | str], batch_size: int, count: int) -> tuple[int, ...]:
    """The 1-based batch of each of ``count`` nodes, in frozen order."""
    numbers: list[int] = []
    for index, size in enumerate(batch_sizes(batches, batch_size, count), start=1):
        numbers.extend([index] * size)
    return tuple(numbers)


def describe_sizes(sizes: Sequence[int]) -> str:
    """``1, 3, 1`` or, for long lists, ``1, 3, 3, ... 2 (12 batches)``."""
    if len(sizes) <= 8:
        return ", ".join(str(s) for s in sizes)
    head = ", ".join(str(s) for s in sizes[:6])
    return f"{head}, ... {sizes[-1]} ({len(sizes)} batches)"
