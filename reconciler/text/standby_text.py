"""Words about a warm standby (docs/rollouts.md#warm-standby): what a
rollout's ``standby`` keeps, each node's kept slot and its release, and a
batch's count of them. Pure text from values; must not read status files."""

from __future__ import annotations

from collections.abc import Iterable

from reconciler.spec.rollout_status import NodeRecord
from reconciler.spec.times import format_time

_KEEPS = {
    "untilSoaked": "until each node passes",
    "untilCompleted": "until the rollout ends",
}


def standby_words(keep_previous: str | None) -> str:
    """``standby: the previous slot stays warm until each node passes (untilSoaked)``."""
    if keep_previous is None:
        return ""
    until = _KEEPS.get(keep_previous, keep_previous)
    return (
        f"standby: each node switches slots with no time out of service; the previous slot "
        f"stays warm {until} ({keep_previous}), then a release job stops it"
    )


def node_words(node: NodeRecord) -> str:
    """``slot a kept warm`` / ``slot a release sent`` / ``slot a released at ...``
    / ``slot a: release failed: ...``; "" without a kept slot."""
    standby = node.standby
    if standby is None:
        return ""
    words = f"slot {standby.slot}"
    if standby.released_at is not None:
        words += f" released at {format_time(standby.released_at)}"
    elif standby.release_error:
        words += f": {standby.release_error}"
    elif standby.release_job_id is not None:
        words += " release sent"
    else:
        words += " kept warm"
    return words


def batch_words(nodes: Iterable[NodeRecord]) -> str:
    """``slots: 1 kept warm, 2 released``; "" when no node kept one."""
    counts = {"kept warm": 0, "releasing": 0, "released": 0, "release failed": 0}
    for node in nodes:
        s = node.standby
        if s is None:
            continue
        if s.released_at is not None:
            counts["released"] += 1
        elif s.release_error:
            counts["release failed"] += 1
        elif s.release_job_id is not None:
            counts["releasing"] += 1
        else:
            counts["kept warm"] += 1
    shown = ", ".join(f"{n} {what}" for what, n in counts.items() if n)
    return f"slots: {shown}" if shown else ""
