"""Property test: random sequences of agent answers, heartbeats, outages,
operator intents, spec and fleet edits and clock jumps, with the engine's
promises checked after every step (docs/rollouts.md and docs/architecture.md):

- no node of batch k+1 gets a job before batch k is settled, and nothing is
  applied while a restore is in flight (invariant 3);
- status never goes backwards: terminal phases stay, attempts never
  decrease, a recorded verdict is never rewritten (invariant 4);
- holds agree with the policy table; `unknown` never led to a retry, a stop
  or a restore;
- every job id always carries the same payload;
- stepping twice with the same inputs changes nothing the second time;
- nor does a step that observes none of the jobs still in flight (each left
  to its held read) and reads no heartbeat, backup list, metric or alert,
  up to its next wakeup: the daemon does not run that pass;
- every status validates against the status schema and round-trips through
  its records.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonschema
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from reconciler.engine.canary_queries import wanted_alerts
from reconciler.engine.policy import decide
from reconciler.engine.step import (
    in_flight,
    next_wakeup,
    step_fleet,
    wanted_backups,
    wanted_heartbeats,
    wanted_metric_checks,
)
from reconciler.protocol.effects import SendJob
from reconciler.spec.model import Fleet, RollbackRequest, Settings
from reconciler.spec.rollout_status import (
    TERMINAL_PHASES,
    NodeRecord,
    RolloutStatus,
    from_record,
    status_files,
    status_from_files,
    to_record,
)
from tests.engine_world import OLD_MODEL, World

SCHEMA = json.loads(
    (Path(__file__).parent.parent / "schemas" / "rollout-status.schema.json").read_text()
)
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
NODES = ["a", "b", "c", "d", "e"]
ROLLOUTS = ["r1", "r2"]
POLICIES = ["observe", "pause", "retry_once", "stop", "rollback"]


def settled(node: NodeRecord, policy: str) -> bool:
    if node.held is not None:
        return False
    if node.state in ("succeeded", "skipped", "rolled_back", "rollback_failed"):
        return True
    return node.state in ("failed", "timed_out", "unknown") and policy == "observe"


class EngineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.w = World(NODES, settings=Settings(offline_after=90))
        self.payloads: dict[str, SendJob] = {}
        self.verdicts: dict[tuple[str, str, int], str] = {}
        self.tokens = 0

    # -- the repository

    @precondition(lambda self: len(self.w.specs) < len(ROLLOUTS))
    @rule(
        policy=st.sampled_from(POLICIES),
        live=st.booleans(),
        batch_size=st.integers(1, 3),
        nodes=st.lists(st.sampled_from(NODES), min_size=1, max_size=5, unique=True),
        pause_after=st.lists(st.integers(1, 3), max_size=2),
        allow_overlap=st.booleans(),
        start_in=st.sampled_from([None, 0, 120]),
    )
    def add_rollout(
        self,
        policy: str,
        live: bool,
        batch_size: int,
        nodes: list[str],
        pause_after: list[int],
        allow_overlap: bool,
        start_in: int | None,
    ) -> None:
        name = ROLLOUTS[len(self.w.specs)]
        start_at = None
        if start_in is not None:
            start_at = (self.w.now + timedelta(seconds=start_in)).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.w.rollout(
            name,
            on_failure=policy,
            live=live,
            batch_size=batch_size,
            node_ids=nodes,
            pause_after=pause_after,
            allow_overlap=allow_overlap,
            start_at=start_at,
            health_timeout=300,
        )

    def present(self) -> list[str]:
        return [n for n, spec in self.w.specs.items() if spec is not None]

    @precondition(lambda self: self.present())
    @rule(data=st.data())
    def edit_intents(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(self.present()))
        choice = data.draw(
            st.sampled_from(
                [
                    *["pause", "unpause", "resume", "resume", "resume", "skip", "timeout"],
                    *["frozen", "abort", "remove"],
                ]
            )
        )
        if choice == "pause":
            self.w.edit(name, paused=True)
        elif choice == "unpause":
            self.w.edit(name, paused=False)
        elif choice == "resume":
            self.tokens += 1
            self.w.edit(name, resume_request=f"t{self.tokens}")
        elif choice == "abort":
            self.w.edit(name, abort=data.draw(st.booleans()))
        elif choice == "skip":
            self.w.edit(name, skip_nodes=data.draw(st.lists(st.sampled_from(NODES), max_size=2)))
        elif choice == "remove":
            self.w.remove(name)
        elif choice == "timeout":
            self.w.edit(name, health_timeout=data.draw(st.sampled_from([60, 300, 900])))
        else:
            self.w.edit(name, batch_size=data.draw(st.integers(1, 4)))

    @precondition(lambda self: self.present())
    @rule(data=st.data())
    def request_rollback(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(self.present()))
        nodes = data.draw(
            st.one_of(st.none(), st.lists(st.sampled_from([*NODES, "ghost"]), max_size=3))
        )
        rid = data.draw(st.sampled_from(["rb1", "rb2", "rb3"]))
        request = RollbackRequest(rid, None if nodes is None else tuple(nodes))
        self.w.edit(name, author="Ops <ops@example.org>", rollback_request=request)

    @rule(node=st.sampled_from(NODES), change=st.sampled_from(["remove", "maintenance", "back"]))
    def edit_fleet(self, node: str, change: str) -> None:
        if change == "remove":
            self.w.fleet.pop(node, None)
        elif change == "maintenance":
            self.w.set_node(node, maintenance=True)
        else:
            self.w.set_node(node, maintenance=False)

    # -- the agents

    @rule(data=st.data(), backup=st.sampled_from([None, "bk-1", "bk-2"]), beat=st.booleans())
    def job_succeeds(self, data: st.DataObject, backup: str | None, beat: bool) -> None:
        jobs = list(in_flight(self.w.statuses.values()))
        if jobs:
            job = data.draw(st.sampled_from(jobs))
            self.w.answer(
                job,
                "succeeded",
                backup_id=backup,
                finished_at=self.w.now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
            if beat:  # a heartbeat after the job finished, showing the target
                self.w.heartbeat(job.node, at=self.w.now + timedelta(seconds=1))

    @rule(
        data=st.data(),
        state=st.sampled_from(["failed", "refused", "running", "accepted", "unreachable"]),
        backup=st.sampled_from([None, "bk-1", "bk-2"]),
    )
    def answer_a_job(self, data: st.DataObject, state: str, backup: str | None) -> None:
        jobs = list(in_flight(self.w.statuses.values())) or self.w.sent
        if not jobs:
            return
        job = data.draw(st.sampled_from(jobs))
        self.w.answer(
            job,
            state,
            backup_id=backup if state == "failed" else None,
            finished_at=self.w.now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            error=f"{state}: synthetic",
        )

    @rule(data=st.data())
    def answer_late_for_an_old_job(self, data: st.DataObject) -> None:
        if self.w.sent:
            job = data.draw(st.sampled_from(self.w.sent))
            self.w.answer(job, data.draw(st.sampled_from(["failed", "succeeded"])))

    @rule(node=st.sampled_from(NODES), shows_target=st.booleans(), offset=st.integers(-30, 30))
    def heartbeat(self, node: str, shows_target: bool, offset: int) -> None:
        model = None if shows_target else OLD_MODEL
        at = self.w.now + timedelta(seconds=offset)
        if model is None:
            self.w.heartbeat(node, at=at)
        else:
            self.w.heartbeat(node, model=model, at=at)

    @rule(node=st.sampled_from(NODES), offline=st.booleans())
    def outage(self, node: str, offline: bool) -> None:
        if offline:
            self.w.unreachable.setdefault(node, self.w.now)
        else:
            self.w.unreachable.pop(node, None)

    @rule(data=st.data(), backup=st.sampled_from(["bk-1", "bk-2", "bk-3"]))
    def backup_list(self, data: st.DataObject, backup: str) -> None:
        applies = [j for j in self.w.sent if j.kind == "apply"]
        if applies:
            job = data.draw(st.sampled_from(applies))
            self.w.backup(job.node, backup, job, job.rollout)

    # -- the daemon

    @rule(
        seconds=st.sampled_from([0, 1, 1, 5, 5, 30, 61, 95, 301, 950]),
        later=st.sampled_from([0, 1, 4, 30, 301]),
    )
    def step(self, seconds: int, later: int) -> None:
        w = self.w
        w.now += timedelta(seconds=seconds)
        before = dict(w.statuses)
        result = w.step()
        self.check_step(before, result.statuses, result.effects, result.transitions)
        # Same inputs again: nothing changes.
        again = step_fleet(
            w.inputs(), Fleet(tuple(w.fleet.values())), w.settings, w.observations(), w.now
        )
        assert dict(again.statuses) == {}, f"second step changed {list(again.statuses)}"
        assert again.effects == ()
        self.check_nothing_to_observe(later)

    def check_nothing_to_observe(self, later: int) -> None:
        """A pass right after the step that observes none of the jobs in
        flight (each waits on its held read, which no answer older than 5 s
        stands in for) and reads nothing else, before the next wakeup: the
        step made a fixed point, so it changes nothing either."""
        w = self.w
        statuses = list(w.statuses.values())
        if (
            wanted_heartbeats(statuses)
            or wanted_backups(statuses)
            or wanted_metric_checks(statuses)
            or wanted_alerts(statuses)
        ):
            return
        jobs = in_flight(statuses)
        observations = w.observations()
        if any(j.job_id in observations.jobs or j.node in w.unreachable for j in jobs):
            return
        wakeup = next_wakeup(statuses)
        at = w.now + timedelta(seconds=later)
        if (jobs and later >= 5) or (wakeup is not None and at >= wakeup):
            return
        quiet = step_fleet(
            w.inputs(),
            Fleet(tuple(w.fleet.values())),
            w.settings,
            replace(observations, jobs={}),
            at,
        )
        assert dict(quiet.statuses) == {}, (
            f"a pass observing nothing changed {list(quiet.statuses)}"
        )
        assert quiet.effects == ()

    def check_step(
        self,
        before: dict[str, RolloutStatus],
        changed: Any,
        effects: tuple[SendJob, ...],
        transitions: tuple[Any, ...],
    ) -> None:
        for name, new in changed.items():
            old = before.get(name)
            assert old is None or old != new, "an unchanged status was reported as changed"
            self.check_backwards(old, new)
            self.check_policy(new)
            self.check_records(new)
        for job in effects:
            status = self.w.statuses[job.rollout]
            self.check_job_id(job)
            if job.kind == "apply":
                self.check_gate(status, job)
                old = before.get(job.rollout)
                old_node = None if old is None else _node(old, job.node)
                resumed = old is not None and old.last_handled_resume != status.last_handled_resume
                if job.attempt > 1 and not resumed:
                    # An automatic retry: only retry_once, only after a failure.
                    assert status.frozen is not None and status.frozen.on_failure == "retry_once"
                    assert old_node is not None and old_node.verdict != "unknown"
                    assert old_node.state != "unknown", "retry after unknown"
        for job in in_flight(self.w.statuses.values()):
            self.check_job_id(job)
        # `unknown` never led to a retry, stop or restore within a step.
        went_unknown: set[tuple[str, str | None]] = set()
        for t in transitions:
            if t.to_state == "unknown":
                went_unknown.add((t.rollout, t.node))
            if (t.rollout, t.node) in went_unknown and t.from_state == "unknown":
                old = before.get(t.rollout)
                new = self.w.statuses[t.rollout]
                resumed = old is not None and old.last_handled_resume != new.last_handled_resume
                assert t.to_state in ("skipped", "restoring") or (
                    t.to_state == "dispatched" and resumed
                ), f"unknown led to {t.to_state} on {t.node}"

    def check_backwards(self, old: RolloutStatus | None, new: RolloutStatus) -> None:
        if old is not None and old.phase in TERMINAL_PHASES:
            assert new.phase == old.phase, f"{new.name}: terminal {old.phase} -> {new.phase}"
        if old is not None and old.nodes:
            assert [n.name for n in old.nodes] == [n.name for n in new.nodes]
            for o, n in zip(old.nodes, new.nodes, strict=True):
                assert n.attempt >= o.attempt, f"{n.name}: attempt went backwards"
        for node in new.nodes:
            key = (new.name, node.name, node.attempt)
            if node.verdict is not None:
                recorded = self.verdicts.setdefault(key, node.verdict)
                assert recorded == node.verdict, f"{key}: verdict {recorded} -> {node.verdict}"
        assert (new.phase == "paused") == (new.hold is not None), (new.phase, new.hold)

    def check_policy(self, status: RolloutStatus) -> None:
        if status.frozen is None or status.phase in TERMINAL_PHASES:
            return
        policy = status.frozen.on_failure
        for node in status.nodes:
            held = node.held
            if held in (None, "dispatch_refused", "rolled_back", "rollback_failed"):
                continue
            if node.state == "rollback_pending" or held == "rollback_pending":
                assert policy == "rollback" and node.verdict == "failed", node
                continue
            if node.state == "stopped":
                assert policy == "stop" and held == "stopped", node
                continue
            assert node.verdict is not None, node
            live = status.frozen.live
            backup = live and (node.first_backup_id is not None or not node.first_backup_known)
            expected = decide(
                policy, node.verdict, auto_retried=node.auto_retried, backup_available=backup
            )
            if held == "rollback_unavailable":
                # Decided as a rollback; the backup list then showed none.
                assert policy == "rollback" and node.verdict == "failed", node
                continue
            assert expected.hold == held, (policy, node, expected)

    def check_records(self, status: RolloutStatus) -> None:
        data = to_record(status)
        errors = list(VALIDATOR.iter_errors(json.loads(json.dumps(data))))
        assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:3]]
        assert from_record(json.loads(json.dumps(data))) == status
        files = status_files(status)
        main = files.pop(f"status/{status.name}.yaml")
        assert status_from_files(main, files) == status

    def check_gate(self, status: RolloutStatus, job: SendJob) -> None:
        assert status.frozen is not None
        node = _node(status, job.node)
        assert node is not None
        for other in status.nodes:
            if other.batch < node.batch:
                assert settled(other, status.frozen.on_failure), (
                    f"{job.node} (batch {node.batch}) got a job while {other.name} "
                    f"(batch {other.batch}) is {other.state}, held {other.held}"
                )
            assert other.state not in ("rollback_pending", "restoring"), (
                f"apply to {job.node} while {other.name} is being restored"
            )

    def check_job_id(self, job: SendJob) -> None:
        first = self.payloads.setdefault(job.job_id, job)
        assert first == job, f"job id {job.job_id} carries two payloads"

    @invariant()
    def statuses_are_named_after_their_rollouts(self) -> None:
        for name, status in self.w.statuses.items():
            assert status.name == name


def _node(status: RolloutStatus, name: str) -> NodeRecord | None:
    return next((n for n in status.nodes if n.name == name), None)


EngineMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEngineProperties = EngineMachine.TestCase
