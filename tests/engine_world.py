"""A small world for engine scenarios: a fleet, rollout specs, recorded
statuses, a daemon clock and what the agents answer. ``step()`` is one
reconcile pass through the real engine; the world keeps the statuses it
returns and the jobs it asked to send, as the daemon would.

Agents' clocks are the daemon's clock here, so ``succeed(node)`` finishes a
job "now" and ``heartbeat(node)`` reports "now" unless told otherwise.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from reconciler.engine.step import FleetStep, RolloutInput, step_fleet
from reconciler.protocol.canary_observations import AlertAnswer
from reconciler.protocol.effects import SendJob
from reconciler.protocol.observations import (
    Backup,
    Heartbeat,
    JobObservation,
    Observations,
    RuntimeReport,
)
from reconciler.spec.model import Fleet, Node, RollbackRequest, RolloutSpec, Settings, Target
from reconciler.spec.rollout_status import ApprovalRecord, NodeRecord, RolloutStatus
from reconciler.spec.times import format_time

T0 = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC)
TARGET = Target(runtime="hermes", provider="ollama", model="llama3.1-8b", profile="default")
OLD_MODEL = "llama3-8b"


class World:
    unreadable: dict[str, tuple[str, ...]] = {}  # noqa: RUF012 - replaced, never mutated

    def __init__(self, nodes: int | list[str] = 3, settings: Settings | None = None) -> None:
        names = [f"n{i + 1}" for i in range(nodes)] if isinstance(nodes, int) else nodes
        self.fleet: dict[str, Node] = {
            n: Node(name=n, agent=f"http://10.0.0.{k + 1}:8710") for k, n in enumerate(names)
        }
        self.settings = settings or Settings()
        self.specs: dict[str, RolloutSpec | None] = {}
        self.present: dict[str, bool] = {}
        self.problems: dict[str, tuple[Any, ...]] = {}
        self.commits: dict[str, str] = {}
        self.first_seen: dict[str, tuple[int, str]] = {}
        self.authors: dict[str, str] = {}
        self.refusals: dict[str, str | None] = {}
        self.approved_by: tuple[
            ApprovalRecord, ...
        ] = ()  # of the verified commit, for every rollout
        self.statuses: dict[str, RolloutStatus] = {}
        self.now = T0
        self.jobs: dict[str, JobObservation] = {}
        self.heartbeats: dict[str, Heartbeat] = {}
        self.unreachable: dict[str, datetime] = {}
        self.backups: dict[str, tuple[Backup, ...]] = {}
        self.alerts: dict[str, AlertAnswer] = {}  # Alertmanager's answers, by rollout
        self.sent: list[SendJob] = []
        self.last: FleetStep = FleetStep()
        self._commit_no = 0

    # -- the repository

    def _commit(self) -> str:
        self._commit_no += 1
        return f"{self._commit_no:040x}"

    def set_node(self, name: str, **fields: Any) -> None:
        node = self.fleet.get(name) or Node(name=name, agent="http://10.0.9.9:8710")
        if "labels" in fields:
            fields["labels"] = tuple(sorted(fields["labels"].items()))
        self.fleet[name] = replace(node, **fields)

    def remove_node(self, name: str) -> None:
        del self.fleet[name]

    def rollout(self, name: str = "r", **fields: Any) -> RolloutSpec:
        if "node_ids" not in fields and "selector" not in fields:
            fields["node_ids"] = tuple(sorted(self.fleet))
        for key in ("node_ids", "pause_after", "skip_nodes"):
            if key in fields and fields[key] is not None:
                fields[key] = tuple(fields[key])
        if "selector" in fields and isinstance(fields["selector"], dict):
            fields["selector"] = tuple(sorted(fields["selector"].items()))
        spec = RolloutSpec(name=name, target=fields.pop("target", TARGET), **fields)
        commit = self._commit()
        self.specs[name] = spec
        self.present[name] = True
        self.problems[name] = ()
        self.commits[name] = commit
        self.first_seen.setdefault(name, (len(self.first_seen), commit))
        return spec

    def edit(self, name: str = "r", author: str = "", **changes: Any) -> RolloutSpec:
        spec = self.specs[name]
        assert spec is not None
        for key in ("pause_after", "skip_nodes", "node_ids"):
            if key in changes and changes[key] is not None:
                changes[key] = tuple(changes[key])
        self.specs[name] = replace(spec, **changes)
        self.commits[name] = self._commit()
        if author:
            self.authors[name] = author
        return self.specs[name]  # type: ignore[return-value]

    def resume(self, name: str = "r", token: str | None = None) -> None:
        self._commit_no += 0
        self.edit(name, resume_request=token or f"resume-{self._commit_no + 1}")

    def rollback(
        self, name: str = "r", id: str = "rb1", nodes: list[str] | None = None, author: str = ""
    ) -> None:
        request = RollbackRequest(id=id, nodes=None if nodes is None else tuple(nodes))
        self.edit(name, author=author or "Ops <ops@example.org>", rollback_request=request)

    def remove(self, name: str = "r") -> None:
        self.specs[name] = None
        self.present[name] = False
        self.commits[name] = self._commit()

    def break_file(self, name: str = "r", problem: Any = "bad") -> None:
        self.specs[name] = None
        self.problems[name] = (problem,)
        self.commits[name] = self._commit()

    # -- the agents

    def job(self, node: str, rollout: str = "r") -> SendJob:
        """The newest job sent to the node for the rollout."""
        jobs = [j for j in self.sent if j.node == node and j.rollout == rollout]
        assert jobs, f"no job was sent to {node}"
        return jobs[-1]

    def jobs_to(self, node: str, rollout: str = "r") -> list[SendJob]:
        return [j for j in self.sent if j.node == node and j.rollout == rollout]

    def answer(self, job: SendJob, state: str, **fields: Any) -> None:
        self.jobs[job.job_id] = JobObservation(job_id=job.job_id, state=state, **fields)

    def succeed(
        self,
        node: str,
        rollout: str = "r",
        backup_id: str | None = None,
        at: datetime | None = None,
    ) -> SendJob:
        job = self.job(node, rollout)
        self.answer(
            job,
            "succeeded",
            backup_id=backup_id,
            finished_at=format_time(at or self.now),
            source_commit=job.source_commit,
        )
        return job

    def fail(
        self, node: str, rollout: str = "r", error: str = "apply_failed: exit 1", **kw: Any
    ) -> SendJob:
        job = self.job(node, rollout)
        self.answer(job, "failed", error=error, finished_at=format_time(self.now), **kw)
        return job

    def heartbeat(self, node: str, model: str = TARGET.model, at: datetime | None = None) -> None:
        self.heartbeats[node] = Heartbeat(
            node=node,
            time=format_time(at or self.now),
            runtimes=(RuntimeReport("hermes", TARGET.provider, model, "default"),),
        )

    def go_offline(self, node: str) -> None:
        self.unreachable[node] = self.now

    def come_back(self, node: str) -> None:
        self.unreachable.pop(node, None)

    def backup(self, node: str, backup_id: str, job: SendJob, rollout: str = "r") -> None:
        entry = Backup(
            backup_id=backup_id,
            runtime="hermes",
            created_at=format_time(self.now),
            job_id=job.job_id,
            rollout=rollout,
            provider=TARGET.provider,
            model=OLD_MODEL,
        )
        self.backups[node] = (entry, *self.backups.get(node, ()))

    # -- the daemon

    def at(self, seconds: float) -> datetime:
        return T0 + timedelta(seconds=seconds)

    def inputs(self) -> list[RolloutInput]:
        names = set(self.specs) | set(self.statuses)
        return [
            RolloutInput(
                name=name,
                spec=self.specs.get(name),
                file_present=self.present.get(name, False),
                problems=self.problems.get(name, ()),
                status=self.statuses.get(name),
                spec_commit=self.commits.get(name, ""),
                first_seen_commit=self.first_seen.get(name, (0, ""))[1],
                queue_key=self.first_seen.get(name, (0, ""))[0],
                author=self.authors.get(name, ""),
                refusal=self.refusals.get(name),
                approved_by=self.approved_by,
            )
            for name in sorted(names)
        ]

    def observations(self) -> Observations:
        return Observations(
            jobs=dict(self.jobs),
            heartbeats=dict(self.heartbeats),
            unreachable_since=dict(self.unreachable),
            backups=dict(self.backups),
            alerts=dict(self.alerts),
        )

    def step(self, at: float | None = None) -> FleetStep:
        if at is not None:
            self.now = self.at(at)
        result = step_fleet(
            self.inputs(),
            Fleet(tuple(self.fleet.values())),
            self.settings,
            self.observations(),
            self.now,
            unreadable=self.unreadable,
        )
        self.statuses.update(result.statuses)
        self.sent.extend(result.effects)
        self.last = result
        return result

    # -- reading status

    def status(self, name: str = "r") -> RolloutStatus:
        return self.statuses[name]

    def phase(self, name: str = "r") -> str:
        return self.statuses[name].phase

    def hold(self, name: str = "r") -> str | None:
        hold = self.statuses[name].hold
        return None if hold is None else hold.reason

    def node(self, node: str, rollout: str = "r") -> NodeRecord:
        return next(n for n in self.statuses[rollout].nodes if n.name == node)

    def state(self, node: str, rollout: str = "r") -> str:
        return self.node(node, rollout).state

    def states(self, rollout: str = "r") -> dict[str, str]:
        return {n.name: n.state for n in self.statuses[rollout].nodes}

    def sent_now(self) -> list[str]:
        """Nodes that got a job in the last step."""
        return [j.node for j in self.last.effects]
