"""What the agents and Prometheus say, asked once a pass: the ``observe``
step, the ``send`` step's dispatch, and the held reads kept in flight
between passes while ``serve`` runs.

``Observer`` is handed its soft state (``AgentMemory``: how long each agent
has been unreachable, the metric answers folded so far, the jobs whose held
reads are in flight), which a restart may forget, and keeps only caches of
its own (finished records, which an agent never changes; inert statuses;
the fleet's nodes by name). Each call takes the pass's values, the fleet
among them, and returns what it saw.

Must not: decide anything (the engine judges what is seen), read Git, or
keep rollout state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from reconciler.daemon.agent_client import AgentClient, HeartbeatWatch
from reconciler.daemon.alertmanager_client import AlertmanagerClient
from reconciler.daemon.answer_check import AnswerCheck
from reconciler.daemon.canary_readings import CanaryReadings, SoakMemory
from reconciler.daemon.crashpoints import CrashPoints
from reconciler.daemon.inert import InertStatuses
from reconciler.daemon.logs import EventLog
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.prometheus_client import PrometheusClient
from reconciler.daemon.range_queries import RangeQueries
from reconciler.engine import canary_queries
from reconciler.engine import step as engine
from reconciler.engine.health_evidence import fold_metric_answer
from reconciler.engine.queries import stage_deadlines
from reconciler.protocol.effects import SendJob
from reconciler.protocol.long_poll import DAEMON_WAIT_SECONDS, heartbeat_content
from reconciler.protocol.observations import (
    Backup,
    Heartbeat,
    JobObservation,
    MetricCheck,
    Observations,
)
from reconciler.spec.health import for_node
from reconciler.spec.model import Fleet, Node, Settings
from reconciler.spec.rollout_status import RolloutStatus
from reconciler.spec.times import parse_time

# A job whose held read is in flight, and whose agent answered it accepted
# or running less than this ago, is not asked by the passes: its held read
# answers when it finishes. An agent that stops answering is still seen
# within this plus the agent timeout, as a plain read would see it.
HELD_ANSWER_SECONDS = 5.0
SOAK_MARGIN = 0.2  # seconds past a soak's end a held heartbeat read answers

Report = Callable[..., None]  # (event, message, **fields): a standing problem, logged once


@dataclass(frozen=True)
class Observed:
    """What one ``observe`` saw."""

    observations: Observations
    lively: list[RolloutStatus]  # the statuses observed: those not inert
    unfinished: list[tuple[str, SendJob]]  # jobs the agents said are not finished yet
    watching: bool  # there were jobs, heartbeats or backups to read
    held_until: datetime | None  # when the first job left to its held read is asked again
    soak_end: datetime | None = None  # when the first comparison's soak under way ends


@dataclass
class _JobReads:
    """The job part of one observation, while it is gathered."""

    observed: dict[str, JobObservation] = field(default_factory=dict)
    reachable: dict[str, bool] = field(default_factory=dict)
    unverified: dict[str, str] = field(default_factory=dict)


@dataclass
class AgentMemory:
    """The observer's soft state, forgotten on restart at no cost but a
    read: a restart can delay a decision (an ``offline`` node, a check's
    run of answers), never bring one forward."""

    unreachable: dict[str, datetime] = field(default_factory=dict)  # node -> first failed contact
    # (node, check) -> what Prometheus has shown for the node's current job
    metric_checks: dict[tuple[str, str], MetricCheck] = field(default_factory=dict)
    # job id -> when its agent last answered it accepted or running: not
    # asked while its held read is in flight (see HELD_ANSWER_SECONDS)
    held_jobs: dict[str, datetime] = field(default_factory=dict)


class Observer:
    """Asks the agents and Prometheus for one pass, and sends its jobs.
    Every call takes the fleet it acts for; the soft state is handed in."""

    def __init__(
        self,
        client: AgentClient,
        *,
        clock: Callable[[], datetime],
        log: EventLog,
        metrics: Metrics,
        report: Report,
        prometheus: PrometheusClient,
        memory: AgentMemory,
        answers: AnswerCheck,
        soaks: SoakMemory,
        alertmanager: AlertmanagerClient | None = None,
        range_queries: RangeQueries | None = None,
        crash_points: CrashPoints | None = None,
    ) -> None:
        self.client = client
        self.crash_points = crash_points or CrashPoints()
        self.clock = clock
        self.log = log
        self.metrics = metrics
        self.report = report
        self.prometheus = prometheus
        self.alertmanager = alertmanager or AlertmanagerClient()
        self.memory = memory
        self.answers = answers  # agentKeys parsed, by line; the newest heartbeat believed
        self.canary = CanaryReadings(range_queries or RangeQueries(), clock, soaks)
        # Caches, dropped with the observer (``run --plain``: every pass).
        # job id -> its record once succeeded: an agent never changes a
        # finished record, and a node soaking its checks would otherwise be
        # asked every pass
        self.finished_jobs: dict[str, JobObservation] = {}
        self.inert = InertStatuses()  # statuses that ask nothing
        self._fleet: Fleet | None = None  # the fleet of the call in progress
        self.nodes: Mapping[str, Node] = {}  # its nodes by name

    @property
    def unreachable(self) -> Mapping[str, datetime]:
        return self.memory.unreachable

    @property
    def metric_checks(self) -> Mapping[tuple[str, str], MetricCheck]:
        return self.memory.metric_checks

    def _take(self, fleet: Fleet) -> None:
        """The fleet this call acts for: a new one's agent keys and
        certificate pins are taken before any job goes to it; the same
        fleet again changes nothing."""
        if self._fleet is fleet:
            return
        self._fleet = fleet
        self.nodes = fleet.by_name()
        self.client.set_pins(
            {n.agent: n.agent_cert_sha256 for n in fleet.nodes if n.agent_cert_sha256}
        )
        self.answers.use_fleet(dict(self.nodes))

    # -- observe -------------------------------------------------------------

    def observe(
        self,
        statuses: Mapping[str, RolloutStatus],
        changed: Iterable[str] | None,
        fleet: Fleet,
        settings: Settings,
        *,
        every: bool = False,
        starting_alerts: Mapping[str, tuple[str, ...]] | None = None,
    ) -> Observed:
        """Ask ``fleet``'s agents about the statuses that are not inert
        (judged again only for ``changed``, None: all; ``every``: look at
        all of them): unfinished jobs (resending those the agents do not
        know), heartbeats, backup lists, and Prometheus checks."""
        self._take(fleet)
        if every:
            lively = list(statuses.values())
        elif changed is None:
            lively = self.inert.lively(statuses)
        else:
            lively = self.inert.lively_changed(statuses, set(changed))
        now = self.clock()
        in_flight = engine.in_flight(lively)
        wanted_heartbeats = engine.wanted_heartbeats(lively)
        wanted_backups = engine.wanted_backups(lively)
        reads = _JobReads()
        jobs, asked, waiting, held_until = self._read_jobs(lively, in_flight, now, reads)
        heartbeats = self._read_heartbeats(wanted_heartbeats, reads)
        backups = self._read_backups(wanted_backups, reads)
        unreachable = self.memory.unreachable
        for node, ok in reads.reachable.items():
            if ok:
                unreachable.pop(node, None)
            else:
                unreachable.setdefault(node, now)
        unfinished = [
            (url, job)
            for url, job in jobs
            if job.job_id in waiting
            or (
                (seen := reads.observed.get(job.job_id)) is not None
                and seen.state in ("accepted", "running")
            )
        ]
        observations = Observations(
            jobs=reads.observed,
            heartbeats=heartbeats,
            unreachable_since=dict(unreachable),
            backups=backups,
            unverified=reads.unverified,
        )
        prometheus_url = settings.prometheus_url
        metric_checks = self._ask_prometheus(lively, observations, prometheus_url)
        if metric_checks:
            observations = replace(observations, metric_checks=metric_checks)
        observations = self._ask_canary(
            lively, observations, prometheus_url, settings.alertmanager_url, starting_alerts or {}
        )
        # Alerts asked change by themselves: no pass is quiet while any are.
        watching = bool(asked or wanted_heartbeats or wanted_backups or observations.alerts)
        soak_end = self.canary.next_soak_end
        return Observed(observations, lively, unfinished, watching, held_until, soak_end)

    def _address(self, node: str) -> str | None:
        spec = self.nodes.get(node)
        return spec.agent if spec is not None else None

    def _read_jobs(
        self,
        statuses: Sequence[RolloutStatus],
        in_flight: Sequence[SendJob],
        now: datetime,
        reads: _JobReads,
    ) -> tuple[list[tuple[str, SendJob]], bool, set[str], datetime | None]:
        """Read every unfinished job into ``reads``; resend those the agent
        does not know (same id, same payload, fresh signature). Returns the
        jobs with an address, whether any was asked, the jobs left to their
        held reads, and until when."""
        finished = self.finished_jobs
        wanted_ids = {job.job_id for job in in_flight}
        for job_id in [j for j in finished if j not in wanted_ids]:
            del finished[job_id]
        observed = reads.observed
        observed.update(
            (job.job_id, finished[job.job_id]) for job in in_flight if job.job_id in finished
        )
        jobs = [
            (url, job)
            for job in in_flight
            if job.job_id not in finished and (url := self._address(job.node))
        ]
        # Finished records the held reads brought are the answers a read
        # would get now (an agent never changes a finished record). Jobs
        # waiting on their held reads are not asked (``_waiting_on_held``).
        held, in_wait = self.client.take_held(job.job_id for _, job in jobs)
        waiting, held_until = self._waiting_on_held(statuses, jobs, in_wait, now)
        asked = [
            (url, job) for url, job in jobs if job.job_id not in held and job.job_id not in waiting
        ]
        answers: dict[str, JobObservation | None] = {**held, **self.client.read_jobs(asked)}
        unknown: list[tuple[str, SendJob]] = []
        for url, job in jobs:
            job_id, seen = job.job_id, answers.get(job.job_id)
            if job_id in waiting:
                continue  # not observed this pass
            if seen is None:
                unknown.append((url, job))
                reads.reachable[job.node] = True
                continue
            seen = self._believed(job.node, seen, reads)
            if seen.state in ("accepted", "running"):
                self.memory.held_jobs[job_id] = now
            observed[job_id] = seen
            reachable = reads.reachable.get(job.node, False) or seen.state != "unreachable"
            reads.reachable[job.node] = reachable
            if seen.state == "succeeded" and job.kind == "apply":
                finished[job_id] = seen
        if unknown:
            node_of = {job.job_id: job.node for _, job in unknown}
            for job_id, answer in self.client.send_jobs(unknown, now).items():
                observed[job_id] = self._believed(node_of[job_id], answer, reads)
            self.log.info("resent", f"{len(unknown)} job(s) the agents did not know, sent again")
            self.metrics.jobs_sent.labels(kind="resend").inc(len(unknown))
        return jobs, bool(asked), waiting, held_until

    def _believed(self, node: str, seen: JobObservation, reads: _JobReads) -> JobObservation:
        seen, problem = self.answers.job(self.nodes.get(node), seen)
        if problem:
            self._unverified(node, "job", problem, reads.unverified)
        return seen

    def _read_heartbeats(self, wanted: Sequence[str], reads: _JobReads) -> dict[str, Heartbeat]:
        """The heartbeats wanted, believed or not, into ``reads``."""
        # Heartbeats read right after a held read saw a live apply succeed
        # are newer than that job, as a read now would be: the others are asked.
        read_ahead: dict[str, Heartbeat | None] = dict(self.client.take_heartbeats(wanted))
        nodes = [(url, n) for n in wanted if n not in read_ahead and (url := self._address(n))]
        heartbeats: dict[str, Heartbeat] = {}
        for node, beat in {**read_ahead, **self.client.read_heartbeats(nodes)}.items():
            if beat is not None:
                beat, problem = self.answers.heartbeat(self.nodes.get(node), beat)
                if problem:
                    self._unverified(node, "heartbeat", problem, reads.unverified)
            if beat is not None:
                heartbeats[node] = beat
            reads.reachable[node] = reads.reachable.get(node, False) or beat is not None
        return heartbeats

    def _read_backups(
        self, wanted: Sequence[str], reads: _JobReads
    ) -> dict[str, tuple[Backup, ...]]:
        """The backup lists wanted and believed; the others are reported."""
        nodes = [(url, n) for n in wanted if (url := self._address(n))]
        backups: dict[str, tuple[Backup, ...]] = {}
        for node, listed in self.client.read_backups(nodes).items():
            if listed is None:
                continue
            believed, problem = self.answers.backups(self.nodes.get(node), listed)
            if believed is None:
                self._unverified(node, "backups", problem, reads.unverified)
            else:
                backups[node] = believed.backups
        return backups

    def _waiting_on_held(
        self,
        statuses: Sequence[RolloutStatus],
        jobs: Sequence[tuple[str, SendJob]],
        in_wait: set[str],
        now: datetime,
    ) -> tuple[set[str], datetime | None]:
        """The jobs left unobserved this pass, and when the first of them is
        asked again: applies and stage jobs whose held read is in flight and
        whose agent answered them accepted or running less than
        HELD_ANSWER_SECONDS ago. The engine judges an unobserved one as accepted or running (it
        waits for it) as long as its deadline has not passed and its node is
        not counted unreachable (a node gone from the fleet is not asked
        either way); any other job is asked. Nothing is believed without a
        read: an answer that is not evidence is found when it is read, at
        its finish or once it is this old."""
        kept = self.memory.held_jobs
        for job_id in [j for j in kept if j not in in_wait]:
            del kept[job_id]
        if not kept:
            return set(), None
        deadlines = {
            record.job_id: record.deadline
            for status in statuses
            for record in status.nodes
            if record.state == "dispatched" and record.job_id in kept
        }
        deadlines.update(stage_deadlines(statuses, kept))
        waiting: set[str] = set()
        until: datetime | None = None
        for _, job in jobs:
            since = kept.get(job.job_id)
            deadline = deadlines.get(job.job_id)
            if (
                since is None
                or (now - since).total_seconds() >= HELD_ANSWER_SECONDS
                or job.kind not in ("apply", "stage")
                or deadline is None
                or now >= deadline
                or job.node in self.memory.unreachable
            ):
                continue
            waiting.add(job.job_id)
            expires = since + timedelta(seconds=HELD_ANSWER_SECONDS)
            until = expires if until is None or expires < until else until
        return waiting, until

    def left_to_held_reads(
        self, seen: Observed, lively: Sequence[RolloutStatus]
    ) -> tuple[bool, datetime | None]:
        """After a pass that observed ``seen`` and whose step left ``lively``
        (the statuses not inert): whether a pass now would observe nothing
        at all, and until when at the latest (the first held answer to grow
        too old to stand in for a read). So it is when every job in flight
        in ``lively`` waits on its held read (``_waiting_on_held``; a
        finished record whose gathered wake-up is still to come counts as
        held), none of them was observed by ``seen`` or is a finished
        record kept here, and neither ``seen`` nor ``lively`` reads
        heartbeats, backup lists, Prometheus or Alertmanager. What ends the
        wait is news the client reports (``has_news``)."""
        obs = seen.observations
        if (
            obs.heartbeats
            or obs.backups
            or obs.metric_checks
            or obs.canary
            or obs.alerts
            or obs.unverified
            or seen.soak_end is not None
            or engine.wanted_heartbeats(lively)
            or engine.wanted_backups(lively)
            or engine.wanted_metric_checks(lively)
            or canary_queries.wanted_alerts(lively)
            or next(canary_queries.wanted_nodes(lively), None) is not None
        ):
            return False, None
        in_flight = engine.in_flight(lively)
        if any(job.job_id in obs.jobs or job.job_id in self.finished_jobs for job in in_flight):
            return False, None
        jobs = [(url, job) for job in in_flight if (url := self._address(job.node))]
        if not jobs:
            return True, None
        waiting, until = self._waiting_on_held(lively, jobs, self.client.awaited(), self.clock())
        return len(waiting) == len(jobs), until

    def _unverified(self, node: str, kind: str, problem: str, found: dict[str, str]) -> None:
        """An answer not believed: counted, logged once per problem, and
        handed to the engine, which names the node in a status condition."""
        found.setdefault(node, problem)
        self.metrics.unverified_answers.labels(kind=kind).inc()
        self.report(
            "unverified_evidence",
            f"answer ({kind}) of node {node} is no evidence: {problem}",
            node=node,
        )

    def _ask_prometheus(
        self,
        statuses: Iterable[RolloutStatus],
        observed: Observations,
        url: str | None,
    ) -> dict[tuple[str, str], MetricCheck]:
        """Ask Prometheus each prometheus check of every node whose job has
        finished successfully and fold the answers into ``metric_checks``;
        those of checks no longer wanted are dropped."""
        wanted = [
            (node, job_id, check)
            for node, job_id, check in engine.wanted_metric_checks(statuses)
            if (job := observed.jobs.get(job_id)) is not None and job.state == "succeeded"
        ]
        memory = self.memory.metric_checks
        keep = {(node, check.name) for node, _, check in wanted}
        for key in [k for k in memory if k not in keep]:
            del memory[key]
        if not wanted or url is None:
            return dict(memory)
        queries = {
            (node, check.name): for_node(check.prometheus.query, node)
            for node, _, check in wanted
            if check.prometheus is not None
        }
        answers = self.prometheus.query_all(url, queries.values())
        now = self.clock()
        for node, job_id, check in wanted:
            key = (node, check.name)
            memory[key] = fold_metric_answer(
                memory.get(key), check, job_id, answers[queries[key]], now
            )
        # Logged when a run of answers without evidence begins, not every pass.
        for (node, name), state in memory.items():
            if state.error_since == now:
                self.log.warning(
                    "prometheus_error",
                    f"check {name} of node {node} has no evidence: {state.detail}",
                    url=url,
                )
        return dict(memory)

    def _ask_canary(
        self,
        statuses: Sequence[RolloutStatus],
        observed: Observations,
        prometheus_url: str | None,
        alertmanager_url: str | None,
        starting: Mapping[str, tuple[str, ...]],
    ) -> Observations:
        """The comparisons' soaks and verdicts, and Alertmanager's answers
        for every rollout declaring alerts that runs or may start now."""
        watches = self.canary.observe(statuses, observed, self.nodes, prometheus_url)
        wanted = {**starting, **canary_queries.wanted_alerts(statuses)}
        alerts = {}
        if wanted and alertmanager_url is not None:
            answers = self.alertmanager.ask_all(alertmanager_url, wanted.values())
            alerts = {name: answers[matchers] for name, matchers in wanted.items()}
        if not watches and not alerts:
            return observed
        return replace(observed, canary=watches, alerts=alerts)

    # -- send ----------------------------------------------------------------

    def send(
        self,
        effects: Iterable[SendJob],
        fleet: Fleet,
        now: datetime,
        wake: Callable[[], None] | None,
    ) -> int:
        """Send the jobs the committed status records to ``fleet``'s agents, all at once. Their
        answers are not needed: the next pass reads every unfinished job
        anyway, but one accepted or running spares that read while the
        job's held read is in flight (``held_jobs``).
        Crash point ``mid_send``: half of the answers are in."""
        self._take(fleet)
        nodes = self.nodes
        jobs = [(nodes[job.node].agent, job) for job in effects if job.node in nodes]
        if not jobs:
            return 0
        answers = self.client.send_jobs(
            jobs, now, halfway=lambda: self.crash_points.reach("mid_send"), on_finished=wake
        )
        # The answers came after ``now`` (the step's), by the commit's and the
        # send's time, seconds under load: they are counted from when all are in.
        answered = self.clock()
        lines: list[tuple[str, str, dict[str, str]]] = []
        for url, job in jobs:
            answer = answers.get(job.job_id)
            if answer is not None and answer.state in ("accepted", "running"):
                # Taken: it need not be asked while its held read is in flight.
                self.memory.held_jobs[job.job_id] = answered
            lines.append(
                (
                    "sent",
                    f"{job.kind} attempt {job.attempt}: "
                    f"{answer.state if answer else 'unreachable'}",
                    {
                        "rollout": job.rollout,
                        "node": job.node,
                        "job": job.job_id,
                        "commit": job.source_commit[:12],
                        "agent": url,
                    },
                )
            )
        self.log.info_many(lines)
        for kind, count in Counter(job.kind for _, job in jobs).items():
            self.metrics.jobs_sent.labels(kind=kind).inc(count)
        return len(jobs)

    # -- held reads ----------------------------------------------------------

    def watch(
        self,
        seen: Observed,
        changed: Mapping[str, RolloutStatus],
        effects: Sequence[SendJob],
        fleet: Fleet,
        wake: Callable[[], None],
    ) -> None:
        """While ``serve`` runs, keep a held read in flight for every job
        sent and not finished, so that a pass starts as soon as one finishes
        rather than at the interval; and a held heartbeat read for every
        live node whose apply is seen succeeded and still waits for its
        verdict (checks and their soak, docs/health.md), so that a pass
        starts when its heartbeat changes, or when its soak should end.
        The passes still read those heartbeats as before."""
        self._take(fleet)
        nodes = self.nodes
        sent = [(nodes[job.node].agent, job) for job in effects if job.node in nodes]
        self.client.watch_jobs(seen.unfinished + sent, wake)
        self.client.watch_heartbeats(self._heartbeat_watches(seen, changed), wake)

    def stop_watching(self) -> None:
        """No held reads outlive the loop."""
        self.client.watch_jobs([], lambda: None)
        self.client.watch_heartbeats([], lambda: None)

    def _heartbeat_watches(
        self, seen: Observed, changed: Mapping[str, RolloutStatus]
    ) -> list[HeartbeatWatch]:
        watches: list[HeartbeatWatch] = []
        # A status with a dispatched node is lively (it has a job in flight)
        # or was just changed: the thousands of inert ones are not looked at.
        candidates = {status.name: status for status in seen.lively}
        candidates.update(changed)
        jobs, heartbeats = seen.observations.jobs, seen.observations.heartbeats
        for status in candidates.values():
            frozen = status.frozen
            if frozen is None or not frozen.live or status.phase not in ("running", "paused"):
                continue
            soak = frozen.health.soak if frozen.health is not None else 0
            for record in status.nodes:
                if record.state != "dispatched":
                    continue  # most records: looked up no further
                job = jobs.get(record.job_id or "")
                beat = heartbeats.get(record.name)
                spec = self.nodes.get(record.name)
                if job is None or job.state != "succeeded" or beat is None or spec is None:
                    continue
                watches.append(
                    HeartbeatWatch(
                        spec.agent,
                        record.name,
                        beat.time,
                        heartbeat_content(beat),
                        _until_soaked(beat, record.job_id or "", soak),
                    )
                )
        return watches


def _until_soaked(beat: Heartbeat, job_id: str, soak: int) -> float:
    """Seconds (agent clock) from ``beat`` until every agent check of
    ``job_id`` it reports has held for ``soak``, if all hold now; else the
    daemon's usual wait. A little over, so the answer shows it soaked."""
    checks = [c for c in beat.checks if c.job_id == job_id]
    if not checks or not all(c.ok and c.ok_since for c in checks):
        return float(DAEMON_WAIT_SECONDS)
    try:
        at = parse_time(beat.time)
        since = max(parse_time(c.ok_since or "") for c in checks)
    except ValueError:
        return float(DAEMON_WAIT_SECONDS)
    left = (since + timedelta(seconds=soak) - at).total_seconds()
    return min(max(left + SOAK_MARGIN, SOAK_MARGIN), float(DAEMON_WAIT_SECONDS))


__all__ = ["HELD_ANSWER_SECONDS", "AgentMemory", "Observed", "Observer"]
