"""The working copy of one rollout's status during one step, and its
checked edits: every node-state and phase change goes through
``reconciler.engine.lifecycle`` and becomes a transition. Node records are
copied only when the first one changes, and only the batches a step
touches are re-examined, so an idle step on a large rollout costs about
the size of its running batch. Counts by state are taken from the node
records, never from the stored ``progress``. No rollout rule lives here:
the step (``reconciler.engine.step``) decides, this records; which nodes
are open and whether the rollout is held ask the staging window and the
baseline gate."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from reconciler.engine import baselines, lifecycle, staging
from reconciler.engine.holds import RESTORE_STATES, operator_words
from reconciler.engine.inputs import NodeChange, Transition
from reconciler.protocol.effects import SendJob
from reconciler.spec.rollout_status import (
    NODE_STATES,
    TRANSITIONS_KEPT,
    BatchRecord,
    Condition,
    NodeRecord,
    OperatorAct,
    RolloutStatus,
    TransitionRecord,
    batch_members,
    count_progress,
)

# The status fields a draft carries as attributes of the same name; the
# node records, batches and counts are kept apart (copy on first write).
_CARRIED = (
    "phase",
    "reason",
    "message",
    "hold",
    "waiting",
    "operator_paused",
    "spec_commit",
    "approved_by",
    "paused_by",
    "aborted_by",
    "start_commit",
    "first_seen_commit",
    "scheduled_for",
    "health_timeout",
    "frozen",
    "started_at",
    "finished_at",
    "last_handled_resume",
    "rollbacks",
    "conditions",
    "eval_baseline",
)


class StatusDraft:
    """One rollout's status as a step edits it; ``build`` gives the result
    (the old status itself when nothing changed)."""

    def __init__(self, name: str, old: RolloutStatus, now: datetime, commit: str) -> None:
        self.name = name
        self.old = old
        self.now = now
        self.commit = commit  # the spec commit transitions are recorded at
        s = old
        self.phase = s.phase
        self.reason = s.reason
        self.message = s.message
        self.hold = s.hold
        self.waiting = s.waiting
        self.operator_paused = s.operator_paused
        self.spec_commit = s.spec_commit
        self.approved_by = s.approved_by
        self.paused_by = s.paused_by
        self.aborted_by = s.aborted_by
        self.start_commit = s.start_commit
        self.first_seen_commit = s.first_seen_commit
        self.scheduled_for = s.scheduled_for
        self.health_timeout = s.health_timeout
        self.frozen = s.frozen
        self.started_at = s.started_at
        self.finished_at = s.finished_at
        self.last_handled_resume = s.last_handled_resume
        self.rollbacks = s.rollbacks
        self.conditions = s.conditions
        self.eval_baseline = s.eval_baseline
        self.status_transitions = s.transitions
        self._nodes: list[NodeRecord] | None = None  # copy on first write
        self._batches: list[BatchRecord] | None = None
        self._counts: dict[str, int] | None = None  # taken from the records when first asked
        self._index: dict[str, int] | None = None
        self._members: tuple[tuple[int, ...], ...] | None = None  # batch -> indexes
        self.touched_batches: set[int] = set()
        self.effects: list[SendJob] = []
        self.transitions: list[Transition] = []

    # -- reading

    @property
    def nodes(self) -> Sequence[NodeRecord]:
        return self._nodes if self._nodes is not None else self.old.nodes

    @property
    def batches(self) -> Sequence[BatchRecord]:
        return self._batches if self._batches is not None else self.old.batches

    def progress(self, state: str) -> int:
        """How many nodes are in ``state`` now, counted from the records."""
        if self._counts is None:
            counts: dict[str, int] = {}
            for node in self.nodes:
                counts[node.state] = counts.get(node.state, 0) + 1
            self._counts = counts
        return self._counts.get(state, 0)

    def counts(self) -> list[tuple[str, int]]:
        return [(s, self.progress(s)) for s in NODE_STATES if self.progress(s)]

    def index(self, name: str) -> int | None:
        if self._index is None:
            self._index = {n.name: i for i, n in enumerate(self.nodes)}
        return self._index.get(name)

    def batch_range(self, batch: int) -> Sequence[int]:
        """Indexes of the nodes of ``batch`` (1-based), in frozen order."""
        assert self.frozen is not None
        if self.frozen.spread_by is not None:
            # Spread batches are not consecutive chunks: the records say.
            if self._members is None:
                self._members = batch_members(self.nodes)
            return self._members[batch - 1]
        starts = self.frozen.batch_starts(len(self.nodes))
        return range(starts[batch - 1], starts[batch])

    def open_indexes(self) -> Iterable[int]:
        """Indexes of nodes that may have a job in flight or be held: those
        of batches not done, plus any node being restored, plus those of
        the batches staged ahead (a stage job in flight)."""
        for b in self.batches:
            if b.state == "running":
                yield from self.batch_range(b.index)
        if self.progress("rollback_pending") or self.progress("restoring"):
            for i, node in enumerate(self.nodes):
                if node.state in RESTORE_STATES and self.batches[node.batch - 1].state != "running":
                    yield i
        for batch in staging.window(self.frozen, self.batches):
            yield from self.batch_range(batch)

    def restores_in_flight(self) -> bool:
        """Restores sent, or an accepted rollback request waiting to send them:
        either way nothing else is dispatched (docs/rollouts.md)."""
        return bool(
            self.progress("rollback_pending")
            or self.progress("restoring")
            or any(r.state == "waiting" for r in self.rollbacks)
        )

    def any_held(self) -> bool:
        """A node held, or a baseline eval job failed."""
        return any(self.nodes[i].held is not None for i in self.open_indexes()) or (
            baselines.gate(self.frozen, self.eval_baseline) == "hold"
        )

    def phase_terminal(self) -> bool:
        return self.phase in ("completed", "failed", "aborted")

    # -- checked edits

    def set_node(self, i: int, new: NodeRecord, reason: str) -> None:
        old = self.nodes[i]
        if old.__dict__ == new.__dict__:
            return
        if self._nodes is None:
            self._nodes = list(self.old.nodes)
        lifecycle.check_node(self.name, old.name, old.state, new.state)
        if new.attempt < old.attempt:
            raise lifecycle.IllegalTransition(f"{old.name}: attempt would go backwards")
        if old.state != new.state:
            if self._counts is not None:
                self._counts[old.state] -= 1
                self._counts[new.state] = self._counts.get(new.state, 0) + 1
            self.transitions.append(Transition(self.name, old.name, old.state, new.state, reason))
        self._nodes[i] = new
        self.touched_batches.add(new.batch)

    def set_nodes(self, nodes: list[NodeRecord], batches: int) -> None:
        """The node records and ``batches`` pending batches a start freezes."""
        self._nodes = nodes
        self._counts = None
        self._index = None
        self._members = None
        self._batches = [BatchRecord(k, "pending") for k in range(1, batches + 1)]

    def apply(self, changes: Iterable[NodeChange]) -> None:
        """Record the node changes a rule returned, in order."""
        for change in changes:
            self.set_node(change.index, change.node, change.reason)

    def set_batch(self, index: int, state: str) -> None:
        if self._batches is None:
            self._batches = list(self.old.batches)
        if self._batches[index - 1].state != state:
            self._batches[index - 1] = BatchRecord(index, state)

    def set_phase(self, phase: str, reason: str) -> None:
        if phase == self.phase:
            return
        lifecycle.check_phase(self.name, self.phase, phase)
        self.transitions.append(Transition(self.name, None, self.phase, phase, reason))
        record = TransitionRecord(self.now, self.phase, phase, reason, self.commit)
        self.status_transitions = (*self.status_transitions, record)[-TRANSITIONS_KEPT:]
        self.phase = phase

    def finish(self, phase: str, reason: str, message: str) -> None:
        """End the rollout in terminal ``phase``: it holds and waits for nothing."""
        self.reason = reason
        self.message = message
        self.hold = None
        self.waiting = None
        self.operator_paused = False
        self.paused_by = None
        self.finished_at = self.now
        self.set_phase(phase, reason)

    def abort(self, by: OperatorAct | None, when: str = "") -> None:
        """End the rollout ``aborted`` by the operator, naming who asked and
        why when known."""
        who, why = operator_words(by)
        self.finish("aborted", "aborted", f"aborted by {who}{when}{why}")
        self.aborted_by = by

    def pause_by_operator(self, paused: bool, by: OperatorAct | None) -> None:
        """Record ``spec.paused``, and who set it while it is true."""
        self.operator_paused = paused
        self.paused_by = by if paused else None

    def set_condition(self, type_: str, message: str | None) -> None:
        """Add, change or (message None) remove the condition of this type."""
        current = next((c for c in self.conditions if c.type == type_), None)
        if message is None:
            if current is not None:
                self.conditions = tuple(c for c in self.conditions if c.type != type_)
            return
        if current is not None and current.message == message:
            return
        others = tuple(c for c in self.conditions if c.type != type_)
        self.conditions = (*others, Condition(type_, message, self.now))

    # -- the result

    def build(self) -> RolloutStatus:
        """The new status; the old one itself when nothing changed."""
        if self._nodes is None:
            nodes, progress = self.old.nodes, self.old.progress
        else:
            nodes = tuple(self._nodes)
            counts = self._counts  # counted from these records, kept up to date by set_node
            progress = (
                count_progress(nodes)
                if counts is None
                else tuple((state, counts[state]) for state in NODE_STATES if counts.get(state))
            )
        batches = self.old.batches if self._batches is None else tuple(self._batches)
        values: dict[str, Any] = {k: getattr(self, k) for k in _CARRIED}
        values.update(
            progress=progress, batches=batches, nodes=nodes, transitions=self.status_transitions
        )
        if all(getattr(self.old, k) is v or getattr(self.old, k) == v for k, v in values.items()):
            return self.old
        return replace(self.old, **values)
