"""Batch sizes of a rollout (docs/rollouts.md): ``batchSize`` cuts the
frozen node list into equal chunks; ``batches: [1, "10%", "50%"]`` gives the
size of each successive batch, an integer or a percentage of the frozen node
count (rounded up, at least 1), the last size repeating until every node is
in a batch. The engine, the status checks and the views all cut batches
with ``batch_sizes``, so they agree.

With ``spreadBy: {label, maxPerBatch}`` (docs/capacity.md) batches are
still filled in frozen order, each up to its size, but a batch skips a node
whose label value already has ``maxPerBatch`` nodes in it (nodes without
the label share the value ""); ``spread_numbers`` is that rule, and the
sizes are then what it made. Pure."""

from __future__ import annotations

import heapq
import re
from collections import Counter, deque
from collections.abc import Sequence

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
    entries = tuple(batches) or (batch_size,)
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
    starts = [0]
    for size in batch_sizes(batches, batch_size, count):
        starts.append(starts[-1] + size)
    return tuple(starts)


def batch_numbers(batches: Sequence[int | str], batch_size: int, count: int) -> tuple[int, ...]:
    """The 1-based batch of each of ``count`` nodes, in frozen order."""
    numbers: list[int] = []
    for index, size in enumerate(batch_sizes(batches, batch_size, count), start=1):
        numbers.extend([index] * size)
    return tuple(numbers)


def check_share(value: object, what: str) -> str | None:
    """Why ``value`` is not a count of at least 1 or a percentage from 1%
    to 100% (None: it is one); ``what`` names what it counts."""
    if isinstance(value, int) and not isinstance(value, bool):
        return None if value >= 1 else f"must be at least 1 {what}, got {value}"
    return _percent_problem(value, what)


def check_budget(value: object) -> str | None:
    """Why ``value`` is not a failure budget: a count of 0 or more, or a
    percentage from 0% to 100% (None: it is one)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return None if value >= 0 else f"must be 0 or more failed nodes, got {value}"
    return _percent_problem(value, "failed node", lowest=0)


def _percent_problem(value: object, what: str, lowest: int = 1) -> str | None:
    if isinstance(value, str):
        match = _PERCENT.match(value)
        if match is None:
            return f'must be a whole number of {what}s or a percentage such as "10%", got "{value}"'
        if not lowest <= int(match.group(1)) <= 100:
            return f'a percentage must be from "{lowest}%" to "100%", got "{value}"'
        return None
    return (
        f'must be a whole number of {what}s or a percentage in quotes such as "10%", got {value!r}'
    )


def share_of(entry: int | str, count: int) -> int:
    """``maxPerBatch`` for a label value ``count`` nodes share: the number,
    or the percentage of ``count`` rounded down, at least 1."""
    if isinstance(entry, int):
        return entry
    return max(1, count * int(entry.rstrip("%")) // 100)


def budget_of(entry: int | str, count: int) -> int:
    """Failed nodes a ``failureBudget`` allows among ``count`` frozen nodes:
    the number, or the percentage of ``count`` rounded down."""
    if isinstance(entry, int):
        return entry
    return count * int(entry.rstrip("%")) // 100


def spread_numbers(
    values: Sequence[str],
    batches: Sequence[int | str],
    batch_size: int,
    max_per_batch: int | str,
) -> tuple[int, ...]:
    """The 1-based batch of each node, in frozen order, whose label values
    are ``values``: each batch takes the next nodes in frozen order up to
    its size (``batch_sizes``' entries, the last repeating), skipping those
    whose value is full in it, until it has its size or nothing left fits."""
    count = len(values)
    entries = tuple(batches) or (batch_size,)
    shared = Counter(values)
    caps = {value: share_of(max_per_batch, n) for value, n in shared.items()}
    queues: dict[str, deque[int]] = {}
    for i, value in enumerate(values):
        queues.setdefault(value, deque()).append(i)
    # The first node left of every value, smallest index first: the next
    # node in frozen order among the values not full is on top.
    heads = [(queue[0], value) for value, queue in queues.items()]
    heapq.heapify(heads)
    numbers = [0] * count
    batch = 0
    while heads:
        size = entry_size(entries[min(batch, len(entries) - 1)], count)
        batch += 1
        taken: Counter[str] = Counter()
        full: list[tuple[int, str]] = []  # values full in this batch, back after it
        placed = 0
        while heads and placed < size:
            i, value = heapq.heappop(heads)
            numbers[i] = batch
            placed += 1
            taken[value] += 1
            queue = queues[value]
            queue.popleft()
            if queue:
                head = (queue[0], value)
                if taken[value] < caps[value]:
                    heapq.heappush(heads, head)
                else:
                    full.append(head)
        for head in full:
            heapq.heappush(heads, head)
    return tuple(numbers)


def describe_sizes(sizes: Sequence[int]) -> str:
    """``1, 3, 1`` or, for long lists, ``1, 3, 3, ... 2 (12 batches)``."""
    if len(sizes) <= 8:
        return ", ".join(str(s) for s in sizes)
    head = ", ".join(str(s) for s in sizes[:6])
    return f"{head}, ... {sizes[-1]} ({len(sizes)} batches)"
