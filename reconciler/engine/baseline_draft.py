"""The eval-baseline part of one rollout's step (docs/evals.md): a status
draft that also sends baseline eval jobs, records their answers, holds
the rollout when one fails, and sends a failed one again on a resume. The
rules are ``reconciler.engine.baselines``'s; this applies them to the
draft, and the step calls it at fixed points. For a rollout without
``matchesBaseline`` cases every method here does nothing, so such a
rollout steps exactly as before.

Pure, like the rest of the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from reconciler.engine import attempts, baselines
from reconciler.engine.staged_draft import StagedDraft
from reconciler.protocol.observations import Observations
from reconciler.spec.baseline_records import Answers, BaselineJob, first_nodes
from reconciler.spec.model import Node
from reconciler.spec.rollout_status import NodeRecord

NodeOf = Callable[[str], Node | None]


class BaselineDraft(StagedDraft):
    """A status draft that knows eval baselines."""

    def baseline_gate(self) -> str:
        return baselines.gate(self.frozen, self.eval_baseline)

    def baseline_ready(self) -> bool:
        """Whether the first batch may go as far as the baseline is concerned."""
        return self.baseline_gate() == "go"

    def baseline_failed(self) -> bool:
        return self.baseline_gate() == "hold"

    def any_held(self) -> bool:
        return super().any_held() or self.baseline_failed()

    def baseline_answers(self) -> Answers:
        return baselines.answers_for_applies(self.eval_baseline)

    def send_baseline(self, node_of: NodeOf) -> bool:
        """Send the eval jobs, once, when the rollout needs a baseline."""
        if self.baseline_gate() != "send":
            return False
        assert self.frozen is not None
        chosen = baselines.choose(self.frozen.evals, self.nodes)
        jobs = tuple(self._send(node, names, 1, node_of) for node, names in chosen.items())
        self.eval_baseline = jobs
        return bool(jobs)

    def resume_baseline(self, node_of: NodeOf) -> bool:
        """A resume's answer to ``eval_baseline_failed``: each failed
        baseline job sent again as a new attempt."""
        if not self.baseline_failed():
            return False
        self.eval_baseline = tuple(
            self._send(job.node, job.evals, job.attempt + 1, node_of)
            if job.state == "failed"
            else job
            for job in self.eval_baseline
        )
        return True

    def _send(
        self, node: str, names: tuple[str, ...], attempt: int, node_of: NodeOf
    ) -> BaselineJob:
        """Record a baseline job for ``node`` and send it, or record at
        once why it cannot be sent."""
        assert self.frozen is not None and self.start_commit is not None
        assert self.health_timeout is not None
        job = baselines.new_job(
            node,
            names,
            attempt,
            rollout=self.name,
            start_commit=self.start_commit,
            now=self.now,
            frozen=self.frozen,
            health_timeout=self.health_timeout,
        )
        fleet_node = node_of(node)
        refusal = (
            "node is not in nodes/"
            if fleet_node is None
            else attempts.dispatch_refusal(fleet_node, self.frozen.include_maintenance)
        )
        if refusal:
            job = replace(job, state="failed", finished_at=self.now, error=refusal)
            return job
        self.effects.append(baselines.eval_job(self.name, self.frozen, self.start_commit, job))
        return job

    def observe_baseline(self, obs: Observations, node_of: NodeOf) -> None:
        """Record the outcome of every baseline job in flight."""
        running = [j for j in self.eval_baseline if j.state == "running"]
        if not running or self.frozen is None or self.health_timeout is None:
            return
        first_of = {name: job.node for name, job in first_nodes(self.eval_baseline).items()}
        judged = []
        for job in self.eval_baseline:
            new = job
            if job.state == "running":
                new = baselines.judge(
                    job,
                    self.frozen,
                    obs,
                    self.now,
                    in_fleet=node_of(job.node) is not None,
                    health_timeout=self.health_timeout,
                    first_of=first_of,
                )
            judged.append(new)
        self.eval_baseline = tuple(judged)

    def baseline_held(self) -> list[NodeRecord]:
        """The failed baseline nodes as held records, for the rollout's hold."""
        if not self.baseline_failed():
            return []
        return [
            NodeRecord(name=j.node, batch=0, held=baselines.HOLD, error=j.error)
            for j in self.eval_baseline
            if j.state == "failed"
        ]
