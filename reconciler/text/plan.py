"""What merging a change would do, computed by the engine itself.

``make_plan`` parses the documents of two trees (base and head), takes the
statuses recorded at base, and steps every rollout twice through
``engine.step_fleet`` with the same ``now`` and no observations: once with
base's documents, once with head's. What differs between the two results is
what the merge does; what both do (a deadline passing, a rollout the daemon
has not picked up yet) is not the change's doing and is left out. Reviewers
read the result as a pull-request comment (``render_markdown``), so the
riskiest facts come first: live rollouts and their node counts, aborts,
overlaps, refused changes, invalid documents.

Must not: touch Git, files, the network or the clock (trees, statuses and
``now`` come in as values), or decide anything the engine does not.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime

from reconciler.engine import baselines, starts
from reconciler.engine.selection import maintenance_node_ids
from reconciler.engine.step import (
    FleetStep,
    RolloutInput,
    Transition,
    select_nodes_by_index,
    step_fleet,
)
from reconciler.protocol.observations import Observations
from reconciler.spec import documents
from reconciler.spec.artifacts import SIGNATURE_NAME, Artifact, Drain, ModelSigner, Warmup
from reconciler.spec.batch_shapes import describe_sizes
from reconciler.spec.durations import format_duration
from reconciler.spec.evals import uses_baseline
from reconciler.spec.model import Fleet, Problem, RolloutSpec, Settings, SpreadBy, Target, Window
from reconciler.spec.paths import rollout_path
from reconciler.spec.rollout_status import (
    FROZEN_FIELDS,
    TERMINAL_PHASES,
    NodeRecord,
    RolloutStatus,
    freeze,
)
from reconciler.spec.settings_documents import DAY_NUMBERS
from reconciler.spec.times import format_time
from reconciler.text import artifact_text, markdown, standby_text
from reconciler.text.health_text import health_lines
from reconciler.text.settings_changes import SettingChange, change_words, settings_changes

MARKER = "<!-- reconciler plan -->"
ACTIVE_PHASES = frozenset({"running", "paused"})
# Conditions that mean "this part of your change is not applied".
REFUSAL_CONDITIONS = frozenset(
    {"frozen_fields_changed", "rollback_refused", "resume_refused", "invalid_spec", "unverified"}
)
BATCHES_SHOWN = 10  # batches listed per new rollout; the rest are counted


# --- the plan as values ------------------------------------------------------------


@dataclass(frozen=True)
class Overlap:
    rollout: str  # the running or paused rollout
    nodes: tuple[str, ...]  # nodes both cover


@dataclass(frozen=True)
class AddedRollout:
    """A rollout file the merge adds."""

    name: str
    live: bool
    target: str  # "runtime provider/model (profile P)"
    on_failure: str
    batch_size: int
    health_timeout: str
    pause_after: tuple[int, ...]
    start_at: str | None
    phase: str  # after the merge: running, scheduled, pending (or the old phase, reattached)
    reason: str  # why pending or scheduled
    message: str
    batches: tuple[tuple[str, ...], ...]  # node names, batch by batch
    jobs_at_merge: int  # jobs sent as soon as the merge is seen
    overlaps: tuple[Overlap, ...] = ()
    reattached: bool = False  # the name of a finished rollout: it attaches to that status
    fleet_size: int = 0  # nodes in the fleet after the merge
    left_out: tuple[str, ...] = ()  # nodeIds in maintenance, left out
    health: tuple[str, ...] = ()  # soak and checks, one line each (docs/health.md)
    # rollout shapes (docs/rollouts.md)
    batches_written: tuple[int | str, ...] = ()  # spec.batches as written; () for batchSize
    pause_for: tuple[tuple[int, int], ...] = ()  # (batch, seconds) of timed pauses
    after: tuple[str, ...] = ()
    ignore_windows: bool = False
    # version 3, docs/capacity.md
    spread_by: SpreadBy | None = None
    labels: Mapping[str, str] = field(default_factory=dict)  # node -> its spreadBy value
    failure_budget: int | str | None = None
    # version 3, model artifacts (docs/rollouts.md)
    artifacts: tuple[Artifact, ...] = ()
    to_stage: int = 0  # nodes that still download them
    drain: Drain | None = None
    warmup: tuple[Warmup, ...] = ()
    signers: tuple[str, ...] = ()  # names of the signers covering the model
    standby: str | None = None  # keepPrevious of spec.standby
    # version 4, golden prompts (docs/evals.md): one line each
    evals: tuple[str, ...] = ()

    @property
    def node_count(self) -> int:
        return sum(len(b) for b in self.batches)

    @property
    def model(self) -> str:
        """``provider/model``: what the rollout puts on its nodes."""
        return self.target.split(" ")[1] if " " in self.target else self.target

    def first_batch_share(self) -> str:
        """``2 node(s), 20% of the fleet``: how much the first batch risks."""
        first = len(self.batches[0]) if self.batches else 0
        if not self.fleet_size:
            return f"{first} node(s)"
        return f"{first} node(s), {round(100 * first / self.fleet_size)}% of the fleet"

    @property
    def shape(self) -> str:
        """``of 2`` for batchSize, ``of 1, 3, 1`` for batches (or spreadBy)."""
        if not self.batches_written and self.spread_by is None:
            return f"of {self.batch_size}"
        return "of " + describe_sizes([len(b) for b in self.batches])

    def pause_after_words(self) -> str:
        """``pauseAfter [1 for 1h, 3]``, or ``no pauseAfter``."""
        if not self.pause_after:
            return "no pauseAfter"
        timed = dict(self.pause_for)
        entries = [
            f"{b} for {format_duration(timed[b])}" if b in timed else str(b)
            for b in self.pause_after
        ]
        return f"pauseAfter [{', '.join(entries)}]"


@dataclass(frozen=True)
class Intent:
    """An operator intent the merge changes, and what the engine makes of it."""

    rollout: str
    intent: str  # pause | unpause | resume | abort | skip | rollback
    change: str  # the field as it changes, e.g. "paused: false -> true"
    effects: tuple[str, ...]  # what happens, in words
    note: str = ""  # what the headline must add: no effect, live jobs sent again


@dataclass(frozen=True)
class Refusal:
    """A part of the change the engine will not apply, as the condition it reports."""

    rollout: str
    type: str
    message: str


@dataclass(frozen=True)
class Removal:
    rollout: str
    phase: str  # before the merge ("" when it never had a status)
    effects: tuple[str, ...]


@dataclass(frozen=True)
class Change:
    """Anything else the merge changes about a rollout: mutable fields,
    edits of a rollout not started yet, effects of node or settings edits."""

    rollout: str
    what: str
    risky: bool = False  # turns a rollout live


@dataclass(frozen=True)
class Plan:
    base: str
    head: str
    now: str
    added: tuple[AddedRollout, ...] = ()
    intents: tuple[Intent, ...] = ()
    refused: tuple[Refusal, ...] = ()
    removed: tuple[Removal, ...] = ()
    changed: tuple[Change, ...] = ()
    nodes: tuple[str, ...] = ()  # node files added, removed or edited, in words
    settings: tuple[str, ...] = ()  # settings edits, in words
    setting_changes: tuple[SettingChange, ...] = ()  # every setting edit: field, before, after
    problems: tuple[Problem, ...] = ()  # head's invalid documents
    new_problems: int = 0  # how many of them base did not have

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def empty(self) -> bool:
        return not (
            self.added
            or self.intents
            or self.refused
            or self.removed
            or self.changed
            or self.nodes
            or self.settings
            or self.setting_changes
            or self.problems
        )

    def to_record(self) -> dict[str, object]:
        record = asdict(self)
        record["problems"] = [{**asdict(p), "text": str(p)} for p in self.problems]
        return record


# --- computing it --------------------------------------------------------------------


@dataclass(frozen=True)
class Tree:
    """One side of the comparison: a commit id and its document files
    (``path -> bytes``; other paths are ignored)."""

    commit: str
    files: Mapping[str, bytes] = field(default_factory=dict)


def parse_tree(files: Mapping[str, bytes]) -> documents.Documents:
    return documents.assemble(
        documents.parse_file(path, data)
        for path, data in sorted(files.items())
        if documents.is_document_path(path)
    )


def make_plan(
    base: Tree,
    head: Tree,
    statuses: Mapping[str, RolloutStatus],
    *,
    now: datetime,
    author: str = "",
) -> Plan:
    """What merging ``head`` into ``base`` does, given the statuses
    recorded at ``base``."""
    base_docs, head_docs = parse_tree(base.files), parse_tree(head.files)
    base_names = _rollout_files(base_docs)
    head_names = _rollout_files(head_docs)

    quiet = Observations()
    change = _Change(base, head, base_names, _changed_paths(base, head))
    before_inputs = _inputs(base_docs, base_names, base, change, statuses, author)
    after_inputs = _inputs(head_docs, head_names, head, change, statuses, author)
    before = step_fleet(before_inputs, base_docs.fleet, base_docs.settings, quiet, now)
    after = step_fleet(after_inputs, head_docs.fleet, head_docs.settings, quiet, now)
    before_status = {**statuses, **before.statuses}
    after_status = {**statuses, **after.statuses}

    added: list[AddedRollout] = []
    intents: list[Intent] = []
    refused: list[Refusal] = []
    removed: list[Removal] = []
    changed: list[Change] = []
    for name in sorted(base_names | head_names | set(statuses)):
        old, new = before_status.get(name), after_status.get(name)
        effects = _effects(name, before, after, old, new)
        if new is not None:
            refused += _new_conditions(name, old, new)
        if name in head_names and name not in base_names:
            spec = head_docs.rollouts.get(name)
            if spec is not None:
                added.append(
                    _added(name, spec, new, statuses.get(name), after, after_status, head_docs)
                )
            continue  # an invalid new file shows under problems
        if name in base_names and name not in head_names:
            removed.append(_removal(name, statuses.get(name), effects))
            continue
        if name not in head_names:
            continue  # status of a file long gone
        old_spec, new_spec = base_docs.rollouts.get(name), head_docs.rollouts.get(name)
        found, rest = _kept(name, old_spec, new_spec, statuses.get(name), effects, before, after)
        intents += found
        changed += _field_changes(name, old_spec, new_spec, statuses.get(name))
        changed += rest

    base_problems = {(p.path, p.field, p.message) for p in base_docs.problems}
    settings = settings_changes(base_docs.settings, head_docs.settings)
    return Plan(
        base=base.commit,
        head=head.commit,
        now=format_time(now),
        added=tuple(sorted(added, key=_risk)),
        intents=tuple(intents),
        refused=tuple(refused),
        removed=tuple(removed),
        changed=tuple(changed),
        nodes=tuple(_node_changes(base_docs, head_docs)),
        settings=tuple(_settings_words(base_docs.settings, head_docs.settings, settings)),
        setting_changes=tuple(settings),
        problems=head_docs.problems,
        new_problems=sum(
            1 for p in head_docs.problems if (p.path, p.field, p.message) not in base_problems
        ),
    )


def _removal(name: str, recorded: RolloutStatus | None, effects: list[str]) -> Removal:
    """A rollout file the merge removes: its phase, and what removing it does."""
    return Removal(
        name,
        recorded.phase if recorded else "",
        tuple(effects) or (_removal_note(recorded),),
    )


def _kept(
    name: str,
    old_spec: RolloutSpec | None,
    new_spec: RolloutSpec | None,
    recorded: RolloutStatus | None,
    effects: list[str],
    before: FleetStep,
    after: FleetStep,
) -> tuple[list[Intent], list[Change]]:
    """A rollout file in both trees: the operator's intents the edit
    writes, and the effects no intent explains."""
    found = _intents(name, old_spec, new_spec, effects)
    found = _noted(found, recorded, _jobs_at_merge(name, before, after))
    explained = {e for i in found for e in i.effects}
    return found, [Change(name, e) for e in effects if e not in explained]


@dataclass(frozen=True)
class _Change:
    """The two trees of a change, and what differs between them."""

    base: Tree
    head: Tree
    base_names: set[str]  # rollout files in base
    changed_paths: set[str]


def _changed_paths(base: Tree, head: Tree) -> set[str]:
    return {p for p in set(base.files) | set(head.files) if base.files.get(p) != head.files.get(p)}


def _inputs(
    docs: documents.Documents,
    names: set[str],
    tree: Tree,
    change: _Change,
    statuses: Mapping[str, RolloutStatus],
    author: str,
) -> list[RolloutInput]:
    """The engine's input for every rollout of ``tree`` (the change's base
    or head) or with a status, as the daemon would build it there."""
    base, head, base_names = change.base, change.head, change.base_names
    result = []
    for name in sorted(names | set(statuses)):
        status = statuses.get(name)
        touched = rollout_path(name) in change.changed_paths and tree is head
        result.append(
            RolloutInput(
                name=name,
                spec=docs.rollouts.get(name),
                file_present=name in names,
                problems=tuple(docs.invalid_rollouts.get(name, ())),
                status=status,
                spec_commit=tree.commit if touched or status is None else status.spec_commit,
                first_seen_commit=(
                    status.first_seen_commit
                    if status is not None
                    else base.commit
                    if name in base_names
                    else head.commit
                ),
                # Known rollouts queue before the ones this change adds.
                queue_key=0 if status is not None or name in base_names else 1,
                author=author,
            )
        )
    return result


def _rollout_files(docs: documents.Documents) -> set[str]:
    return set(docs.rollouts) | set(docs.invalid_rollouts)


def _risk(rollout: AddedRollout) -> tuple[int, int, str]:
    """Live first, then the most nodes."""
    return (0 if rollout.live else 1, -rollout.node_count, rollout.name)


def _added(
    name: str,
    spec: RolloutSpec,
    new: RolloutStatus | None,
    recorded: RolloutStatus | None,
    after: FleetStep,
    after_status: Mapping[str, RolloutStatus],
    docs: documents.Documents,
) -> AddedRollout:
    if new is not None and new.nodes:
        by_batch: dict[int, list[str]] = {}
        for node in new.nodes:
            by_batch.setdefault(node.batch, []).append(node.name)
        batches = tuple(tuple(by_batch[b]) for b in sorted(by_batch))
    else:
        batches = _planned_batches(spec, docs.fleet)
    mine = {n for batch in batches for n in batch}
    overlaps = []
    for other, status in sorted(after_status.items()):
        if other == name or status.phase not in ACTIVE_PHASES:
            continue
        shared = tuple(n.name for n in status.nodes if n.name in mine)
        if shared:
            overlaps.append(Overlap(other, shared))
    t = spec.target
    left_out = maintenance_node_ids(spec, docs.fleet)
    return AddedRollout(
        name=name,
        live=spec.live,
        target=f"{t.runtime} {t.provider}/{t.model} (profile {t.profile})",
        on_failure=spec.on_failure,
        batch_size=spec.batch_size,
        health_timeout=format_duration(spec.health_timeout),
        pause_after=spec.pause_after,
        start_at=spec.start_at,
        phase=new.phase if new is not None else "pending",
        reason=new.reason if new is not None else "",
        message=new.message if new is not None else "",
        batches=batches,
        jobs_at_merge=sum(1 for job in after.effects if job.rollout == name),
        overlaps=tuple(overlaps),
        reattached=recorded is not None,
        fleet_size=len(docs.fleet.nodes),
        left_out=left_out,
        health=() if spec.health is None else tuple(health_lines(spec.health, spec.live, "")),
        batches_written=spec.batches,
        pause_for=spec.pause_for,
        after=spec.after,
        ignore_windows=spec.ignore_windows,
        spread_by=spec.spread_by,
        labels=_spread_values(spec, docs.fleet, mine),
        failure_budget=spec.failure_budget,
        artifacts=spec.artifacts,
        to_stage=artifact_text.not_staged(mine, new.nodes if new is not None else ()),
        drain=spec.drain,
        warmup=spec.warmup,
        signers=tuple(s.name for s in spec.signers),
        evals=_eval_lines(spec, new, [n for batch in batches for n in batch]),
        standby=spec.standby,
    )


def _eval_lines(
    spec: RolloutSpec, new: RolloutStatus | None, order: Sequence[str]
) -> tuple[str, ...]:
    """Each eval's line; with matchesBaseline cases, the nodes that answer
    first on the old model (as recorded once started, else as chosen now)."""
    jobs = new.eval_baseline if new is not None else ()
    nodes = [NodeRecord(name=n, batch=1) for n in order]
    lines = []
    for e in spec.evals:
        line = e.describe()
        if uses_baseline((e,)) and spec.live:
            asked = tuple(j.node for j in jobs if e.name in j.evals) or baselines.planned_nodes(
                e, nodes
            )
            line += f"; baseline nodes: {', '.join(asked) or 'none'}"
        lines.append(line)
    return tuple(lines)


def _planned_batches(spec: RolloutSpec, fleet: Fleet) -> tuple[tuple[str, ...], ...]:
    """The batches a rollout that has not started would start with, as the
    engine cuts them (``spreadBy`` with the fleet's labels as they are)."""
    names = select_nodes_by_index(spec, fleet)
    numbers = starts.batch_numbers(freeze(spec), names, fleet.by_name().get) if names else ()
    by_batch: dict[int, list[str]] = {}
    for name, number in zip(names, numbers, strict=True):
        by_batch.setdefault(number, []).append(name)
    return tuple(tuple(by_batch[b]) for b in sorted(by_batch))


def _spread_values(spec: RolloutSpec, fleet: Fleet, names: Iterable[str]) -> dict[str, str]:
    """Each node's value of the ``spreadBy`` label ("" without it)."""
    if spec.spread_by is None:
        return {}
    by_name = fleet.by_name()
    label = spec.spread_by.label
    return {
        n: (node.label(label) if (node := by_name.get(n)) is not None else None) or ""
        for n in names
    }


def _removal_note(recorded: RolloutStatus | None) -> str:
    if recorded is None:
        return "never started: nothing happens"
    if recorded.terminal:
        return f"already {recorded.phase}: its status file stays, nothing happens"
    return "aborted (spec_removed)"


def _effects(
    name: str,
    before: FleetStep,
    after: FleetStep,
    old: RolloutStatus | None,
    new: RolloutStatus | None,
) -> list[str]:
    """What the head step does to this rollout that the base step does not."""
    diff = Counter(_mine(after.transitions, name))
    diff.subtract(_mine(before.transitions, name))
    lines: list[str] = []
    phase_moves = [t for t, n in diff.items() if n > 0 and t.node is None]
    for t in phase_moves:
        lines.append(f"phase {t.from_state} -> {t.to_state} ({t.reason})")
    node_moves: dict[tuple[str, str, str], list[str]] = {}
    for t, n in diff.items():
        if n > 0 and t.node is not None:
            node_moves.setdefault((t.from_state, t.to_state, t.reason), []).append(t.node)
    for (src, dst, reason), nodes in sorted(node_moves.items()):
        lines.append(f"{_names(sorted(nodes))}: {src} -> {dst} ({reason})")
    jobs = _jobs_at_merge(name, before, after)
    if jobs > 0:
        lines.append(f"{jobs} job{'s' if jobs != 1 else ''} sent at merge")
    if new is not None and old is not None:
        old_hold = old.hold.reason if old.hold else None
        new_hold = new.hold.reason if new.hold else None
        if old_hold != new_hold:
            lines.append(f"hold {old_hold or 'none'} -> {new_hold or 'none'}")
        old_ids = {r.id: r for r in old.rollbacks}
        for record in new.rollbacks:
            if old_ids.get(record.id) != record:
                lines.append(
                    f"rollback {record.id}: {record.state}"
                    + (f": {record.message}" if record.message else "")
                )
        if old.phase == new.phase == "pending" and (old.reason, old.message) != (
            new.reason,
            new.message,
        ):
            lines.append(f"still pending: {new.message or new.reason}")
    return lines


def _jobs_at_merge(name: str, before: FleetStep, after: FleetStep) -> int:
    """Jobs for ``name`` that the head step sends and the base step does not."""
    return sum(1 for j in after.effects if j.rollout == name) - sum(
        1 for j in before.effects if j.rollout == name
    )


def _noted(found: list[Intent], status: RolloutStatus | None, jobs: int) -> list[Intent]:
    """A resume's headline note: it does nothing on a finished rollout; it
    sends live jobs again on a live one."""
    result = []
    for intent in found:
        if intent.intent == "resume" and status is not None and status.terminal:
            note = f"no effect: the rollout already {status.phase}"
            intent = Intent(intent.rollout, intent.intent, intent.change, (note,), note)
        elif (
            intent.intent == "resume"
            and jobs > 0
            and status is not None
            and status.frozen is not None
            and status.frozen.live
        ):
            intent = replace(
                intent, note=f"sends {jobs} LIVE job{'s' if jobs != 1 else ''} again at merge"
            )
        result.append(intent)
    return result


def _mine(transitions: Iterable[Transition], name: str) -> list[Transition]:
    return [t for t in transitions if t.rollout == name]


def _new_conditions(name: str, old: RolloutStatus | None, new: RolloutStatus) -> list[Refusal]:
    had = {(c.type, c.message) for c in (old.conditions if old else ())}
    return [
        Refusal(name, c.type, c.message)
        for c in new.conditions
        if c.type in REFUSAL_CONDITIONS and (c.type, c.message) not in had
    ]


def _intents(
    name: str, old: RolloutSpec | None, new: RolloutSpec | None, effects: Sequence[str]
) -> list[Intent]:
    if old is None or new is None:
        return []
    found: list[Intent] = []
    said = tuple(effects)
    if new.abort and not old.abort:
        found.append(Intent(name, "abort", "abort: false -> true", said))
    if new.paused != old.paused:
        verb = "pause" if new.paused else "unpause"
        found.append(
            Intent(name, verb, f"paused: {_yaml(old.paused)} -> {_yaml(new.paused)}", said)
        )
    if new.resume_request != old.resume_request and new.resume_request:
        found.append(Intent(name, "resume", f"resumeRequest: {_json(new.resume_request)}", said))
    added_skips = [n for n in new.skip_nodes if n not in old.skip_nodes]
    if added_skips:
        found.append(Intent(name, "skip", f"skipNodes += {', '.join(added_skips)}", said))
    if new.rollback_request is not None and new.rollback_request != old.rollback_request:
        request = new.rollback_request
        nodes = "all" if request.nodes is None else ", ".join(request.nodes)
        found.append(Intent(name, "rollback", f"rollbackRequest {request.id}: {nodes}", said))
    # Effects are shared by the intents of one rollout: show them once.
    return [i if k == 0 else Intent(i.rollout, i.intent, i.change, ()) for k, i in enumerate(found)]


def _field_changes(
    name: str, old: RolloutSpec | None, new: RolloutSpec | None, status: RolloutStatus | None
) -> list[Change]:
    """Edits of fields that are not intents: applied when the rollout has not
    started or the field is mutable (frozen edits show as refusals)."""
    if old is None or new is None or old == new:
        return []
    started = status is not None and status.started
    changes = []
    if new.health_timeout != old.health_timeout:
        changes.append(
            Change(
                name,
                f"healthTimeout {format_duration(old.health_timeout)} -> "
                f"{format_duration(new.health_timeout)}: applies to nodes dispatched from now on",
            )
        )
    if new.pause_after != old.pause_after:
        changes.append(
            Change(name, f"pauseAfter {list(old.pause_after)} -> {list(new.pause_after)}")
        )
    if not started:
        for attr, doc in FROZEN_FIELDS:
            if getattr(old, attr) != getattr(new, attr):
                changes.append(
                    Change(
                        name,
                        f"{doc} {_show(getattr(old, attr))} -> {_show(getattr(new, attr))} "
                        "(not started yet: applies)",
                        risky=attr == "live" and new.live,
                    )
                )
    return changes


def _node_changes(base: documents.Documents, head: documents.Documents) -> list[str]:
    old, new = base.fleet.by_name(), head.fleet.by_name()
    lines = [f"added {name}" for name in sorted(set(new) - set(old))]
    lines += [f"removed {name}" for name in sorted(set(old) - set(new))]
    for name in sorted(set(old) & set(new)):
        a, b = old[name], new[name]
        if a == b:
            continue
        parts = []
        if a.maintenance != b.maintenance:
            parts.append(f"maintenance {_yaml(a.maintenance)} -> {_yaml(b.maintenance)}")
        if a.labels != b.labels:
            parts.append(f"labels {_json(dict(a.labels))} -> {_json(dict(b.labels))}")
        if a.agent != b.agent:
            parts.append(f"agent {a.agent} -> {b.agent}")
        lines.append(f"changed {name}: {'; '.join(parts)}")
    return lines


# Settings worded by ``_settings_changes`` with what they do to rollouts;
# every other one in the words of ``settings_changes.change_words``.
_EXPLAINED_SETTINGS = ("statusBranch", "offlineAfter", "defaults", "windows", "freezes")


def _settings_words(old: Settings, new: Settings, changes: Sequence[SettingChange]) -> list[str]:
    lines = _settings_changes(old, new)
    lines += [change_words(c) for c in changes if c.field.split(".")[0] not in _EXPLAINED_SETTINGS]
    return lines


def _settings_changes(old: Settings, new: Settings) -> list[str]:
    lines = []
    if old.status_branch != new.status_branch:
        lines.append(f"statusBranch {old.status_branch} -> {new.status_branch}")
    if old.offline_after != new.offline_after:
        lines.append(
            f"offlineAfter {format_duration(old.offline_after)} -> "
            f"{format_duration(new.offline_after)}"
        )
    if old.defaults != new.defaults:
        lines.append(
            "defaults changed: rollouts that omit batchSize, healthTimeout or onFailure "
            "and have not started use the new values"
        )
    if old.windows != new.windows:
        shown = "; ".join(_window_words(w) for w in new.windows) or "none: any time"
        lines.append(f"deploy windows -> {shown}")
    if old.freezes != new.freezes:
        shown = "; ".join(
            f"{format_time(f.start)} to {format_time(f.end)}"
            + (f" ({f.reason})" if f.reason else "")
            for f in new.freezes
        )
        lines.append(f"freezes -> {shown or 'none'}")
    return lines


def _window_words(window: Window) -> str:
    days = ",".join(d for d, n in DAY_NUMBERS.items() if n in window.days)
    start = f"{window.start // 60:02d}:{window.start % 60:02d}"
    end = f"{window.end // 60:02d}:{window.end % 60:02d}"
    return f"{days} {start}-{end} {window.timezone}"


def _members(r: AddedRollout, batch: Sequence[str]) -> str:
    """A batch's nodes; with ``spreadBy`` each with its value of the label."""
    if r.spread_by is None:
        return _names(batch, 12)
    label = r.spread_by.label
    shown = [
        f"{name} ({label} {r.labels[name]})" if r.labels.get(name) else f"{name} (no {label})"
        for name in batch
    ]
    return _names(shown, 12)


def _names(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _json(value: object) -> str:
    """A value in JSON notation (YAML's flow style reads it the same way)."""
    return json.dumps(value, ensure_ascii=False)


def _yaml(value: bool) -> str:
    return "true" if value else "false"


def _show(value: object) -> str:
    if isinstance(value, bool):
        return _yaml(value)
    if value is None:
        return "(none)"
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):
        return _json(dict(value))
    if isinstance(value, tuple) and value and isinstance(value[0], ModelSigner):
        return "[" + ", ".join(s.name for s in value) + "]"  # by name: no key in a plan
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, Target):
        return f"{value.runtime} {value.provider}/{value.model}"
    if isinstance(value, Artifact) and value.name == SIGNATURE_NAME:
        return f"sha256:{value.sha256[:12]} ({value.url})"
    return str(value)


# --- rendering -----------------------------------------------------------------------


def _start_words(rollout: AddedRollout) -> str:
    if rollout.reattached:
        return f"reuses the name of a finished rollout: attaches to its status ({rollout.phase})"
    if rollout.phase in ACTIVE_PHASES:
        return "starts at merge"
    if rollout.phase == "scheduled" and rollout.start_at:
        return f"starts at {rollout.start_at}"
    if rollout.phase == "pending":
        return f"does not start yet: {rollout.message or rollout.reason}"
    if rollout.phase in TERMINAL_PHASES:
        return f"ends at once: {rollout.message or rollout.reason}"
    return rollout.phase


def headline(plan: Plan) -> list[str]:
    """The riskiest facts, one short line each, most dangerous first."""
    lines: list[str] = []
    if plan.problems:
        new = f", {plan.new_problems} new" if plan.new_problems != len(plan.problems) else ""
        lines.append(f"INVALID: {len(plan.problems)} document problem(s){new}: fix before merging")
    for r in plan.added:
        mode = "LIVE" if r.live else "dry-run"
        if not r.node_count:
            size = "no node matches"
        else:
            size = (
                f"{r.node_count} node(s) in {len(r.batches)} batch(es) {r.shape}, "
                f"first batch {r.first_batch_share()}"
            )
        lines.append(
            f"{mode} rollout {r.name}: {r.model} to {size}, {r.pause_after_words()}, "
            f"onFailure {r.on_failure}; {_start_words(r)}"
        )
        if r.left_out:
            lines.append(f"left out of {r.name}: {_left_out_words(r.left_out)}")
        if r.artifacts:
            lines.append(
                artifact_text.headline_words(r.name, r.artifacts, r.to_stage, r.drain, r.warmup)
            )
        if r.ignore_windows:
            lines.append(
                f"ignoreWindows: {r.name} starts batches whatever the deploy windows "
                "and freezes of reconciler.yaml say"
            )
        for o in r.overlaps:
            lines.append(
                f"overlap: {r.name} shares {len(o.nodes)} node(s) with {o.rollout} "
                f"({o.rollout} is active): {_names(o.nodes)}"
            )
    for c in plan.changed:
        if c.risky:
            lines.append(f"LIVE from now: {c.rollout}: {c.what}")
    for i in plan.intents:
        lines.append(f"{i.intent} {i.rollout}: {i.change}" + (f" ({i.note})" if i.note else ""))
    for gone in plan.removed:
        effect = "; ".join(gone.effects)
        was = f" ({gone.phase})" if gone.phase else ""
        lines.append(f"removed {gone.rollout}{was}: {effect}")
    for f in plan.refused:
        lines.append(f"refused on {f.rollout} ({f.type}): {f.message}")
    return lines


def _left_out_words(names: Sequence[str]) -> str:
    verb = "is" if len(names) == 1 else "are"
    return (
        f"{_names(names)} {verb} in maintenance; set includeMaintenance: true to include "
        f"{'it' if len(names) == 1 else 'them'}"
    )


def render_text(plan: Plan) -> str:
    out = [f"plan: merging {plan.head[:10]} into {plan.base[:10]} (as of {plan.now})"]
    if plan.empty:
        out.append("no rollout, node or settings changes")
        return "\n".join(out) + "\n"
    out.append("")
    out += [f"  {line}" for line in headline(plan)]
    for r in plan.added:
        out += ["", f"new rollout {r.name} ({'LIVE' if r.live else 'dry-run'})"]
        out += [f"  {line}" for line in _added_facts(r)]
        out += [f"  {line}" for line in _batch_lines(r)]
    for i in plan.intents:
        if i.effects:
            out += ["", f"{i.rollout}: after the merge"]
            out += [f"  {e}" for e in i.effects]
    if plan.changed:
        out += ["", "other changes"]
        out += [f"  {c.rollout}: {c.what}" for c in plan.changed]
    if plan.nodes:
        out += ["", "nodes"] + [f"  {n}" for n in plan.nodes]
    if plan.settings:
        out += ["", "settings"] + [f"  {s}" for s in plan.settings]
    if plan.problems:
        out += ["", "invalid documents"] + [f"  {p}" for p in plan.problems]
    return "\n".join(out) + "\n"


def _added_facts(r: AddedRollout) -> list[str]:
    facts = [
        f"target {r.target}",
        f"{r.node_count} node(s), "
        + (
            f"batchSize {r.batch_size}"
            if not r.batches_written
            else f"batches [{', '.join(map(str, r.batches_written))}]: sizes {r.shape[3:]}"
        )
        + f", healthTimeout {r.health_timeout}, onFailure {r.on_failure}",
    ]
    if r.health:
        first, *checks = r.health
        facts.append(f"health: {first}" + "".join(f"; check {c}" for c in checks))
    timed = dict(r.pause_for)
    untimed = [b for b in r.pause_after if b not in timed]
    if untimed:
        facts.append(f"holds after batch(es) {', '.join(map(str, untimed))}")
    for batch, seconds in r.pause_for:
        facts.append(f"holds after batch {batch} for {format_duration(seconds)}, then goes on")
    if r.left_out:
        facts.append(f"left out: {_left_out_words(r.left_out)}")
    if r.after:
        facts.append(f"starts only after {', '.join(r.after)} completed")
    if r.ignore_windows:
        facts.append("ignores deploy windows and freezes (ignoreWindows: true)")
    if r.spread_by is not None:
        facts.append(
            f"spreadBy {r.spread_by.label}: at most {r.spread_by.max_per_batch} node(s) of one "
            f"{r.spread_by.label} in a batch; nodes without it count as one value"
        )
    if r.failure_budget is not None:
        facts.append(
            f"failureBudget {r.failure_budget}: holds once more nodes than that end failed, "
            "timed out or unknown"
        )
    if r.artifacts:
        facts.append(artifact_text.artifact_words(r.artifacts, r.to_stage))
        facts.append(artifact_text.signer_words(r.signers))
    if r.artifacts or r.drain is not None or r.warmup:
        facts += [artifact_text.drain_words(r.drain), artifact_text.warmup_words(r.warmup)]
    if r.standby is not None:
        facts.append(standby_text.standby_words(r.standby))
    facts += [f"eval {line}" for line in r.evals]
    # With standby the evals run against the new slot before traffic moves to it.
    if r.evals and r.drain is None and r.standby is None:
        facts.append(
            "warning: without drain the evals run while the node already takes requests, "
            "so they cannot keep a failed model from users; declare drain"
        )
    facts.append(f"start: {_start_words(r)}" + (f" (startAt {r.start_at})" if r.start_at else ""))
    if r.jobs_at_merge:
        facts.append(f"{r.jobs_at_merge} job(s) sent as soon as the merge is seen")
    return facts


def _batch_lines(r: AddedRollout) -> list[str]:
    sized = bool(r.batches_written) or r.spread_by is not None
    lines = [
        f"batch {k}" + (f" ({len(batch)})" if sized else "") + f": {_members(r, batch)}"
        for k, batch in enumerate(r.batches[:BATCHES_SHOWN], 1)
    ]
    hidden = len(r.batches) - BATCHES_SHOWN
    if hidden > 0:
        rest = sum(len(b) for b in r.batches[BATCHES_SHOWN:])
        lines.append(f"... {hidden} more batch(es), {rest} node(s)")
    if not r.batches:
        lines.append("No node matches.")
    return lines


def render_markdown(plan: Plan) -> str:
    """A pull-request comment: a marker (so a bot can update its comment),
    the headline facts as a list, details folded away."""
    out = [
        MARKER,
        f"### reconciler plan: `{plan.head[:10]}` into `{plan.base[:10]}`",
        "",
    ]
    if plan.empty:
        out.append("No rollout, node or settings changes.")
        return "\n".join(out) + "\n"
    icons = {
        "INVALID": "❌",
        "LIVE": "🔴",
        "dry-run": "🟢",
        "overlap": "⚠️",
        "refused": "⚠️",
        "abort": "⛔",
        "removed": "🗑️",
        "rollback": "⏪",
        "pause": "⏸️",
        "resume": "▶️",
        "unpause": "▶️",
        "skip": "⏭️",
    }
    for line in headline(plan):
        icon = icons.get(line.split(" ", 1)[0].rstrip(":"), "•")
        out.append(f"- {icon} {_md(line)}")
    if plan.problems:
        out += ["", "**Invalid documents** (the check fails until they are fixed):", ""]
        out += [f"- {markdown.text(str(p))}" for p in plan.problems[:50]]
        if len(plan.problems) > 50:
            out.append(f"- … and {len(plan.problems) - 50} more (run `reconciler validate`)")
    for r in plan.added:
        title = f"{r.name}: {'LIVE' if r.live else 'dry-run'}, {r.node_count} node(s)"
        out += ["", f"<details><summary>{markdown.html(title)}</summary>", ""]
        out += [f"- {_md(f)}" for f in _added_facts(r)]
        if not r.batches:
            out += ["", "No node matches."]
        else:
            out += ["", "| batch | nodes |", "|---|---|"]
        for k, batch in enumerate(r.batches[:BATCHES_SHOWN], 1):
            out.append(f"| {k} | {_md(_members(r, batch))} |")
        hidden = len(r.batches) - BATCHES_SHOWN
        if hidden > 0:
            out.append(f"| … | {hidden} more batch(es) |")
        out += ["", "</details>"]
    effects = [(i.rollout, e) for i in plan.intents for e in i.effects]
    effects += [(r.rollout, e) for r in plan.removed for e in r.effects]
    if effects:
        out += ["", "<details><summary>What the engine does at merge</summary>", ""]
        out += [f"- **{markdown.text(name)}**: {_md(e)}" for name, e in effects]
        out += ["", "</details>"]
    other = [f"**{markdown.text(c.rollout)}**: {_md(c.what)}" for c in plan.changed]
    other += [f"node {_md(n)}" for n in plan.nodes]
    other += [f"settings: {_md(s)}" for s in plan.settings]
    if other:
        out += ["", "<details><summary>Other changes</summary>", ""]
        out += [f"- {o}" for o in other]
        out += ["", "</details>"]
    out += ["", f"<sub>computed with the engine at {plan.now}, no agent observations</sub>"]
    return "\n".join(out) + "\n"


def render_json(plan: Plan) -> str:
    return json.dumps(plan.to_record(), indent=2, ensure_ascii=False) + "\n"


def _md(text: str) -> str:
    """A plan line (which quotes documents and people) as Markdown text."""
    return markdown.text(" ".join(text.split()).replace(" -> ", " → "))


__all__ = [
    "AddedRollout",
    "Change",
    "Intent",
    "Plan",
    "Refusal",
    "Removal",
    "Tree",
    "headline",
    "make_plan",
    "render_json",
    "render_markdown",
    "render_text",
]
