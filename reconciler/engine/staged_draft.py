"""The staging part of one rollout's step (docs/rollouts.md): a status
draft that also records stage jobs, their outcomes and the decisions on
them. The rules are ``reconciler.engine.staging``'s; this applies them to
the draft, and the step calls it at fixed points. For a rollout without
artifacts every method here does nothing, so such a rollout steps exactly
as before.

Pure, like the rest of the engine: the fleet comes in as a lookup, time as
the draft's ``now``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from reconciler.engine import attempts, batches, budget, staging
from reconciler.engine.draft import StatusDraft
from reconciler.engine.evidence import Seen
from reconciler.engine.inputs import NodeChange
from reconciler.engine.records import evolve
from reconciler.spec.model import Node, RolloutSpec
from reconciler.spec.rollout_status import ALERT_WAITING_REASONS, Waiting

NodeOf = Callable[[str], Node | None]
Dispatch = Callable[[int, str], None]


class StagedDraft(StatusDraft):
    """A status draft that knows the staging pipeline."""

    def open_indexes(self) -> Iterable[int]:
        """Also the nodes of the batches staged ahead: they may have a stage
        job in flight, or be held."""
        yield from super().open_indexes()
        for batch in staging.window(self.frozen, self.batches):
            yield from self.batch_range(batch)

    def staged_rollout(self) -> bool:
        return self.frozen is not None and bool(self.frozen.artifacts)

    def observe_stages(self, seen: Callable[[], Seen], node_of: NodeOf) -> None:
        """Record the outcome of every stage job in flight."""
        if not self.staged_rollout():
            return
        busy = [(i, self.nodes[i]) for i in self.open_indexes() if self.nodes[i].state == "staging"]
        if not busy:
            return
        assert self.frozen is not None
        changes = staging.observe(busy, self.frozen, seen(), lambda n: node_of(n) is not None)
        self.apply(changes)
        self.apply(budget.past_budget(self.frozen, self.nodes, changes))

    def decide_stages(self, policy: str, node_of: NodeOf) -> bool:
        """The stage table on each stage failure not yet decided."""
        if not self.staged_rollout():
            return False
        progressed = False
        for i in list(self.open_indexes()):
            node = self.nodes[i]
            verdict = staging.stage_failure(node)
            if verdict is None or node.held is not None:
                continue
            decision = staging.decide(policy, verdict, auto_retried=node.auto_retried)
            if decision.action == "restage":
                self.start_stage(i, "automatic retry (retry_once)", node_of, auto_retry=True)
            elif decision.action == "hold":
                self.set_node(i, evolve(node, held=decision.hold), decision.hold or "hold")
            else:
                continue  # observe: recorded, and the batch goes on without it
            progressed = True
        return progressed

    def stage_ahead(
        self, spec: RolloutSpec, node_of: NodeOf, alert_wait: Waiting | None = None
    ) -> bool:
        """Start stage jobs down the pipeline, unless the rollout is held or
        ``alert_wait`` stands (a fleet-wide alert fires, or Alertmanager
        cannot be asked: as for a new batch, recorded as the wait)."""
        if not self.staged_rollout() or self.restores_in_flight() or self.any_held():
            return False
        if not self.alerts_let_stages_start(alert_wait):
            return False
        if batches.paused_after(self.batches, spec.pause_after) is not None:
            return False
        assert self.frozen is not None
        order = [i for b in staging.window(self.frozen, self.batches) for i in self.batch_range(b)]
        limit = staging.most_staging(self.nodes, staging.settings_of(self.frozen))
        picked = staging.to_start(self.nodes, order, limit)
        for i in picked:
            self.start_stage(i, f"staging batch {self.nodes[i].batch}", node_of)
        return bool(picked)

    def alerts_let_stages_start(self, alert_wait: Waiting | None) -> bool:
        if alert_wait is not None:
            # An unchanged wait keeps its value, so an idle pass writes nothing.
            self.waiting = self.waiting if alert_wait == self.waiting else alert_wait
            return False
        if self.waiting is not None and self.waiting.reason in ALERT_WAITING_REASONS:
            self.waiting = None  # resolved; a due batch's gate records its own wait
        return True

    def start_stage(self, i: int, reason: str, node_of: NodeOf, auto_retry: bool = False) -> None:
        """Send the node's next stage job, or record why the daemon cannot."""
        node = self.nodes[i]
        assert self.frozen is not None and self.start_commit is not None
        fleet_node = node_of(node.name)
        if fleet_node is None or attempts.dispatch_refusal(
            fleet_node, self.frozen.include_maintenance
        ):
            # As for an apply: never sent ends unknown, else held dispatch_refused.
            new, _ = attempts.next_apply(
                node,
                fleet_node,
                include_maintenance=self.frozen.include_maintenance,
                rollout=self.name,
                start_commit=self.start_commit,
                source_commit=self.start_commit,
                now=self.now,
                deadline=self.now,
            )
            self.set_node(i, new, new.error)
            ended = (NodeChange(i, new, new.error),)
            self.apply(budget.past_budget(self.frozen, self.nodes, ended))
            return
        new = staging.next_stage(
            node,
            rollout=self.name,
            start_commit=self.start_commit,
            now=self.now,
            auto_retry=auto_retry,
        )
        self.set_node(i, new, reason)
        self.effects.append(staging.stage_job(self.name, self.frozen, self.start_commit, new))

    def ask_again(self, i: int, reason: str, dispatch: Dispatch, node_of: NodeOf) -> None:
        """A resume's new attempt: staged first when the node is not staged."""
        if staging.needs_stage(self.frozen, self.nodes[i]):
            self.start_stage(i, reason, node_of)
        else:
            dispatch(i, reason)

    def batch_ready(self, batch: int, policy: str) -> bool:
        """Whether ``batch`` may be dispatched: always, without artifacts."""
        if not self.staged_rollout() or batch > len(self.batches):
            return True
        return staging.batch_ready((self.nodes[i] for i in self.batch_range(batch)), policy)

    def dispatch_staged(self, dispatch: Dispatch, reason: str = "staged") -> bool:
        """Dispatch every staged node of a running batch that is not held."""
        if not self.staged_rollout():
            return False
        ready = [
            i
            for b in self.batches
            if b.state == "running"
            for i in self.batch_range(b.index)
            if self.nodes[i].state == "staged" and self.nodes[i].held is None
        ]
        for i in ready:
            dispatch(i, reason)
        return bool(ready)
