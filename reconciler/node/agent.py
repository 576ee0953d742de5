"""The node agent: verifies signed jobs, applies them to a runtime's config
(dry-run or live), keeps backups, restores them, stages model artifacts,
and reports heartbeats (docs/protocol.md). This module admits jobs and
answers HTTP; ``journal`` keeps the records, ``job_runner`` runs the jobs,
``recovery`` fails what a previous run left unfinished.

Life of a posted job::

    admission checks (admission.admit_job)  -> 4xx, nothing written
    a live apply whose artifacts are not held -> 409 not_staged, nothing written
    journal record "accepted", fsynced      -> 202
    job worker:    "running" with the config digests before and after, in
                   memory only (see ``recovery``)
                   drain command and the wait for idle, when the job drains
                   backup of the old bytes naming the job, fsynced
                   new config (atomic rename), fsynced
                   after-apply command, then the warm-up requests; if either
                   fails the old bytes (and mode) go back and the job fails
                   undrain command, when drained
                   -> "succeeded" / "failed", fsynced
    (a stage job instead fetches its artifacts into the store, on the
    stage worker)

A live apply costs the durable writes its promises need and no more: the
record behind a 202 (one file and one directory fsync), the backup before
the config is replaced (two files, one directory fsync), the config before
"succeeded", and the verdict before it is shown.

Applies and restores run one at a time, in the order accepted, on the job
worker; stage jobs likewise on a stage worker of their own, so a download
never delays an apply or a restore. A job id is executed at most
once: the journal is written before anything runs, and on start an agent
turns every record it finds "accepted" or "running" into "failed", saying
whether the config was left old or new. The config is never torn, since it
is only ever replaced by rename.

Must not: trust anything unsigned; write outside its state directory (the
after-apply command is the operator's); decide anything about rollouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import socket
import ssl
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from reconciler import __version__
from reconciler.node.agent_config import (
    DEFAULT_AFTER_APPLY_TIMEOUT,
    DEFAULT_KEEP_ARTIFACTS,
    DEFAULT_KEEP_FIRST_BACKUPS,
    DEFAULT_RETENTION,
    AgentConfig,
)
from reconciler.node.agent_log import AgentLog
from reconciler.node.agent_metrics import AgentMetrics
from reconciler.node.artifact_store import ArtifactStore
from reconciler.node.http_server import HttpServer, Request, Response, json_response
from reconciler.node.job_runner import JobRunner
from reconciler.node.journal import Journal
from reconciler.node.probes import Prober
from reconciler.node.recovery import recover
from reconciler.node.runtime_config import TARGET_FIELDS, JobFailed, ParsedConfigs
from reconciler.node.standby_switch import StandbySwitch
from reconciler.node.state_dir import JobRecord, StateDir, digest
from reconciler.protocol.admission import admit_job
from reconciler.protocol.evidence import sign_answer
from reconciler.protocol.h11_server import Answer
from reconciler.protocol.http_routes import Params, Route, RouteHandler, RouteTable
from reconciler.protocol.job_view import JobPayload, read_job
from reconciler.protocol.long_poll import FINISHED_JOB_STATES, newer_than, wait_seconds
from reconciler.protocol.observations import signed_list_asked
from reconciler.protocol.signing import JobRefused
from reconciler.spec.times import format_time, parse_time

__all__ = [
    "DEFAULT_AFTER_APPLY_TIMEOUT",
    "DEFAULT_KEEP_ARTIFACTS",
    "DEFAULT_KEEP_FIRST_BACKUPS",
    "DEFAULT_RETENTION",
    "Agent",
    "AgentConfig",
    "managed_runtimes",
    "serve",
]


# Jobs that change nothing the checks look at: the checks of the runtime's
# newest apply go on (a release stops only the slot that does not serve;
# an eval job only asks the runtime).
CHECKS_KEEP = frozenset({"stage", "release", "eval"})


def _now() -> datetime:
    return datetime.now(UTC)


class Agent:
    """One node's agent: ``handle`` serves the protocol, a worker thread
    runs jobs (``job_runner``), the journal keeps their records."""

    def __init__(
        self,
        config: AgentConfig,
        state: StateDir,
        clock: Callable[[], datetime] = _now,
        log: AgentLog | None = None,
    ) -> None:
        self.config = config
        self.state = state
        self.clock = clock
        self.log = log or AgentLog()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-job")
        self._worker.submit(int)  # its thread starts now, not in the first job's POST
        # Downloads on their own worker: a slow or hostile artifact server
        # never delays an apply or a restore (a rollback's above all).
        self._stage_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-stage")
        self.journal = Journal(state, clock)
        self.configs = ParsedConfigs()
        put_back = recover(self.journal, state)
        self.prober = Prober(clock, on_change=self.journal.heartbeat_changed)
        self.store = ArtifactStore(state.root)
        self.metrics = AgentMetrics(
            self.prober.reports, state.list_backups, config.runtimes, self.store.bytes_held
        )
        self.runner = JobRunner(
            config,
            state,
            self.journal,
            self.configs,
            self.prober,
            self.log,
            self.metrics,
            self.store,
        )
        for record in put_back:
            self.runner.serve_previous(record)
        if self.runner.slots is not None:
            self._recover_slots(self.runner.slots)
        self._resume_probes()
        self.compact()

    def _recover_slots(self, slots: StandbySwitch) -> None:
        """Stop the slot a killed agent was switching to, so the recorded
        slot serves; the job's record says so."""
        for job_id, said in slots.recover(self.config.runtimes).items():
            record = self.journal.jobs.get(job_id)
            if record is not None:
                self.journal.update(record, error=(record.error or "") + said)

    @property
    def jobs(self) -> dict[str, JobRecord]:
        """Every job record the agent keeps, by job id."""
        return self.journal.jobs

    def _resume_probes(self) -> None:
        """After a restart, probe again the checks of each runtime's newest
        job when it was a successful live apply carrying checks (from
        scratch: a restart never lengthens a run of successes)."""
        newest: dict[str, JobRecord] = {}
        for record in self.journal.jobs.values():
            if record.job.kind in CHECKS_KEEP:
                continue
            runtime = record.job.target.runtime
            known = newest.get(runtime)
            if known is None or parse_time(record.accepted_at) > parse_time(known.accepted_at):
                newest[runtime] = record
        for runtime, record in newest.items():
            self.journal.newest_job[runtime] = record.job_id
            self.runner.probe_after(runtime, record)

    def close(self) -> None:
        self.runner.stager.stop()  # a download under way ends at its next byte or pause
        self._stage_worker.shutdown(wait=True)
        self._worker.shutdown(wait=True)
        self.prober.close()
        self.runner.close()

    def compact(self) -> int:
        """Drop journal records whose payload expired long ago (``Journal.compact``)."""
        return self.journal.compact()

    # -- the protocol ----------------------------------------------------------------

    def _json(self, status: int, answer: dict[str, Any]) -> Response:
        """An answer object, signed with the agent's key when it has one."""
        return json_response(status, sign_answer(answer, self.config.key))

    def _error(self, status: int, code: str, message: str) -> Response:
        return self._json(status, {"error": code, "message": message})

    def handle(self, request: Request) -> Answer:
        return self.routes.answer(request)

    @functools.cached_property
    def routes(self) -> RouteTable:
        """The protocol's endpoints; the node's own are behind ``_this_node``."""
        get, post = frozenset({"GET"}), frozenset({"POST"})
        this_node = self._this_node
        return RouteTable(
            [
                Route(get, "/metrics", self._metrics),
                Route(None, "/metrics", self._metrics_get_only),
                # Any node: admission names the node a job is for.
                Route(post, "/v1/nodes/{node}/jobs", self._post_job),
                Route(get, "/v1/nodes/{node}/jobs/{job}", this_node(self._get_job)),
                Route(get, "/v1/nodes/{node}/heartbeat", this_node(self._get_heartbeat)),
                Route(get, "/v1/nodes/{node}/backups", this_node(self._get_backups)),
                Route(None, "/v1/nodes/{node}/{rest...}", this_node(self._no_such_endpoint)),
            ],
            missing=self._no_such_path,
        )

    def _this_node(self, handler: RouteHandler) -> RouteHandler:
        """``handler`` for this agent's node; 404 for any other."""

        def on_this_node(request: Request, params: Params) -> Answer:
            if params["node"] != self.config.node:
                return self._error(
                    404,
                    "unknown_node",
                    f"this agent serves node {self.config.node}, not {params['node']}",
                )
            return handler(request, params)

        return on_this_node

    def _metrics(self, request: Request, params: Params) -> Response:
        # Prometheus text; scrapers read it whatever the Content-Type says.
        return Response(200, self.metrics.text())

    def _metrics_get_only(self, request: Request, params: Params) -> Response:
        return self._error(405, "method_not_allowed", "GET /metrics only")

    def _no_such_path(self, request: Request, params: Params) -> Response:
        return self._error(404, "not_found", f"no such endpoint: {request.path}")

    def _no_such_endpoint(self, request: Request, params: Params) -> Response:
        return self._error(404, "not_found", f"no such endpoint: {request.method} {request.path}")

    def _post_job(self, request: Request, params: Params) -> Response:
        return self.post_job(request.body, params["node"])

    def _get_job(self, request: Request, params: Params) -> Answer:
        """A job's record; with ``wait``, held until it finishes."""
        job_id = params["job"]
        try:
            wait = wait_seconds(request.query)
        except ValueError as exc:
            return self._error(400, "bad_request", str(exc))
        with self.journal.lock:
            record = self.journal.jobs.get(job_id)
            if record is None:
                return self._error(404, "unknown_job", f"no job {job_id} on this node")
            if not wait or record.state in FINISHED_JOB_STATES:
                return self._json(200, record.public())
            woken = self.journal.hold_job(job_id)
        return self._held_job(job_id, woken, wait)

    def _get_heartbeat(self, request: Request, params: Params) -> Answer:
        """The heartbeat; with ``wait`` and ``newer``, held until it changes."""
        try:
            wait, newer = wait_seconds(request.query), newer_than(request.query)
        except ValueError as exc:
            return self._error(400, "bad_request", str(exc))
        if not wait or newer is None:
            return self._json(200, self.heartbeat())
        with self.journal.lock:
            changed = self.journal.beat_changed_at > parse_time(newer)
            if not changed:
                beat_woken = self.journal.hold_heartbeat()
        if changed:
            return self._json(200, self.heartbeat())
        return self._held_heartbeat(beat_woken, wait)

    def _get_backups(self, request: Request, params: Params) -> Response:
        listed = [b.public() for b in self.state.list_backups()]
        if signed_list_asked(request.query):
            # An object, unlike a bare list, carries evidence: it covers each jobId.
            return self._json(200, {"node": self.config.node, "backups": listed})
        return json_response(200, listed)

    async def _held_job(self, job_id: str, woken: asyncio.Future[None], wait: float) -> Response:
        """The job's record once it finished, or as it is when ``wait`` ends."""
        try:
            await _woken_or_timeout(woken, wait)
        finally:
            record = self.journal.release_job(job_id, woken)
        if record is None:
            return self._error(404, "unknown_job", f"no job {job_id} on this node")
        return self._json(200, record.public())

    async def _held_heartbeat(self, woken: asyncio.Future[None], wait: float) -> Response:
        """The heartbeat once it changed, or as it is when ``wait`` ends."""
        try:
            await _woken_or_timeout(woken, wait)
        finally:
            self.journal.release_heartbeat(woken)
        return self._json(200, self.heartbeat())

    def _refuse(self, status: int, code: str, message: str, envelope: Any = None) -> Response:
        """A job refused: logged, counted and answered."""
        payload = envelope.get("payload") if isinstance(envelope, dict) else None
        job_id = payload.get("jobId") if isinstance(payload, dict) else None
        job_id = job_id if isinstance(job_id, str) else None
        self.log.refused(status, code, message, job_id or "")
        self.metrics.refusals.labels(code=code).inc()
        # Signed over the job id it refuses: no other signed answer (a
        # heartbeat, another job's refusal) can pass for this refusal.
        refusal = {"error": code, "message": message, "node": self.config.node}
        return self._json(status, refusal if job_id is None else {**refusal, "jobId": job_id})

    def post_job(self, body: bytes, path_node: str) -> Response:
        try:
            envelope = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep
            return self._refuse(400, "invalid_job", "the body is not JSON")
        with self.journal.lock:
            try:
                payload = admit_job(
                    envelope,
                    node=self.config.node,
                    trusted=self.config.trusted,
                    now=self.clock(),
                    runtimes=self.config.runtimes,
                    allow_live=self.config.allow_live,
                    known=lambda job_id: (
                        r.payload if (r := self.journal.jobs.get(job_id)) else None
                    ),
                    path_node=path_node,
                )
            except JobRefused as refusal:
                return self._refuse(refusal.status, refusal.code, refusal.message, envelope)
            job = read_job(payload)
            known = self.journal.jobs.get(job.job_id)
            if known is not None:
                return self._json(200, known.public())
            if job.job_id in self.journal.dropped:
                return self._error(
                    409,
                    "already_executed",
                    f"job {job.job_id} ran here; its record was dropped from the "
                    f"journal at {self.journal.dropped[job.job_id]}, and it is not run again",
                )
            if job.standby and self.config.slots is None:
                return self._refuse(
                    422,
                    "standby_not_supported",
                    f"node {self.config.node} has no slots for a warm standby: its agent runs "
                    "without --slot-ports and the --slot-*-command options; roll out without "
                    "spec.standby, or give the agent slots (nothing was recorded)",
                    envelope,
                )
            missing = self._not_staged(job)
            if missing:
                return self._refuse(409, "not_staged", missing, envelope)
            record = JobRecord.admitted(job, format_time(self.clock()))
            try:
                self.journal.save(record)  # durable before the job can run or be acknowledged
            except OSError as exc:
                return self._refuse(
                    503, "journal_unwritable", f"cannot record the job: {exc.strerror}", envelope
                )
        if job.kind not in CHECKS_KEEP:
            # Checks of the runtime's previous job say nothing about this one.
            with self.journal.lock:
                self.journal.newest_job[job.target.runtime] = record.job_id
            self.prober.stop(job.target.runtime)
        self.log.accepted(job)
        self.metrics.jobs.labels(kind=job.kind, outcome="accepted").inc()
        worker = self._stage_worker if job.kind == "stage" else self._worker
        worker.submit(self.runner.run, record.job_id)
        return self._json(202, record.public())

    def _not_staged(self, job: JobPayload) -> str:
        """Why a live apply cannot run yet ("" when it can): an artifact it
        points the config to is not held, or its signed model directory was
        not verified here."""
        if job.kind != "apply" or not job.live:
            return ""
        missing = [a.name for a in job.artifacts if not self.store.holds(a.sha256, int(a.size))]
        if missing:
            return (
                f"artifact {', '.join(missing)} is not held on node {self.config.node}; "
                "a stage job must bring it first (nothing was recorded)"
            )
        signature = job.signature
        if signature and job.artifacts:
            models = self.runner.models
            model_dir = models.location(job.artifact_entries())
            signer = models.verified(model_dir, signature.sha256)
            if signer is None or signer not in {s.name for s in job.signers}:
                return (
                    f"the model directory {model_dir} was not verified against signature "
                    f"{signature.sha256[:12]}... on node {self.config.node}; a stage job "
                    "verifies it first (nothing was recorded)"
                )
        return ""

    def heartbeat(self) -> dict[str, Any]:
        runtimes = []
        for runtime in sorted(self.config.runtimes):
            current = self.state.read_config(runtime)
            if current is None:
                continue
            entry: dict[str, Any] = {"type": runtime}
            values: Mapping[str, Any]
            try:
                values = self.configs.values(runtime, current[0])
            except JobFailed as exc:
                values = {}
                entry["error"] = exc.message
            for key in TARGET_FIELDS:
                value = values.get(key)
                entry[key] = value if isinstance(value, str) else ""
            entry["configDigest"] = digest(current[0])
            runtimes.append(entry)
        beat: dict[str, Any] = {
            "node": self.config.node,
            "time": format_time(self.clock()),
            "agentVersion": __version__,
            "runtimes": runtimes,
        }
        checks = self.prober.reports()
        if checks:
            beat["checks"] = checks
        return beat


async def _woken_or_timeout(woken: asyncio.Future[None], wait: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(woken), wait)


# -- running it ---------------------------------------------------------------------


def managed_runtimes(
    given: Sequence[str] | None, state: StateDir, slotted: bool = False
) -> frozenset[str]:
    """``--runtime`` values, or the runtimes that have a config file already
    (``slotted``: slot configs are not runtimes of their own)."""
    return frozenset(given) if given else frozenset(state.runtime_names(slotted))


async def serve(
    agent: Agent,
    host: str,
    port: int,
    *,
    ready: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    tls: ssl.SSLContext | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Serve ``agent`` on ``host:port``, or on ``sock`` when one was handed over."""
    server = HttpServer(agent.handle, host, port, on_error=_print_error, tls=tls, sock=sock)
    await server.start()
    if ready is not None:
        ready(server.address)
    try:
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        await server.close()


def _print_error(exc: BaseException) -> None:
    print(f"agent: internal error: {exc!r}", file=sys.stderr)
