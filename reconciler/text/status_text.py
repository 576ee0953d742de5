"""Rollout status for people: one line per rollout, or one rollout in full,
as terminal text (80 columns, colour only when asked) or JSON.

The facts shown (progress, current batch, what holds it) are computed here
once, in ``summarize``, so the terminal view and the Markdown dashboard say
the same thing. ``now`` is an argument: the caller reads the clock, and only
ages ("5m ago") depend on it.

Must not: read Git or files, or decide anything about a rollout.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from reconciler.spec.batch_shapes import budget_of, describe_sizes
from reconciler.spec.durations import format_duration
from reconciler.spec.rollout_status import (
    FrozenSpec,
    NodeRecord,
    RolloutStatus,
    Waiting,
    count_progress,
    recorded_sizes,
    to_record,
)
from reconciler.spec.times import format_time
from reconciler.text import artifact_text, standby_text
from reconciler.text.eval_text import baseline_answers, baseline_lines, eval_lines
from reconciler.text.health_text import comparison_lines, failing_checks, health_lines

WIDTH = 80
BAR_WIDTH = 10

# Node states that will not move on without a person, or ended badly.
TROUBLE_STATES = frozenset(
    {"failed", "timed_out", "unknown", "stopped", "rollback_failed", "rollback_pending"}
)
# Of those, the one that is no verdict at all: shown apart ("?1"), never as failed.
UNKNOWN = "unknown"
# Node states a restore left or is leaving, by what a view says of them.
RESTORE_WORDS = (
    ("rolled_back", "rolled back"),
    ("restoring", "restoring"),
    ("rollback_failed", "rollback failed on"),
)
ROLLBACK_NAMES_SHOWN = 3
# Attention order: what needs a person first, what is finished last.
PHASE_ORDER = ("paused", "running", "scheduled", "pending", "failed", "aborted", "completed")

_COLOURS = {
    "running": "34",  # blue
    "paused": "33",  # yellow
    "scheduled": "36",  # cyan
    "pending": "2",  # dim
    "completed": "32",  # green
    "failed": "31",  # red
    "aborted": "35",  # magenta
    "succeeded": "32",
    "passed": "32",
    "dispatched": "34",
    "restoring": "34",
    "rolled_back": "36",
    "skipped": "2",
    "timed_out": "31",
    "unknown": "31",
    "stopped": "31",
    "rollback_failed": "31",
    "rollback_pending": "33",
    "done": "32",
    "held": "33",
}


@dataclass(frozen=True)
class Summary:
    """What one row says about a rollout."""

    name: str
    phase: str
    done: int  # nodes that succeeded
    total: int
    trouble: int  # nodes in TROUBLE_STATES but unknown: failed
    unknown: int  # nodes whose verdict is unknown
    batch: int | None  # the batch in progress (or next), 1-based; None when none
    batch_count: int
    why: str  # hold reason, else the phase's reason (why pending, why it ended)
    message: str  # the hold's or the phase's message
    since: datetime | None  # last phase change


def summarize(status: RolloutStatus) -> Summary:
    done = sum(1 for n in status.nodes if n.state == "succeeded")
    unknown = sum(1 for n in status.nodes if n.state == UNKNOWN)
    trouble = sum(1 for n in status.nodes if n.state in TROUBLE_STATES) - unknown
    return Summary(
        name=status.name,
        phase=status.phase,
        done=done,
        total=len(status.nodes),
        trouble=trouble,
        unknown=unknown,
        batch=current_batch(status),
        batch_count=len(status.batches),
        why=_why(status),
        message=status.hold.message if status.hold else status.message,
        since=last_change(status),
    )


def _why(status: RolloutStatus) -> str:
    restored = rollback_text(status) if status.terminal else ""
    if restored:
        return f"{status.reason}; {restored}" if status.reason else restored
    if status.hold is not None:
        if status.hold.until is not None:
            return f"{status.hold.reason} until {status.hold.until.strftime('%Y-%m-%d %H:%MZ')}"
        return status.hold.reason
    if status.waiting is not None:
        return waiting_text(status.waiting)
    if status.phase == "scheduled" and status.scheduled_for is not None:
        return "starts " + status.scheduled_for.strftime("%Y-%m-%d %H:%MZ")
    return status.reason


def rollback_text(status: RolloutStatus, shown: int = ROLLBACK_NAMES_SHOWN) -> str:
    """``rolled back gpu-a1, gpu-a2``: the nodes a restore put back, is
    putting back or failed to (the first ``shown`` of each, and how many
    more); "" when there are none."""
    parts = []
    for state, words in RESTORE_WORDS:
        names = [n.name for n in status.nodes if n.state == state]
        if names:
            more = f" and {len(names) - shown} more" if len(names) > shown else ""
            parts.append(f"{words} {', '.join(names[:shown])}{more}")
    return "; ".join(parts)


def ended_message(status: RolloutStatus) -> str:
    """The phase's message; for a rollout that ended and was rolled back
    since, what it ended with and what the rollbacks changed, so the counts
    it gives stay true."""
    restored = rollback_text(status, shown=len(status.nodes)) if status.terminal else ""
    if not restored:
        return status.message
    ended = f"{status.message} when it ended" if status.message else "it ended"
    return f"{ended}; since then {restored}"


def waiting_text(waiting: Waiting) -> str:
    """``freeze until 2026-12-27 00:00Z``: why a due batch waits (not a hold);
    ``alert_firing: GpuHot since ...`` for a fleet-wide alert."""
    if waiting.reason == "alert_firing":
        alerts = ", ".join(f"{a.alertname} since {a.starts_at}" for a in waiting.alerts)
        return f"alert_firing: {alerts}; the next batch starts once it resolves"
    if waiting.reason == "alertmanager_unreachable":
        return "alertmanager_unreachable: no new batch until Alertmanager answers"
    until = waiting.until.strftime("%Y-%m-%d %H:%MZ") if waiting.until else "no opening in sight"
    return f"{waiting.reason} until {until}" if waiting.until else f"{waiting.reason}: {until}"


def sizes_text(status: RolloutStatus) -> str:
    """``batches 1, 3, 1`` or ``batchSize 2``: how the frozen nodes are cut."""
    frozen = status.frozen
    if frozen is None:
        return ""
    sizes = describe_sizes(recorded_sizes(frozen, status.nodes))
    if not frozen.batches:
        plain = f"batchSize {frozen.batch_size}"
        return plain if frozen.spread_by is None else f"{plain}: sizes {sizes}"
    written = ", ".join(str(b) for b in frozen.batches)
    return f"batches [{written}]: sizes {sizes}"


def capacity_lines(frozen: FrozenSpec, nodes: Sequence[NodeRecord]) -> list[str]:
    """``spread``, ``budget``: spreadBy and failureBudget, when frozen (docs/capacity.md)."""
    out: list[str] = []
    spread = frozen.spread_by
    if spread is not None:
        out.append(
            f"  spread    by {spread.label}, at most {spread.max_per_batch} per value in a batch"
        )
    if frozen.failure_budget is not None:
        allowed = budget_of(frozen.failure_budget, len(nodes))
        failed = sum(1 for n in nodes if n.state in ("failed", "timed_out", "unknown"))
        out.append(
            f"  budget    failureBudget {frozen.failure_budget}: {allowed} failed node(s) "
            f"allowed, {failed} so far"
        )
    return out


def current_batch(status: RolloutStatus) -> int | None:
    """The batch being worked on: the first running one; else, while the
    rollout is held, the last one done (the hold comes after it); else,
    while it runs, the next pending one."""
    if status.terminal or not status.batches:
        return None
    for batch in status.batches:
        if batch.state == "running":
            return batch.index
    if status.phase == "paused":
        done = [b.index for b in status.batches if b.state == "done"]
        if done:
            return done[-1]
    if status.phase in ("running", "paused"):
        return next((b.index for b in status.batches if b.state == "pending"), None)
    return None


def last_change(status: RolloutStatus) -> datetime | None:
    if status.transitions:
        return status.transitions[-1].time
    return status.finished_at or status.started_at


def ordered(statuses: Mapping[str, RolloutStatus]) -> list[RolloutStatus]:
    """Rollouts in attention order (held first, finished last), then by name."""
    rank = {phase: i for i, phase in enumerate(PHASE_ORDER)}
    return sorted(statuses.values(), key=lambda s: (rank.get(s.phase, len(rank)), s.name))


def newest(statuses: Mapping[str, RolloutStatus]) -> list[RolloutStatus]:
    """Rollouts by their latest transition, newest first, then by name."""
    never = datetime.min.replace(tzinfo=UTC)
    by_name = sorted(statuses.values(), key=lambda s: s.name)
    return sorted(by_name, key=lambda s: last_change(s) or never, reverse=True)


def progress_bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    """``████░░░░░░``: full cells only for finished work (never rounds up to
    a full bar before the last node)."""
    if total <= 0:
        return "░" * width
    filled = done * width // total
    return "█" * filled + "░" * (width - filled)


def progress_text(summary: Summary) -> str:
    """``████░░░░░░ 4/8``, with ``✗1`` when nodes failed and ``?1`` when
    nodes are unknown; ``-`` before the rollout has nodes."""
    if not summary.total:
        return "-"
    text = f"{progress_bar(summary.done, summary.total)} {summary.done}/{summary.total}"
    text += f" ✗{summary.trouble}" if summary.trouble else ""
    return text + (f" ?{summary.unknown}" if summary.unknown else "")


def batch_text(summary: Summary) -> str:
    if summary.batch is None:
        return "-"
    return f"{summary.batch}/{summary.batch_count}"


def age(since: datetime | None, now: datetime) -> str:
    """``5m``, ``2h``, ``3d``: the largest whole unit; ``-`` when unknown."""
    if since is None:
        return "-"
    seconds = max(0, int((now - since).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def paint(text: str, key: str, colour: bool) -> str:
    code = _COLOURS.get(key)
    return f"\x1b[{code}m{text}\x1b[0m" if colour and code else text


def clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


# --- batches as drawn ----------------------------------------------------------


@dataclass(frozen=True)
class BatchGroup:
    """Consecutive batches shown as one: done and pending runs merge; a
    batch in progress stands alone. ``state``: done, running, held, failed
    (a failed or timed-out node), held (the rollout holds on it, or a node's
    verdict is unknown) or pending."""

    first: int
    last: int
    state: str
    ok: int  # nodes that succeeded
    total: int
    trouble: int = 0  # nodes in TROUBLE_STATES but unknown: failed
    unknown: int = 0  # nodes whose verdict is unknown


def batch_groups(status: RolloutStatus) -> list[BatchGroup]:
    # ok, total, failed, unknown
    per_batch: dict[int, tuple[int, int, int, int]] = {}
    for node in status.nodes:
        ok, total, trouble, unknown = per_batch.get(node.batch, (0, 0, 0, 0))
        per_batch[node.batch] = (
            ok + (node.state == "succeeded"),
            total + 1,
            trouble + (node.state in TROUBLE_STATES and node.state != UNKNOWN),
            unknown + (node.state == UNKNOWN),
        )
    groups: list[BatchGroup] = []
    # The state status files record: a batch with a failing node is failed.
    for batch, state in zip(status.batches, status.shown_batch_states(), strict=True):
        ok, total, trouble, unknown = per_batch.get(batch.index, (0, 0, 0, 0))
        last = groups[-1] if groups else None
        if last is not None and last.state == state and state in ("done", "pending"):
            groups[-1] = BatchGroup(
                last.first, batch.index, state, last.ok + ok, last.total + total, last.trouble
            )
        else:
            groups.append(BatchGroup(batch.index, batch.index, state, ok, total, trouble, unknown))
    return groups


# --- the table ---------------------------------------------------------------


def render_table(
    statuses: Mapping[str, RolloutStatus],
    now: datetime,
    *,
    colour: bool = False,
    width: int = WIDTH,
    newest_first: bool = False,
) -> str:
    """One line per rollout: name, phase, progress, batch, age, hold; each
    line at most ``width`` columns. The hold reason is what a person acts
    on, so a long name is clipped before it is. Rows come in attention
    order, or with ``newest_first`` by their latest transition."""
    if not statuses:
        return "no rollouts have a status yet\n"
    rows = [summarize(s) for s in (newest(statuses) if newest_first else ordered(statuses))]
    prog_w = max(len("PROGRESS"), *(len(progress_text(r)) for r in rows))
    batch_w = max(len("BATCH"), *(len(batch_text(r)) for r in rows))
    phase_w = 9
    age_w = 4
    why_w = min(max(len("HOLD/REASON"), *(len(r.why) for r in rows)), 24)
    room = width - (phase_w + prog_w + batch_w + age_w + why_w + 5)
    name_w = min(max(7, *(len(r.name) for r in rows)), max(room, 12), 63)
    fixed = name_w + phase_w + prog_w + batch_w + age_w + 5
    why_w = max(10, width - fixed)
    header = (
        f"{'ROLLOUT':<{name_w}} {'PHASE':<{phase_w}} {'PROGRESS':<{prog_w}} "
        f"{'BATCH':<{batch_w}} {'AGE':>{age_w}} HOLD/REASON"
    )
    lines = [header.rstrip()]
    for r in rows:
        phase = paint(f"{r.phase:<{phase_w}}", r.phase, colour)
        line = (
            f"{clip(r.name, name_w):<{name_w}} {phase} {progress_text(r):<{prog_w}} "
            f"{batch_text(r):<{batch_w}} {age(r.since, now):>{age_w}} {clip(r.why, why_w)}"
        )
        lines.append(line.rstrip())
    return "\n".join(lines) + "\n"


# --- one rollout ---------------------------------------------------------------


def render_detail(
    status: RolloutStatus, now: datetime, *, colour: bool = False, transitions: int = 10
) -> str:
    """Everything about one rollout: summary, hold, batches, conditions,
    rollbacks, the last transitions, then every node, those that need a
    person first (a list of 10,000 nodes must not push the rest away)."""
    out = _summary_lines(status, now, colour)
    out += _hold_lines(status, colour)
    out += _section_lines(status, colour, transitions)
    if status.nodes:
        out.append("")
        out += _node_lines(_attention_first(status.nodes), colour)
    return "\n".join(line.rstrip() for line in out) + "\n"


def _summary_lines(status: RolloutStatus, now: datetime, colour: bool) -> list[str]:
    """The rollout's name and phase, what was frozen, and how far it got."""
    s = summarize(status)
    out: list[str] = []
    out.append(f"{status.name}  {paint(status.phase, status.phase, colour)}")
    if s.since is not None:
        since = f"since {format_time(s.since)} ({age(s.since, now)} ago)"
        # A long name would wrap the first line: then the time goes below it.
        if len(status.name) + len(status.phase) + len(since) + 4 <= WIDTH:
            out[-1] += f"  {since}"
        else:
            out.append(f"  since     {since.removeprefix('since ')}")
    frozen = status.frozen
    if frozen is not None:
        t = frozen.target
        out.append(f"  target    {t.runtime} {t.provider}/{t.model} (profile {t.profile})")
        out.append(
            f"  mode      {'LIVE' if frozen.live else 'dry-run'}, onFailure {frozen.on_failure}, "
            f"{sizes_text(status)}"
        )
        if frozen.ignore_windows:
            out.append("  windows   ignored (ignoreWindows: true)")
        out += capacity_lines(frozen, status.nodes)
        out += artifact_text.detail_lines(frozen)
        if frozen.standby is not None:
            words = standby_text.standby_words(frozen.standby).removeprefix("standby: ")
            out += _wrapped(words, " " * 12, "  standby   ")
    out.append(f"  progress  {progress_text(s)}  batch {batch_text(s)}")
    counts = ", ".join(f"{n} {state}" for state, n in count_progress(status.nodes))
    if counts:
        out.append(f"  nodes     {counts}")
    return out


def _hold_lines(status: RolloutStatus, colour: bool) -> list[str]:
    """The hold or the reason, waits, the operator pause, commits, timeouts."""
    out: list[str] = []
    frozen = status.frozen
    if status.hold is not None:
        h = status.hold
        nodes = ", ".join(h.nodes)
        if h.node_count > len(h.nodes):
            nodes += f" and {h.node_count - len(h.nodes)} more"
        out.append(f"  hold      {paint(h.reason, 'paused', colour)} since {format_time(h.since)}")
        if h.until is not None:
            out.append(f"            lifts by itself at {format_time(h.until)}")
        out += _wrapped(h.message, "            ")
        if nodes and not all(name in h.message for name in h.nodes):
            out += _wrapped(f"nodes: {nodes}", "            ")
    elif status.reason or status.message:
        out.append(f"  reason    {status.reason}")
        out += _wrapped(ended_message(status), "            ")
    if status.waiting is not None:
        why = (
            "alerts" if status.waiting.reason.startswith("alert") else "deploy windows and freezes"
        )
        out.append(f"  waiting   {waiting_text(status.waiting)} ({why})")
    if status.operator_paused:
        by = status.paused_by.describe() if status.paused_by else "the operator"
        out += _wrapped(f"by {by} (spec.paused: true)", "            ", "  paused    ")
    if status.aborted_by is not None and status.phase == "aborted":
        out += _wrapped(f"by {status.aborted_by.describe()}", "            ", "  aborted   ")
    commits = [
        f"spec {status.spec_commit[:10]}" if status.spec_commit else "",
        f"start {status.start_commit[:10]}" if status.start_commit else "",
    ]
    if any(commits):
        out.append("  commits   " + ", ".join(c for c in commits if c))
    if status.health_timeout is not None:
        out.append(f"  timeout   {format_duration(status.health_timeout)} per node")
    if frozen is not None and frozen.health is not None:
        first, *checks = health_lines(frozen.health, frozen.live, "            ")
        out += [f"  health    {first}", *checks]
    return out


def _section_lines(status: RolloutStatus, colour: bool, transitions: int) -> list[str]:
    """Batches, failing checks, conditions, rollbacks and the last transitions."""
    out: list[str] = []
    if status.batches:
        out.append("")
        out.append("batches")
        out += _batch_lines(status, colour)
    failing = failing_checks(status.nodes)
    if failing:
        out.append("")
        out.append("failing checks")
        for node, check, detail in failing:
            out += _wrapped(f"{node} {check}: {detail}", "  ")
    compared = comparison_lines(status.nodes)
    if compared:
        out += ["", "comparisons"]
        for line in compared:
            out += _wrapped(line, "  ")
    evaluated = eval_lines(status.nodes, baseline=baseline_answers(status.eval_baseline))
    asked = baseline_lines(status.eval_baseline)
    if evaluated or asked:
        out += ["", "evals"] + [f"  {line}" for line in asked + evaluated]
    if status.conditions:
        out.append("")
        out.append("conditions")
        for c in status.conditions:
            out.append(f"  {c.type} since {format_time(c.since)}")
            out += _wrapped(c.message, "    ")
    if status.rollbacks:
        out.append("")
        out.append("rollbacks")
        for r in status.rollbacks:
            out.append(f"  {r.id}  {r.state}  by {r.requested_by} at {format_time(r.time)}")
            if r.message:
                out += _wrapped(r.message, "    ")
            for n in r.nodes:
                line = f"    {n.name}: {paint(n.outcome, n.outcome, colour)}"
                out.append(line + (f" ({clip(n.message, 50)})" if n.message else ""))
    if status.last_handled_resume:
        out.append("")
        out.append(f"last resume handled: {status.last_handled_resume}")
    if status.transitions:
        out.append("")
        shown = status.transitions[-transitions:]
        out.append(f"transitions (last {len(shown)} of {len(status.transitions)})")
        for tr in shown:
            line = f"  {format_time(tr.time)}  {tr.from_phase} -> {tr.to_phase}  {tr.reason}"
            out.append(f"{line[: WIDTH - 10]}  {tr.commit[:8]}")
    return out


def _attention_first(nodes: Sequence[NodeRecord]) -> list[NodeRecord]:
    """Nodes in trouble or held first, then those in flight, then the rest;
    frozen order within each."""

    def rank(node: NodeRecord) -> int:
        if node.state in TROUBLE_STATES or node.held is not None:
            return 0
        return 1 if node.state in ("dispatched", "restoring") else 2

    return sorted(nodes, key=rank)


def _batch_lines(status: RolloutStatus, colour: bool) -> list[str]:
    names: dict[int, list[str]] = {}
    records: dict[int, list[NodeRecord]] = {}
    for node in status.nodes:
        names.setdefault(node.batch, []).append(node.name)
        records.setdefault(node.batch, []).append(node)
    lines = []
    for group in batch_groups(status):
        which = str(group.first) if group.first == group.last else f"{group.first}-{group.last}"
        prefix = f"  {which:>9}  {group.state:<8} {group.ok}/{group.total} ok"
        listed = names.get(group.first, []) if group.first == group.last else []
        line = prefix + (f"  {clip(', '.join(listed), WIDTH - len(prefix) - 2)}" if listed else "")
        lines.append(line.replace(group.state, paint(group.state, group.state, colour), 1))
        group_nodes = (n for b in range(group.first, group.last + 1) for n in records.get(b, ()))
        words = artifact_text.batch_words(group_nodes)
        if words:
            lines.append(f"  {'':>9}  {words}")
    return lines


def _node_lines(nodes: Sequence[NodeRecord], colour: bool) -> list[str]:
    name_w = min(max(4, *(len(n.name) for n in nodes)), 28)
    lines = [f"{'NODE':<{name_w}}  BATCH  {'STATE':<16} ATT  VERDICT  ERROR"]
    error_w = WIDTH - (name_w + 2 + 7 + 17 + 5 + 9)
    for n in nodes:
        state = paint(f"{n.state:<16}", n.state, colour)
        verdict = paint(f"{n.verdict or '-':<7}", n.verdict or "", colour)
        # The error wraps at words in its own column, under itself.
        error = textwrap.wrap(" ".join(n.error.split()), max(error_w, 20)) or [""]
        lines.append(
            f"{clip(n.name, name_w):<{name_w}}  {n.batch:>5}  {state} {n.attempt:>3}  "
            f"{verdict}  {error[0]}".rstrip()
        )
        indent = " " * (WIDTH - error_w)
        lines += [indent + more for more in error[1:]]
        vouched = artifact_text.vouched_words(n)
        if vouched:
            lines.append(indent + vouched)
        standby = standby_text.node_words(n)
        if standby:
            lines += _wrapped(standby, indent)
    return lines


def _wrapped(text: str, indent: str, first: str | None = None) -> list[str]:
    return textwrap.wrap(
        " ".join(text.split()),
        WIDTH,
        initial_indent=indent if first is None else first,
        subsequent_indent=indent,
    )


# --- JSON ---------------------------------------------------------------------


def render_json(statuses: Iterable[RolloutStatus], *, one: bool = False) -> str:
    """The status records (node records inlined, even when paged on disk):
    one object with ``one``, else a list in name order."""
    records = [to_record(s) for s in sorted(statuses, key=lambda s: s.name)]
    data: object = records[0] if one and records else records
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
