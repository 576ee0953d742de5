"""``status/README.md``: the dashboard the daemon commits next to the status
files, so the forge's file view of ``status/`` shows the fleet at a glance.

One table row per rollout (phase, progress bar, current batch, hold), a list
of what needs a person (holds, pending rollouts only a person can unblock,
conditions), and a Mermaid flowchart of the active rollouts' batches
coloured by state. Consecutive batches in the same state are drawn as one
box, so a rollout of 10,000 batches is still a handful of boxes. Between
them, the decided comparisons of the active rollouts' current batches
(``dashboard_comparisons``).

Text that comes from agents and people (errors inside hold messages,
condition messages) goes through ``markdown.text``: it renders as text,
never as a link, emphasis, code or HTML.

Deterministic: the text depends only on the statuses given (no clock, no
environment, no dict order), so the daemon can compare bytes and write the
file only when a status changed. Must not read Git, files or the clock.
"""

from __future__ import annotations

import re
import zlib
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

from reconciler.spec.batch_shapes import describe_sizes
from reconciler.spec.paths import DASHBOARD_PATH
from reconciler.spec.rollout_status import (
    NodeRecord,
    OperatorAct,
    RolloutStatus,
    recorded_sizes,
)
from reconciler.text import artifact_text, markdown
from reconciler.text.dashboard_comparisons import ALERT_WAITS, alert_wait_line, comparison_section
from reconciler.text.dashboard_evals import eval_section
from reconciler.text.health_text import failing_summary
from reconciler.text.status_text import (
    PHASE_ORDER,
    batch_groups,
    batch_text,
    ordered,
    progress_text,
    rollback_text,
    summarize,
    waiting_text,
)

PATH = DASHBOARD_PATH

_PHASE_ICONS = {
    "paused": "⏸️",
    "running": "▶️",
    "scheduled": "🕒",
    "pending": "⏳",
    "completed": "✅",
    "failed": "❌",
    "aborted": "⛔",
}

# A held rollout's icon says why it is held: a planned pause is not a failure.
# Reasons not listed here show the phase's icon.
_HOLD_ICONS = {
    "operator_paused": "⏸️",
    "pause_after_batch": "⏸️",
    "health_failed": "🛑",
    "retry_exhausted": "🛑",
    "stopped": "🛑",
    "rollback_failed": "🛑",
    "rollback_unavailable": "🛑",
    "dispatch_refused": "🛑",
    "failure_budget_exceeded": "🛑",
    "health_unknown": "❓",
    "rollback_pending": "⏪",
    "rolled_back": "⏪",
}

# The conditions a rollout's step still keeps up to date once it has ended
# (restores and rollback requests go on after the end); a terminal
# rollout's other conditions describe a rollout that no longer acts, and
# are not listed for a person.
_TERMINAL_CONDITIONS = frozenset({"rollback_refused", "unverified_evidence"})

# An ended rollout whose nodes a restore put back, is putting back or
# failed to shows this icon, not its phase's.
_ROLLED_BACK_ICON = "⏪"

# Pending reasons that go away by themselves (another rollout ends, the
# operator's own pause); every other pending reason (no nodes, invalid file,
# unknown nodes, unverified, waiting for approval) needs a person.
_PENDING_BY_ITSELF = frozenset({"overlap", "paused"})

# Mermaid classes, one per batch state as drawn.
_CLASSES = (
    ("done", "fill:#dafbe1,stroke:#1a7f37,color:#1a7f37"),
    ("running", "fill:#ddf4ff,stroke:#0969da,color:#0969da"),
    ("held", "fill:#fff8c5,stroke:#9a6700,color:#7d4e00"),
    ("failed", "fill:#ffebe9,stroke:#cf222e,color:#a40e26"),
    ("unknown", "fill:#fbefff,stroke:#8250df,color:#6639ba"),
    ("pending", "fill:#f6f8fa,stroke:#8c959f,color:#57606a"),
)

# Subgraphs (one per rollout) are neutral: only the batches carry state colours.
_SUBGRAPH_STYLE = "fill:#ffffff,stroke:#d0d7de,color:#24292f"

_NAME_SHOWN = 40  # link text of a rollout's row; the link target is the whole name
_CONDITION_LIMIT = 300
_NBSP = "\u00a0"  # keeps a bar with its count, and a date on one line
# How a refusal for missing approvals reads (``git.approval_notes.Approvals.summary``,
# and ``RuleCount.summary`` for an approval rule, which it names).
_APPROVAL_MISSING = re.compile(
    r"\bneeds \d+ approvals? (?:besides \S.*?'s)?; has \d+|\bneeds \d+ of [a-z0-9-]+ \("
)
_RULE_MISSING = re.compile(r"\bneeds \d+ of ([a-z0-9-]+) \(")


def waits_for_approval(status: RolloutStatus) -> bool:
    """Is the rollout held back only for reviewers' approvals (docs/trust.md)?"""
    condition = status.condition("unverified")
    return (
        status.phase == "pending"
        and condition is not None
        and bool(_APPROVAL_MISSING.search(condition.message))
    )


def approval_wait(status: RolloutStatus) -> str:
    """``waiting for approval``, naming the approval rules still short
    (``waiting for approval of serving-owners``)."""
    condition = status.condition("unverified")
    rules = _RULE_MISSING.findall(condition.message) if condition is not None else []
    names = ", ".join(dict.fromkeys(rules))
    return f"waiting for approval of {names}" if names else "waiting for approval"


@dataclass(frozen=True)
class DashboardParts:
    """The dashboard's text as ``head``, the table's rows in ``blocks``
    (UTF-8, each row led by its newline) and ``tail``. The blocks of a
    ``DashboardOrder`` recur from call to call (the same objects) while
    their rows do not change, so the daemon writes the text without
    encoding it whole, and the store compresses only the blocks that are
    new (``GitStore.commit(pieces=)``). A block never ends in a newline."""

    head: str
    blocks: tuple[bytes, ...]
    tail: str

    def text(self) -> str:
        return self.head + b"".join(self.blocks).decode() + self.tail

    def pieces(self) -> tuple[bytes, ...]:
        """The UTF-8 text in pieces, the blocks among them."""
        return (self.head.encode(), *self.blocks, self.tail.encode())

    def extended(self, more: str) -> DashboardParts:
        """The parts of ``self.text().rstrip("\n") + more``: with blocks,
        the stripping ends in the tail (a block ends in a row)."""
        if not self.blocks:
            return DashboardParts("", (), (self.head + self.tail).rstrip("\n") + more)
        return DashboardParts(self.head, self.blocks, self.tail.rstrip("\n") + more)


def render_dashboard(
    statuses: Mapping[str, RolloutStatus],
    order: DashboardOrder | None = None,
    changed: Iterable[str] | None = None,
) -> str:
    """The Markdown text of ``status/README.md`` for these statuses.
    ``order``: the rollouts' rows kept in order from the last call by the
    same caller (the daemon keeps one), which only speeds the call up;
    ``changed``: with it, the only rollouts whose status may differ from
    that call's (see ``DashboardOrder.update``)."""
    return dashboard_parts(statuses, order, changed).text()


def dashboard_parts(
    statuses: Mapping[str, RolloutStatus],
    order: DashboardOrder | None = None,
    changed: Iterable[str] | None = None,
) -> DashboardParts:
    """``render_dashboard``'s text in parts (see ``DashboardParts``): with
    ``order``, the rows in its blocks; without, all of it in the tail."""
    out = [
        "# Rollouts",
        "",
        "<!-- Written by the reconciler daemon from the status files in this folder. "
        "Edits are overwritten. -->",
        "",
    ]
    if not statuses:
        out += ["No rollouts yet: add a file under `rollouts/` to start one.", ""]
        return DashboardParts("", (), "\n".join(out))
    after: list[str] = []
    if order is not None and order.update(statuses, changed):
        out += [order.counts_line(), "", *_TABLE_HEAD]
        blocks = order.blocks()
        attention = order.attention()
        active = order.active(statuses)
    else:
        rollouts = ordered(statuses)
        out += [_counts(rollouts), ""]
        out += _table(rollouts)
        blocks = ()
        attention = _attention(rollouts)
        active = [s for s in rollouts if _is_drawn(s)]
    if attention:
        after += ["", "## Needs attention", "", *attention]
    after += comparison_section(active)
    after += eval_section(active)
    if active:
        after += ["", "## Active rollouts", "", *_diagram(active)]
    if not blocks:
        return DashboardParts("", (), "\n".join([*out, *after]) + "\n")
    # "\n".join(head, rows, after) + "\n", with each row's newline in its block
    tail = "".join(f"\n{line}" for line in after) + "\n"
    return DashboardParts("\n".join(out), blocks, tail)


def _is_drawn(status: RolloutStatus) -> bool:
    """Is the rollout in the diagram of active rollouts?"""
    return status.phase in ("running", "paused") and bool(status.batches)


_TABLE_HEAD = (
    "| Rollout | Phase | Progress | Batch | Hold / reason | Since |",
    "|---|---|---|---|---|---|",
)


def _counts(rollouts: list[RolloutStatus]) -> str:
    by_phase: dict[str, int] = {}
    for s in rollouts:
        by_phase[s.phase] = by_phase.get(s.phase, 0) + 1
    parts = [f"{n} {phase}" for phase, n in by_phase.items()]
    noun = "rollout" if len(rollouts) == 1 else "rollouts"
    return f"{len(rollouts)} {noun}: " + ", ".join(parts) + "."


def _table(rollouts: list[RolloutStatus]) -> list[str]:
    return [*_TABLE_HEAD, *map(_row, rollouts)]


def _row(status: RolloutStatus) -> str:
    s = summarize(status)
    since = s.since.strftime("%Y-%m-%d %H:%MZ").replace(" ", _NBSP) if s.since else ""
    why = f"`{s.why}`" if s.why else ""  # a reason code or a date: ours
    waiting = status.waiting
    if waiting is not None and waiting.reason in ALERT_WAITS and s.why == waiting_text(waiting):
        why = f"`{waiting.reason}`"  # the alerts' names, from Alertmanager, are listed below
    if waits_for_approval(status):
        why = f"⏳ {markdown.text(approval_wait(status))}"
    else:
        act = _operator_act(status)
        if act is not None:  # a person's name: escaped like any text from people
            who = act.author.split(" <", 1)[0] or act.author
            why += f" by {markdown.text(markdown.clip(who, _NAME_SHOWN))}"
    mode = ""
    if status.frozen is not None:
        mode = " · live" if status.frozen.live else " · dry-run"
    name = markdown.text(markdown.clip(s.name, _NAME_SHOWN))
    progress = progress_text(s).replace(" ", _NBSP)
    return (
        f"| [{name}]({quote(s.name)}.yaml) | {_icon(status)} {s.phase}{mode} | `{progress}` "
        f"| {batch_text(s)} | {why} | {since} |"
    )


def _operator_act(status: RolloutStatus) -> OperatorAct | None:
    """Who paused the rollout (while paused, before start too) or aborted it."""
    if status.paused_by is not None and (status.operator_paused or not status.started):
        return status.paused_by
    return status.aborted_by if status.phase == "aborted" else None


def _icon(status: RolloutStatus) -> str:
    if status.hold is not None and status.hold.reason in _HOLD_ICONS:
        return _HOLD_ICONS[status.hold.reason]
    if status.terminal and rollback_text(status):
        return _ROLLED_BACK_ICON
    return _PHASE_ICONS.get(status.phase, "")


def _attention(rollouts: list[RolloutStatus]) -> list[str]:
    return [line for status in rollouts for line in _notes_of(status)]


def _notes_of(status: RolloutStatus) -> tuple[str, ...]:
    conditions = status.conditions
    if status.terminal:
        conditions = tuple(c for c in conditions if c.type in _TERMINAL_CONDITIONS)
    wait = alert_wait_line(status)
    if status.hold is None and not conditions and status.phase != "pending" and not wait:
        return ()
    lines: list[str] = [wait] if wait else []
    name = markdown.text(status.name)
    if status.hold is not None:
        # The message names the held nodes and ends with what to do; the
        # engine has already clipped the agent's error inside it.
        hold = status.hold
        failing = failing_summary(status)
        lines.append(
            f"- {_icon(status)} **{name}** `{hold.reason}`: {_sentence(hold.message)}"
            + (f" {_sentence(failing[0].upper() + failing[1:])}" if failing else "")
        )
    elif (
        status.phase == "pending"
        and status.reason not in _PENDING_BY_ITSELF
        and status.condition(status.reason) is None  # a condition below says it
    ):
        why = status.message or status.reason or "waiting"
        lines.append(f"- {_icon(status)} **{name}** pending `{status.reason}`: {_sentence(why)}")
    for condition in conditions:
        message = markdown.clip(condition.message, _CONDITION_LIMIT)
        if condition.type == "unverified" and waits_for_approval(status):
            wait = markdown.text(approval_wait(status))
            lines.append(f"- ⏳ **{name}** {wait}: {_sentence(message)}")
            continue
        lines.append(f"- **{name}** condition `{condition.type}`: {_sentence(message)}")
    return tuple(lines)


class DashboardOrder:
    """The dashboard's rows kept in order from call to call: the daemon
    renders after each status commit, with the same status objects for
    every rollout but the few that changed, which alone are drawn and
    placed again (with their "Needs attention" lines, phase counts and
    diagram membership). The order is total (phase rank, then the unique
    name), so the text is the same as drawing every row (tests pin it)."""

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self._last: dict[str, RolloutStatus] = {}
        self._keys: list[tuple[int, str]] = []
        self.rows: list[str] = []  # table rows, in the order of _keys
        self._notes: dict[tuple[int, str], tuple[str, ...]] = {}  # only those with lines
        self._drawn: set[tuple[int, str]] = set()  # in the diagram
        self._counts: dict[str, int] = {}
        self._encoded: list[bytes] = []  # "\n" + row, UTF-8, in the order of _keys
        self._cuts: list[tuple[int, str]] = []  # the keys of the rows that end a block
        self._blocks: dict[tuple[bytes, ...], bytes] = {}  # the last call's blocks

    def update(
        self, statuses: Mapping[str, RolloutStatus], names: Iterable[str] | None = None
    ) -> bool:
        """Bring the rows up to ``statuses``; False when this cannot be
        done (a phase outside the known order), and then nothing is kept.
        ``names``: the only rollouts whose status may differ from the last
        call's (the same object otherwise), so the others are not looked at."""
        last = self._last
        if names is not None and last:
            names = set(names)
            for name in [n for n in names if n in last and n not in statuses]:
                self._remove(_order_key(last.pop(name)))
            changed = [n for n in names if n in statuses and last.get(n) is not statuses[n]]
        else:
            changed = [name for name, status in statuses.items() if last.get(name) is not status]
        added = sum(1 for name in changed if name not in last)
        if any(statuses[name].phase not in _RANK for name in changed):
            self._clear()
            return False
        if len(last) + added != len(statuses) or len(changed) > 64:
            self._rebuild(statuses)
            return True
        for name in changed:
            old = last.get(name)
            if old is not None:
                self._remove(_order_key(old))
            self._insert(statuses[name])
            last[name] = statuses[name]
        return True

    def place(self, statuses: Mapping[str, RolloutStatus]) -> list[RolloutStatus]:
        """The statuses in the dashboard's order (``status_text.ordered``)."""
        if not self.update(statuses):
            return ordered(statuses)
        return [statuses[name] for _, name in self._keys]

    def counts_line(self) -> str:
        parts = [
            f"{self._counts[phase]} {phase}" for phase in PHASE_ORDER if self._counts.get(phase)
        ]
        total = len(self._keys)
        noun = "rollout" if total == 1 else "rollouts"
        return f"{total} {noun}: " + ", ".join(parts) + "."

    def blocks(self) -> tuple[bytes, ...]:
        """The encoded rows in blocks: a block ends after a row whose name
        is a cut (about one in ``_BLOCK_ROWS``, by a checksum of the name),
        so a row added, changed or removed changes its own block only, and
        the others are the objects the last call returned."""
        kept, self._blocks = self._blocks, {}
        found: list[bytes] = []
        start = 0
        ends = [bisect_right(self._keys, cut) for cut in self._cuts]
        for end in (*ends, len(self._encoded)):
            if end > start:
                rows = tuple(self._encoded[start:end])
                block = kept.get(rows)
                if block is None:
                    block = b"".join(rows)
                self._blocks[rows] = block
                found.append(block)
            start = end
        return tuple(found)

    def attention(self) -> list[str]:
        return [line for key in sorted(self._notes) for line in self._notes[key]]

    def active(self, statuses: Mapping[str, RolloutStatus]) -> list[RolloutStatus]:
        return [statuses[name] for _, name in sorted(self._drawn)]

    def _rebuild(self, statuses: Mapping[str, RolloutStatus]) -> None:
        self._clear()
        result = ordered(statuses)
        self._last = dict(statuses)
        self._keys = [_order_key(s) for s in result]
        self.rows = _table(result)[len(_TABLE_HEAD) :]
        self._encoded = [f"\n{row}".encode() for row in self.rows]
        self._cuts = [key for key in self._keys if _is_cut(key)]
        for key, status in zip(self._keys, result, strict=True):
            self._note(key, status)

    def _note(self, key: tuple[int, str], status: RolloutStatus) -> None:
        self._counts[status.phase] = self._counts.get(status.phase, 0) + 1
        notes = _notes_of(status)
        if notes:
            self._notes[key] = notes
        if _is_drawn(status):
            self._drawn.add(key)

    def _remove(self, key: tuple[int, str]) -> None:
        at = bisect_left(self._keys, key)
        del self._keys[at]
        del self.rows[at]
        del self._encoded[at]
        if _is_cut(key):
            self._cuts.remove(key)
        phase = PHASE_ORDER[key[0]]
        self._counts[phase] -= 1
        self._notes.pop(key, None)
        self._drawn.discard(key)

    def _insert(self, status: RolloutStatus) -> None:
        key = _order_key(status)
        at = bisect_left(self._keys, key)
        self._keys.insert(at, key)
        row = _row(status)
        self.rows.insert(at, row)
        self._encoded.insert(at, f"\n{row}".encode())
        if _is_cut(key):
            insort(self._cuts, key)
        self._note(key, status)


_RANK = {phase: i for i, phase in enumerate(PHASE_ORDER)}


def _order_key(status: RolloutStatus) -> tuple[int, str]:
    return (_RANK.get(status.phase, len(_RANK)), status.name)


_BLOCK_ROWS = 64  # rows in a block of the table, on average (DashboardOrder.blocks)


def _is_cut(key: tuple[int, str]) -> bool:
    """Does this row end a block? By its name only, the same in every process."""
    return zlib.crc32(key[1].encode()) % _BLOCK_ROWS == 0


def _nodes_by_batch(status: RolloutStatus) -> dict[int, list[NodeRecord]]:
    """Node records by batch: one read of the nodes for all of a diagram's groups."""
    found: dict[int, list[NodeRecord]] = {}
    for node in status.nodes:
        found.setdefault(node.batch, []).append(node)
    return found


def _diagram(active: list[RolloutStatus]) -> list[str]:
    # Top to bottom in the table's order: an invisible link between
    # consecutive rollouts fixes the order (side by side, separate
    # subgraphs would be stacked in reverse); batches run left to right.
    lines = ["```mermaid", "flowchart TB"]
    for i, status in enumerate(active, start=1):
        rid = f"r{i}"
        title = f"{status.name}: {status.phase}"
        if status.hold is not None:
            title += f" ({status.hold.reason})"
        lines.append(f'  subgraph {rid}["{_label(title)}"]')
        lines.append("    direction LR")
        groups = batch_groups(status)
        ids = [f"{rid}b{group.first}" for group in groups]
        sizes = _sizes(status)
        by_batch = _nodes_by_batch(status)
        for group, bid in zip(groups, ids, strict=True):
            which = (
                f"batch {group.first}"
                if group.first == group.last
                else f"batches {group.first}-{group.last}"
            )
            failed = f" · ✗{group.trouble} failed" if group.trouble else ""
            failed += f" · ?{group.unknown} unknown" if group.unknown else ""
            label = f"{which}<br/>{group.ok}/{group.total} ok{failed} · {group.state}"
            if sizes:
                label = f"{which} · {_group_sizes(sizes, group.first, group.last)}<br/>" + (
                    f"{group.ok}/{group.total} ok{failed} · {group.state}"
                )
            staged = artifact_text.batch_words(
                n for b in range(group.first, group.last + 1) for n in by_batch.get(b, ())
            )
            label += f"<br/>{_label(staged)}" if staged else ""
            lines.append(f'    {bid}["{label}"]:::{group.state}')
        if len(ids) > 1:
            lines.append("    " + " --> ".join(ids))
        lines.append("  end")
    rids = [f"r{i}" for i in range(1, len(active) + 1)]
    if len(rids) > 1:
        lines.append("  " + " ~~~ ".join(rids))
    for rid in rids:
        lines.append(f"  style {rid} {_SUBGRAPH_STYLE}")
    for name, style in _CLASSES:
        lines.append(f"  classDef {name} {style}")
    lines.append("```")
    return lines


def _sizes(status: RolloutStatus) -> tuple[int, ...]:
    """Batch sizes of a rollout cut by ``batches`` or spread by ``spreadBy``
    (empty for a plain ``batchSize``, whose boxes keep their version 1 labels)."""
    frozen = status.frozen
    if frozen is None or (not frozen.batches and frozen.spread_by is None):
        return ()
    return recorded_sizes(frozen, status.nodes)


def _group_sizes(sizes: tuple[int, ...], first: int, last: int) -> str:
    chunk = sizes[first - 1 : last]
    if len(chunk) == 1:
        return f"{chunk[0]} node{'s' if chunk[0] != 1 else ''}"
    if len(set(chunk)) == 1:
        return f"{chunk[0]} nodes each"
    return "sizes " + describe_sizes(chunk)


def _label(text: str) -> str:
    """Text safe inside a quoted Mermaid label."""
    return text.replace('"', "#quot;").replace("<", "&lt;").replace(">", "&gt;")


def _sentence(text: str) -> str:
    """Untrusted text as one Markdown sentence: escaped, one line, with a full stop."""
    text = markdown.text(text)
    return text if not text or text[-1] in ".!?…" else text + "."
