"""Many simulated node agents behind one port, for tests, benchmarks and the
demo. They speak the agent protocol (docs/protocol.md) with the real
agent's admission checks (``admission.admit_job``: same signature checks,
same refusal codes) and apply jobs in memory.

Each node follows a script, read from a behaviour file that is re-read when
it changes, so a test or the demo can change a node's behaviour mid-run::

    default: succeed                   # every node not listed below
    initial: {provider: sim, model: base-model, profile: default}
    nodes:
      sim-0002: {action: fail, error: "model not found"}
      sim-0003: {action: succeed, delay: 2, attempts: {"1": fail}}  # fail attempt 1 only
      sim-0004: {action: succeed, clockSkew: 300}                 # clock 5 minutes ahead
      sim-0005: drift

Actions (``action``, or the whole value as a string):

    succeed      finish the job after ``delay`` seconds (default 0)
    fail         finish it failed after ``delay``, with ``error``
    hang         accept the job and never finish it
    refuse       answer the POST with ``status`` (default 422), ``code``, ``message``
    drift        succeed, but live applies leave the config (and heartbeat) as it was
    unreachable  answer every request with 503
    disconnect   close the connection without answering
    error500     answer every request with 500
    garbage      answer every request with 200 and bytes that are not JSON
    stall        never answer (the client times out)
    impostor     answer as node ``as``: its heartbeat names that node, jobs are
                 refused with wrong_node

A node whose behaviour changes to unreachable, disconnect, error500,
garbage or stall (they fail every request) answers the reads it holds
(``?wait=``) so at once, as an agent that goes down drops them.

``attempts: {"N": behaviour}`` (keys quoted: YAML keys are text here)
overrides the behaviour for a job's attempt N, inheriting the node's settings;
the node's own behaviour is used for everything else (heartbeats, backups,
other attempts). ``names: [...]`` at the top replaces the generated names.

Health checks (docs/health.md): after a successful live apply that carried
checks, a node reports them in its heartbeat as the real agent would, probed
every ``intervalSeconds`` from the apply's end, with outcomes scripted per
check name (any check not named holds)::

      sim-0006: {action: succeed, checks: {ready: failing}}
      sim-0007: {checks: {ready: {okFor: 30}}}     # holds for 30 s, then fails
      sim-0008: {checks: {ready: {failFor: 20}}}   # fails for 20 s, then holds
      sim-0009: {attempts: {"2": {checks: {ready: ok}}}, checks: {ready: failing}}

The reports are computed from the clock when a heartbeat is asked for, so
thousands of nodes cost nothing between heartbeats.

Model artifacts (docs/rollouts.md): a live ``stage`` job holds its
artifacts once it finishes, after the time its download takes; an apply
whose artifacts are not all held is refused with ``not_staged``. A live
apply that carries artifacts, drain or warm-up reports ``timings``. Stage
outcomes, drain and warm-up times are scripted per node (seconds)::

      sim-0010: {stage: {rate: 50000000}}          # bytes/s: size / rate to download
      sim-0011: {stage: digest_mismatch}           # or no_space, download_failed
      sim-0012: {stage: {rate: 1e8, breakOnce: 2}} # the connection breaks once: 2 s
                                                   # more, then the node resumes and succeeds
      sim-0013: {drain: 1.5, warmup: 0.5}
      sim-0014: {stage: fetch}                     # really download each artifact and
                                                   # check its size and SHA-256

Warm standby (docs/rollouts.md#warm-standby): every simulated node has two
slots per runtime, ``a`` and ``b``, as an agent with slot commands. A live
apply with ``standby`` switches to the idle slot and keeps the previous one
warm, answering ``standby: {slot, serving}`` and timings with ``routedAt``;
a ``release`` job stops the warm slot (``released: {slot, stopped}``;
nothing to stop succeeds); a restore routes back to the warm slot when
there is one (``standby.warm: true``), else switches cold. Scripted::

      sim-0015: {slots: false}                     # refuses standby applies:
                                                   # 422 standby_not_supported
      sim-0016: {release: fail}                    # its releases fail (stop_failed)

Accepted jobs and their outcomes are appended to ``STATE/sim-journal.jsonl``
and replayed on start, so a job id is executed at most once even across a
restart of the simulator. ``GET /v1/sim/stats`` counts, per job id, how
often it was received (with a valid signature), how often executed, and how
many different payloads (send times aside) it came with.

An ``eval`` job (docs/evals.md) changes nothing: each of its
matchesBaseline cases is answered ``"MODEL says: PROMPT"`` with the model
the node's config names, so a baseline differs exactly when models do.

Must not be used as a real agent: it changes nothing outside its state
directory and keeps configs in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from reconciler import __version__
from reconciler.node.http_server import (
    BACKLOG,
    MAX_CONNECTIONS,
    HttpServer,
    Request,
    Response,
    error_response,
    json_response,
)
from reconciler.protocol.admission import admit_job
from reconciler.protocol.evidence import derived_agent_key, signed_answer_bytes
from reconciler.protocol.job_payload import SEND_TIME_FIELDS
from reconciler.protocol.long_poll import (
    FINISHED_JOB_STATES,
    newer_than,
    raise_open_files_limit,
    wait_seconds,
)
from reconciler.protocol.observations import signed_list_asked
from reconciler.protocol.signing import JobRefused, SigningKey, TrustedKey, canonical_json
from reconciler.simulation.download import fetch_and_check
from reconciler.spec.safe_yaml import YamlProblem, load_yaml
from reconciler.spec.times import format_time, parse_time

ACTIONS = frozenset(
    {
        "succeed",
        "fail",
        "hang",
        "refuse",
        "drift",
        "unreachable",
        "disconnect",
        "error500",
        "garbage",
        "stall",
        "impostor",
    }
)
# Actions that decide how a request is answered at all, whatever it asks.
TRANSPORT_ACTIONS = frozenset({"unreachable", "disconnect", "error500", "garbage", "stall"})
DEFAULT_INITIAL = {"provider": "sim", "model": "base-model", "profile": "default"}
JOURNAL_NAME = "sim-journal.jsonl"
RELOAD_INTERVAL = 0.25  # seconds between checks of the behaviour file
_JOURNAL_ENCODER = json.JSONEncoder(separators=(",", ":"))
FLUSH_DELAY = 0.05  # seconds an outcome may wait in the journal's buffer


# -- the script ----------------------------------------------------------------


@dataclass(frozen=True)
class CheckScript:
    """One check's scripted outcome: ``ok``, ``failing``, ``okFor`` (holds
    for ``seconds`` after the apply, then fails) or ``failFor`` (the reverse)."""

    mode: str = "ok"
    seconds: float = 0.0

    def holds(self, offset: float) -> bool:
        """Whether a probe ``offset`` seconds after the apply holds."""
        if self.mode == "ok":
            return True
        if self.mode == "failing":
            return False
        if self.mode == "okFor":
            return offset < self.seconds
        return offset >= self.seconds

    def current_run(self, last: int, interval: float) -> tuple[bool, int]:
        """(holds, index of its first probe) for the run of equal outcomes
        that probe ``last`` (0 at the apply's end) belongs to."""
        ok = self.holds(last * interval)
        if self.mode in ("ok", "failing"):
            return ok, 0
        switch = math.ceil(self.seconds / interval)  # the first probe of the second run
        return ok, 0 if last < switch else switch


STAGE_OUTCOMES = ("ok", "digest_mismatch", "no_space", "download_failed", "fetch")
# What a scripted no_space node says it has free, in bytes.
SIM_FREE_BYTES = 1024


@dataclass(frozen=True)
class StageScript:
    """How a node's stage jobs go: ``outcome``, the download ``rate`` in
    bytes per second (0: at once), and ``break_once`` seconds lost to one
    broken connection that the node resumes by itself."""

    outcome: str = "ok"
    rate: float = 0.0
    break_once: float = 0.0

    def download_seconds(self, size: int) -> float:
        return (size / self.rate if self.rate else 0.0) + self.break_once


@dataclass(frozen=True)
class Behaviour:
    action: str = "succeed"
    delay: float = 0.0
    error: str = "simulated failure"
    status: int = 422
    code: str = "refused"
    message: str = "simulated refusal"
    impersonate: str = ""
    clock_skew: float = 0.0  # seconds added to this node's clock
    checks: tuple[tuple[str, CheckScript], ...] = ()  # by check name; others hold
    stage: StageScript = StageScript()
    drain: float = 0.0  # seconds a live apply with drain waits for idle
    warmup: float = 0.0  # seconds its warm-up requests take
    slots: bool = True  # the node runs two slots per runtime (warm standby)
    release_fails: bool = False  # its release jobs fail with stop_failed

    def check_script(self, name: str) -> CheckScript:
        return next((s for n, s in self.checks if n == name), CheckScript())


@dataclass(frozen=True)
class NodeScript:
    behaviour: Behaviour = Behaviour()
    attempts: Mapping[int, Behaviour] = field(default_factory=dict)
    initial: Mapping[str, str] | None = None  # None: no config before the first apply

    def for_attempt(self, attempt: Any) -> Behaviour:
        return (
            self.attempts.get(attempt, self.behaviour) if type(attempt) is int else self.behaviour
        )


@dataclass(frozen=True)
class Script:
    default: NodeScript = NodeScript(initial=DEFAULT_INITIAL)
    nodes: Mapping[str, NodeScript] = field(default_factory=dict)
    names: tuple[str, ...] | None = None

    def for_node(self, name: str) -> NodeScript:
        return self.nodes.get(name, self.default)


class ScriptError(ValueError):
    pass


_BEHAVIOUR_KEYS = {
    "action",
    "delay",
    "error",
    "status",
    "code",
    "message",
    "as",
    "clockSkew",
    "attempts",
    "initial",
    "checks",
    "stage",
    "drain",
    "warmup",
    "slots",
    "release",
}


def _check_scripts(value: Any, where: str) -> tuple[tuple[str, CheckScript], ...]:
    if not isinstance(value, dict):
        raise ScriptError(
            f"{where}: map check names to ok, failing, {{okFor: S}} or {{failFor: S}}"
        )
    out = []
    for name, spec in value.items():
        if spec in ("ok", "failing"):
            out.append((str(name), CheckScript(spec)))
            continue
        if (
            isinstance(spec, dict)
            and len(spec) == 1
            and next(iter(spec)) in ("okFor", "failFor")
            and isinstance(next(iter(spec.values())), int | float)
            and next(iter(spec.values())) >= 0
        ):
            mode, seconds = next(iter(spec.items()))
            out.append((str(name), CheckScript(mode, float(seconds))))
            continue
        raise ScriptError(
            f"{where}.{name}: must be ok, failing, {{okFor: SECONDS}} or {{failFor: SECONDS}}"
        )
    return tuple(out)


def _behaviour(value: Any, where: str, base: Behaviour) -> Behaviour:
    if isinstance(value, str):
        value = {"action": value}
    if not isinstance(value, dict):
        raise ScriptError(f"{where}: a behaviour is an action name or a mapping, got {value!r}")
    unknown = set(value) - _BEHAVIOUR_KEYS
    if unknown:
        raise ScriptError(
            f"{where}: unknown keys {sorted(unknown)}; known: {sorted(_BEHAVIOUR_KEYS)}"
        )
    action = value.get("action", base.action)
    if action not in ACTIONS:
        raise ScriptError(f"{where}.action: {action!r} is not one of {sorted(ACTIONS)}")
    changes: dict[str, Any] = {"action": action}
    for key, attr, kind in (
        ("delay", "delay", (int, float)),
        ("clockSkew", "clock_skew", (int, float)),
        ("error", "error", str),
        ("code", "code", str),
        ("message", "message", str),
        ("as", "impersonate", str),
        ("status", "status", int),
        ("drain", "drain", (int, float)),
        ("warmup", "warmup", (int, float)),
    ):
        if key in value:
            if not isinstance(value[key], kind) or isinstance(value[key], bool):
                raise ScriptError(f"{where}.{key}: wrong type {type(value[key]).__name__}")
            changes[attr] = value[key]
    if "checks" in value:
        changes["checks"] = _check_scripts(value["checks"], f"{where}.checks")
    if "stage" in value:
        changes["stage"] = _stage_script(value["stage"], f"{where}.stage")
    if "slots" in value:
        if not isinstance(value["slots"], bool):
            raise ScriptError(f"{where}.slots: true or false")
        changes["slots"] = value["slots"]
    if "release" in value:
        if value["release"] not in ("ok", "fail"):
            raise ScriptError(f"{where}.release: ok or fail")
        changes["release_fails"] = value["release"] == "fail"
    behaviour = replace(base, **changes)
    if behaviour.delay < 0 or behaviour.drain < 0 or behaviour.warmup < 0:
        raise ScriptError(f"{where}: delay, drain and warmup must not be negative")
    if action == "refuse" and not 400 <= behaviour.status <= 499:
        raise ScriptError(f"{where}.status: a refusal is a 4xx status, got {behaviour.status}")
    if action == "impostor" and not behaviour.impersonate:
        raise ScriptError(f"{where}: impostor needs `as: OTHER-NODE`")
    return behaviour


def _stage_script(value: Any, where: str) -> StageScript:
    if isinstance(value, str):
        value = {"outcome": value}
    if not isinstance(value, dict) or not set(value) <= {"outcome", "rate", "breakOnce"}:
        raise ScriptError(f"{where}: an outcome name or {{outcome, rate, breakOnce}}")
    outcome = value.get("outcome", "ok")
    if outcome not in STAGE_OUTCOMES:
        raise ScriptError(f"{where}.outcome: {outcome!r} is not one of {list(STAGE_OUTCOMES)}")
    numbers = [value.get("rate", 0), value.get("breakOnce", 0)]
    if not all(isinstance(n, int | float) and not isinstance(n, bool) and n >= 0 for n in numbers):
        raise ScriptError(f"{where}: rate and breakOnce are numbers of at least 0")
    return StageScript(outcome, float(numbers[0]), float(numbers[1]))


def _initial(value: Any, where: str) -> Mapping[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"provider", "model", "profile"}:
        raise ScriptError(f"{where}: initial is null or {{provider, model, profile}}")
    if not all(isinstance(v, str) for v in value.values()):
        raise ScriptError(f"{where}: initial values must be text")
    return dict(value)


def _node_script(value: Any, where: str, base: NodeScript) -> NodeScript:
    behaviour = _behaviour(value, where, Behaviour())
    attempts: dict[int, Behaviour] = {}
    initial = base.initial
    if isinstance(value, dict):
        for key, spec in (value.get("attempts") or {}).items():
            try:
                number = int(key)
            except (TypeError, ValueError):
                raise ScriptError(f"{where}.attempts: {key!r} is not an attempt number") from None
            # An attempt's behaviour inherits the node's settings (delay, skew ...).
            attempts[number] = _behaviour(spec, f"{where}.attempts.{key}", behaviour)
        if "initial" in value:
            initial = _initial(value["initial"], f"{where}.initial")
    return NodeScript(behaviour, attempts, initial)


def parse_script(data: Any) -> Script:
    """A ``Script`` from a behaviour file's data; ``ScriptError`` says what is wrong."""
    if data is None:
        return Script()
    if not isinstance(data, dict):
        raise ScriptError("the behaviour file must be a mapping (default, initial, nodes, names)")
    unknown = set(data) - {"default", "initial", "nodes", "names"}
    if unknown:
        raise ScriptError(f"unknown top-level keys {sorted(unknown)}")
    initial = _initial(data.get("initial", DEFAULT_INITIAL), "initial")
    default = _node_script(data.get("default", "succeed"), "default", NodeScript(initial=initial))
    nodes_data = data.get("nodes") or {}
    if not isinstance(nodes_data, dict):
        raise ScriptError("nodes: must map node names to behaviours")
    nodes = {
        str(name): _node_script(spec, f"nodes.{name}", default) for name, spec in nodes_data.items()
    }
    names = data.get("names")
    if names is not None and (
        not isinstance(names, list) or not all(isinstance(n, str) and n for n in names)
    ):
        raise ScriptError("names: must be a list of node names")
    return Script(default, nodes, tuple(names) if names is not None else None)


def load_script(path: Path) -> Script:
    try:
        data = load_yaml(str(path), path.read_bytes())
    except OSError as exc:
        raise ScriptError(f"cannot read {path}: {exc.strerror}") from None
    except YamlProblem as exc:
        raise ScriptError(str(exc.problem)) from None
    try:
        return parse_script(data)
    except ScriptError as exc:
        raise ScriptError(f"{path}: {exc}") from None


# -- simulated nodes -------------------------------------------------------------


class SimJob:
    __slots__ = (
        "answer",
        "backup_id",
        "detail",
        "error",
        "evals",
        "extra",
        "finished_at",
        "payload",
        "state",
        "timings",
        "waiters",
    )

    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload
        self.answer: bytes | None = None  # the signed record; None when it changed since
        self.state = "accepted"
        self.error: str | None = None
        self.backup_id: str | None = None
        self.finished_at: str | None = None
        self.detail = ""
        self.timings: dict[str, str | None] | None = None
        self.evals: list[dict[str, Any]] | None = None  # an eval job's answers
        self.extra: dict[str, Any] = {}  # standby or released, on slots
        self.waiters: list[asyncio.Future[None]] = []  # held ``?wait=`` answers

    def record(self) -> dict[str, Any]:
        record = {
            "jobId": self.payload["jobId"],
            "state": self.state,
            "error": self.error,
            "backupId": self.backup_id,
            "finishedAt": self.finished_at,
            "sourceCommit": self.payload["sourceCommit"],
            "detail": self.detail,
        }
        if self.timings is not None:
            record["timings"] = self.timings
        if self.evals is not None:
            record["evals"] = self.evals
        record.update(self.extra)
        return record


class SimNode:
    __slots__ = (
        "artifacts",
        "backups",
        "beat_waiters",
        "changed_at",
        "config",
        "jobs",
        "name",
        "probing",
        "slots",
    )

    def __init__(self, name: str, initial: Mapping[str, str] | None, runtimes: list[str]) -> None:
        self.name = name
        self.config: dict[str, dict[str, str]] = (
            {runtime: dict(initial) for runtime in runtimes} if initial else {}
        )
        self.jobs: dict[str, SimJob] = {}
        self.backups: list[dict[str, str]] = []  # oldest first
        self.probing: dict[str, SimJob] = {}  # by runtime: the live apply whose checks run
        # Held ``?newerThan=&wait=`` heartbeat reads; when a job last finished
        # here (simulated checks move with the clock and are seen at the wait's end).
        self.beat_waiters: list[asyncio.Future[None]] = []
        self.changed_at: str | None = None
        self.artifacts: set[str] = set()  # SHA-256 of every artifact held
        # by runtime: {serving, warm}, the slot serving and the one kept warm
        self.slots: dict[str, dict[str, str | None]] = {}


def _digest(config: Mapping[str, str]) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(config)).hexdigest()


def _describe_change(before: Mapping[str, str] | None, target: Mapping[str, str]) -> str:
    if before is None:
        return "would create the config: " + ", ".join(
            f"{k} {target[k]}" for k in ("provider", "model", "profile")
        )
    changes = [
        f"{k} {before.get(k)} -> {target[k]}"
        for k in ("provider", "model", "profile")
        if before.get(k) != target[k]
    ]
    return "would change " + ", ".join(changes) if changes else "no change: already in place"


class SimFleet:
    """The simulated nodes and their HTTP handler (``handle``)."""

    def __init__(
        self,
        *,
        names: list[str],
        trusted: Mapping[str, TrustedKey],
        state_dir: Path,
        runtimes: list[str],
        script: Script | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        key_seed: str | None = None,
    ) -> None:
        self.trusted = trusted
        # Each node signs its answers with its own key, derived from the seed
        # (protocol.evidence.derived_agent_key), as a fleet of real agents would.
        self.key_seed = key_seed
        self._keys: dict[str, SigningKey] = {}
        self.runtimes = runtimes
        self.clock = clock
        self.script = script or Script()
        self.nodes: dict[str, SimNode] = {}
        self.add_nodes(names)
        self.received: Counter[str] = Counter()
        self.executed: Counter[str] = Counter()
        # Distinct payloads (send times aside) per job id, for the stats: the
        # first payload is only kept, and compared once a second one comes,
        # since nearly every job is received once.
        self._first_payload: dict[str, Mapping[str, Any]] = {}
        self.variants: dict[str, set[tuple[Any, ...]]] = {}
        self.refusals: Counter[str] = Counter()
        self.requests = 0
        self.ignore_wait = False  # answer ``?wait=`` at once, as an agent older than it does
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self._journal_path = state_dir / JOURNAL_NAME
        self._replay()
        self._journal = open(self._journal_path, "a", encoding="utf-8")  # noqa: SIM115
        self._fetching: set[asyncio.Future[None]] = set()  # ``stage: fetch`` downloads running
        self._flush_pending = False

    def add_nodes(self, names: list[str]) -> None:
        for name in names:
            if name not in self.nodes:
                self.nodes[name] = SimNode(name, self.script.for_node(name).initial, self.runtimes)
                self.key(name)  # derived now, as a real agent loads its key at start

    def set_script(self, script: Script) -> None:
        self.script = script
        if script.names:
            self.add_nodes(list(script.names))
        # An agent that goes down drops the reads it holds: the held reads of
        # nodes now failing every request are answered so, at once.
        for node in self.nodes.values():
            node_script = script.for_node(node.name)
            for job in node.jobs.values():
                attempt = job.payload["attempt"]
                if job.waiters and node_script.for_attempt(attempt).action in TRANSPORT_ACTIONS:
                    _wake(job.waiters)
            if node.beat_waiters and node_script.behaviour.action in TRANSPORT_ACTIONS:
                _wake(node.beat_waiters)

    def close(self) -> None:
        self._journal.close()  # flushes

    # -- journal ----------------------------------------------------------------

    def _log(self, event: dict[str, Any], *, flush: bool) -> None:
        # Accepts are flushed to the kernel before the answer goes out, so a
        # SIGKILL never forgets a job it acknowledged; outcomes are flushed
        # with the next accept or within FLUSH_DELAY (losing one only turns
        # it into "restarted before the job finished").
        self._journal.write(_JOURNAL_ENCODER.encode(event) + "\n")
        if flush:
            self._journal.flush()
        elif not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_later(FLUSH_DELAY, self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        if not self._journal.closed:
            self._journal.flush()

    def _replay(self) -> None:
        if not self._journal_path.exists():
            return
        for line in self._journal_path.read_text(encoding="utf-8").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut off by a crash
            node = self.nodes.get(event["node"])
            if node is None:
                self.add_nodes([event["node"]])
                node = self.nodes[event["node"]]
            if event["e"] == "accept":
                job = SimJob(event["payload"])
                node.jobs[job.payload["jobId"]] = job
                self.executed[job.payload["jobId"]] += 1
                self.received[job.payload["jobId"]] += 1
                self._count_variant(job.payload["jobId"], job.payload)
            elif event["e"] == "finish":
                self._apply_finish(node, event)
        now = format_time(self.clock())
        for node in self.nodes.values():
            for job in node.jobs.values():
                if job.state in ("accepted", "running"):
                    job.answer = None
                    job.state = "failed"
                    job.error = "simulated agent restarted before the job finished"
                    job.finished_at = now

    def _apply_finish(self, node: SimNode, event: dict[str, Any]) -> None:
        job = node.jobs[event["jobId"]]
        job.answer = None
        job.state = event["state"]
        job.error = event["error"]
        job.backup_id = event["backupId"]
        job.finished_at = event["finishedAt"]
        job.detail = event["detail"]
        job.timings = event.get("timings")
        job.evals = event.get("evals")
        job.extra = event.get("extra") or {}
        if event.get("slots") is not None:
            runtime, slots = event["slots"]
            node.slots[runtime] = slots
        node.artifacts.update(event.get("staged", ()))
        node.changed_at = event["finishedAt"]
        for woken in [*job.waiters, *node.beat_waiters]:
            if not woken.done():
                woken.set_result(None)
        job.waiters.clear()
        node.beat_waiters.clear()
        if event["backup"] is not None:
            node.backups.append(event["backup"])
        if event["config"] is not None:
            runtime, config = event["config"]
            node.config[runtime] = config
        payload = job.payload
        if job.state == "succeeded" and payload["mode"] == "live" and payload.get("checks"):
            node.probing[payload["target"]["runtime"]] = job

    # -- the protocol -----------------------------------------------------------

    def key(self, node: str) -> SigningKey | None:
        """The node's signing key, or None when the fleet signs nothing."""
        if self.key_seed is None:
            return None
        key = self._keys.get(node)
        if key is None:
            key = self._keys[node] = derived_agent_key(self.key_seed, node)
        return key

    def _json(self, node: SimNode, status: int, answer: dict[str, Any]) -> Response:
        return Response(status, signed_answer_bytes(answer, self.key(node.name)))

    def _job_answer(self, node: SimNode, status: int, job: SimJob) -> Response:
        """The job's record, signed once per state: a job read again and
        again while it runs, or after it finished, costs no new signature."""
        if job.answer is None:
            job.answer = signed_answer_bytes(job.record(), self.key(node.name))
        return Response(status, job.answer)

    def _error(self, node: SimNode, status: int, code: str, message: str) -> Response:
        return self._json(node, status, {"error": code, "message": message})

    def _refusal(
        self, node: SimNode, status: int, code: str, message: str, posted: Any
    ) -> Response:
        """A refused job, signed over the job id it refuses, as the agent's."""
        if isinstance(posted, dict) and isinstance(posted.get("payload"), dict):
            posted = posted["payload"]
        job_id = posted.get("jobId") if isinstance(posted, dict) else None
        refusal = {"error": code, "message": message, "node": node.name}
        if isinstance(job_id, str):
            refusal["jobId"] = job_id
        return self._json(node, status, refusal)

    def handle(self, request: Request) -> Response | asyncio.Future[Response]:
        self.requests += 1
        parts = request.path.split("/")
        if len(parts) < 5 or parts[1] != "v1" or parts[2] != "nodes":
            if request.path == "/v1/sim/stats" and request.method == "GET":
                return json_response(200, self.stats())
            return error_response(404, "not_found", f"no such endpoint: {request.path}")
        node = self.nodes.get(parts[3])
        if node is None:
            return error_response(404, "unknown_node", f"no simulated node {parts[3]}")
        script = self.script.for_node(node.name)
        what = parts[4]
        if what == "jobs" and len(parts) == 5 and request.method == "POST":
            return self._post_job(node, script, request.body)
        if what == "jobs" and len(parts) == 6 and request.method == "GET":
            job = node.jobs.get(parts[5])
            behaviour = script.for_attempt(job.payload["attempt"] if job else None)
            answer = self._transport(behaviour)
            if answer is not None:
                return answer
            if job is None or behaviour.action == "impostor":
                return error_response(404, "unknown_job", f"no job {parts[5]} on {node.name}")
            try:
                wait = wait_seconds(request.query)
            except ValueError as exc:
                return self._error(node, 400, "bad_request", str(exc))
            if wait and job.state not in FINISHED_JOB_STATES and not self.ignore_wait:
                return _hold(job.waiters, wait, lambda: self._held_job(node, job))
            return self._job_answer(node, 200, job)
        if len(parts) == 5 and request.method == "GET" and what in ("heartbeat", "backups"):
            behaviour = script.behaviour
            answer = self._transport(behaviour)
            if answer is not None:
                return answer
            if what == "heartbeat":
                try:
                    wait, newer = wait_seconds(request.query), newer_than(request.query)
                except ValueError as exc:
                    return self._error(node, 400, "bad_request", str(exc))
                changed = (
                    node.changed_at is not None
                    and newer is not None
                    and (parse_time(node.changed_at) > parse_time(newer))
                )
                if wait and newer is not None and not changed and not self.ignore_wait:
                    return _hold(
                        node.beat_waiters, wait, lambda: self._held_heartbeat(node, behaviour)
                    )
                return self._json(node, 200, self._heartbeat(node, behaviour))
            backups = [] if behaviour.action == "impostor" else node.backups[::-1]
            if signed_list_asked(request.query):
                return self._json(node, 200, {"node": node.name, "backups": backups})
            return json_response(200, backups)
        return error_response(
            404, "not_found", f"no such endpoint: {request.method} {request.path}"
        )

    def _held_job(self, node: SimNode, job: SimJob) -> Response | asyncio.Future[Response]:
        """A held job read's answer, once the job finished or the wait ended:
        its record, or what the node's behaviour then says when it fails
        every request."""
        behaviour = self.script.for_node(node.name).for_attempt(job.payload["attempt"])
        failed = self._transport(behaviour)
        if failed is not None:
            return failed
        return self._job_answer(node, 200, job)

    def _held_heartbeat(
        self, node: SimNode, behaviour: Behaviour
    ) -> Response | asyncio.Future[Response]:
        """A held heartbeat read's answer, once a job of the node finished or
        the wait ended; what the node's behaviour then says when it fails
        every request."""
        failed = self._transport(self.script.for_node(node.name).behaviour)
        if failed is not None:
            return failed
        return self._json(node, 200, self._heartbeat(node, behaviour))

    def _transport(self, behaviour: Behaviour) -> Response | asyncio.Future[Response] | None:
        action = behaviour.action
        if action not in TRANSPORT_ACTIONS:
            return None
        if action == "unreachable":
            return error_response(503, "unavailable", "simulated outage")
        if action == "error500":
            return error_response(500, "internal", "simulated server error")
        if action == "garbage":
            return Response(200, b"<html>\x00 this is not JSON {{")
        if action == "disconnect":
            return Response(0, drop=True)
        # stall: an answer that never comes; the server drops it when the client leaves
        return asyncio.get_running_loop().create_future()

    def _heartbeat(self, node: SimNode, behaviour: Behaviour) -> dict[str, Any]:
        now = self.clock() + timedelta(seconds=behaviour.clock_skew)
        name = behaviour.impersonate if behaviour.action == "impostor" else node.name
        beat: dict[str, Any] = {
            "node": name,
            "time": format_time(now),
            "agentVersion": f"sim-{__version__}",
            "runtimes": [
                {"type": runtime, **config, "configDigest": _digest(config)}
                for runtime, config in sorted(node.config.items())
            ],
        }
        if node.probing:
            script = self.script.for_node(node.name)
            beat["checks"] = [
                report
                for _, job in sorted(node.probing.items())
                for report in _check_reports(job, script.for_attempt(job.payload["attempt"]), now)
            ]
        return beat

    def _post_job(
        self, node: SimNode, script: NodeScript, body: bytes
    ) -> Response | asyncio.Future[Response]:
        try:
            envelope = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep
            envelope = None
        payload_in = envelope.get("payload") if isinstance(envelope, dict) else None
        attempt = payload_in.get("attempt") if isinstance(payload_in, dict) else None
        behaviour = script.for_attempt(attempt)
        answer = self._transport(behaviour)
        if answer is not None:
            return answer
        now = self.clock() + timedelta(seconds=behaviour.clock_skew)
        name = behaviour.impersonate if behaviour.action == "impostor" else node.name
        try:
            payload = admit_job(
                envelope,
                node=name,
                trusted=self.trusted,
                now=now,
                runtimes=self.runtimes,
                allow_live=True,
                known=lambda job_id: job.payload if (job := node.jobs.get(job_id)) else None,
            )
        except JobRefused as refusal:
            self.refusals[refusal.code] += 1
            if refusal.code not in ("invalid_job", "untrusted_key", "bad_signature"):
                assert isinstance(envelope, dict)
                job_id = envelope["payload"]["jobId"]
                self.received[job_id] += 1
                self._count_variant(job_id, envelope["payload"])
            return self._refusal(node, refusal.status, refusal.code, refusal.message, envelope)
        job_id = payload["jobId"]
        self.received[job_id] += 1
        self._count_variant(job_id, payload)
        known = node.jobs.get(job_id)
        if known is not None:
            return self._job_answer(node, 200, known)
        if behaviour.action == "refuse":
            self.refusals[behaviour.code] += 1
            return self._refusal(node, behaviour.status, behaviour.code, behaviour.message, payload)
        if "standby" in payload and not behaviour.slots:
            self.refusals["standby_not_supported"] += 1
            why = f"{node.name} runs no slots: an apply with standby needs slot commands"
            return self._refusal(node, 422, "standby_not_supported", why, payload)
        missing = _not_staged(node, payload)
        if missing:
            self.refusals["not_staged"] += 1
            return self._refusal(node, 409, "not_staged", missing, payload)
        job = SimJob(payload)
        node.jobs[job_id] = job
        if payload["kind"] != "eval":  # an eval job changes nothing the checks look at
            node.probing.pop(payload["target"]["runtime"], None)  # the next job ends the checks
        self.executed[job_id] += 1
        self._log({"e": "accept", "node": node.name, "payload": payload}, flush=True)
        response = self._job_answer(node, 202, job)
        job.state, job.answer = "running", None
        if behaviour.action != "hang":
            loop = asyncio.get_running_loop()
            delay = behaviour.delay + _work_seconds(node, payload, behaviour)
            if _fetches(node, payload, behaviour):
                fetching = asyncio.ensure_future(
                    self._fetch_then_finish(node, job, behaviour, delay)
                )
                self._fetching.add(fetching)
                fetching.add_done_callback(self._fetching.discard)
            elif delay:
                loop.call_later(delay, self._finish, node, job, behaviour)
            else:
                loop.call_soon(self._finish, node, job, behaviour)
        return response

    async def _fetch_then_finish(
        self, node: SimNode, job: SimJob, behaviour: Behaviour, delay: float
    ) -> None:
        """A ``stage: fetch`` job: the scripted delay, then the real download
        (in a thread: the loop serves every other node meanwhile)."""
        await asyncio.sleep(delay)
        wanted = [a for a in job.payload["artifacts"] if a["sha256"] not in node.artifacts]
        error = await asyncio.to_thread(fetch_and_check, wanted)
        self._finish(node, job, behaviour, fetch_error=error)

    def _finish(
        self, node: SimNode, job: SimJob, behaviour: Behaviour, *, fetch_error: str | None = None
    ) -> None:
        payload = job.payload
        target = payload["target"]
        runtime = target["runtime"]
        wanted = {k: target[k] for k in ("provider", "model", "profile")}
        now = format_time(self.clock() + timedelta(seconds=behaviour.clock_skew))
        event: dict[str, Any] = {
            "e": "finish",
            "node": node.name,
            "jobId": payload["jobId"],
            "state": "succeeded",
            "error": None,
            "backupId": None,
            "finishedAt": now,
            "detail": "",
            "backup": None,
            "config": None,
        }
        before = node.config.get(runtime)
        if behaviour.action == "fail":
            event.update(state="failed", error=behaviour.error)
        elif payload["kind"] == "stage":
            event.update(_stage_outcome(node, payload, behaviour.stage, fetch_error))
        elif payload["kind"] == "eval":
            event["evals"] = baseline_answers(payload["evals"], before)
        elif payload["kind"] == "release":
            event.update(_release_outcome(node.slots.get(runtime), runtime, behaviour))
        elif payload["mode"] == "dry_run":
            event["detail"] = _describe_change(before, wanted)
        else:
            if payload["kind"] == "restore":
                found = next(
                    (
                        b
                        for b in node.backups
                        if b["backupId"] == payload["backupId"] and b["runtime"] == runtime
                    ),
                    None,
                )
                if found is None:
                    event.update(
                        state="failed",
                        error=f"backup {payload['backupId']} of runtime {runtime} "
                        f"not found on {node.name}",
                    )
                    self._log(event, flush=False)
                    self._apply_finish(node, event)
                    return
                wanted = {k: found[k] for k in ("provider", "model", "profile")}
            if before is not None:
                backup_id = f"{runtime}-{len(node.backups) + 1:06d}-{payload['jobId'][-8:]}"
                event["backupId"] = backup_id
                event["backup"] = {
                    "backupId": backup_id,
                    "runtime": runtime,
                    "createdAt": now,
                    "jobId": payload["jobId"],
                    "rollout": payload["rollout"],
                    **before,
                }
            if behaviour.action != "drift":
                event["config"] = [runtime, wanted]
            event["detail"] = _describe_change(before, wanted).replace("would ", "", 1)
            event["timings"] = _timings(payload, behaviour, self.clock())
            slots = node.slots.get(runtime)
            if slots is None and before is not None and "standby" in payload:
                # A runtime configured before its first standby apply serves from slot a.
                slots = {"serving": "a", "warm": None}
            if "standby" in payload or (payload["kind"] == "restore" and slots is not None):
                event.update(_slot_switch(payload, slots, runtime, event["timings"], now))
        self._log(event, flush=False)
        self._apply_finish(node, event)

    def _count_variant(self, job_id: str, payload: Mapping[str, Any]) -> None:
        first = self._first_payload.setdefault(job_id, payload)
        if first is payload:
            return
        seen = self.variants.get(job_id)
        if seen is None:
            seen = self.variants[job_id] = {_variant(first)}
        seen.add(_variant(payload))

    def stats(self) -> dict[str, Any]:
        variants = {
            job_id: len(self.variants[job_id]) if job_id in self.variants else 1
            for job_id in self._first_payload
        }
        return {
            "nodes": len(self.nodes),
            "requests": self.requests,
            "received": dict(self.received),
            "executed": dict(self.executed),
            "payloadVariants": variants,
            "refusals": dict(self.refusals),
            "totals": {
                "received": sum(self.received.values()),
                "executed": sum(self.executed.values()),
                "jobs": len(self.executed),
                "finished": sum(
                    1
                    for node in self.nodes.values()
                    for job in node.jobs.values()
                    if job.state in ("succeeded", "failed")
                ),
            },
            "maxExecuted": max(self.executed.values(), default=0),
            "maxPayloadVariants": max(variants.values(), default=0),
        }


def _not_staged(node: SimNode, payload: Mapping[str, Any]) -> str:
    """Why a live apply cannot be admitted for its artifacts, or ""."""
    if payload["kind"] != "apply" or payload["mode"] != "live":
        return ""
    missing = [a["name"] for a in payload.get("artifacts", ()) if a["sha256"] not in node.artifacts]
    if not missing:
        return ""
    return f"artifacts not held on {node.name}: {', '.join(missing)}; stage them first"


def baseline_answers(
    evals: list[dict[str, Any]], config: Mapping[str, str] | None
) -> list[dict[str, Any]]:
    """An eval job's results: each matchesBaseline case answered by the
    model the node serves, ``"MODEL says: PROMPT"`` (the last message's
    content for chat), so answers differ exactly when models do."""
    model = (config or {}).get("model", "")
    out = []
    for e in evals:
        cases = [c for c in e["cases"] if "matchesBaseline" in c["expect"]]
        if not cases:
            continue
        answered = [
            {
                "name": c["name"],
                "ok": True,
                "answer": f"{model} says: "
                + (c["prompt"] if "prompt" in c else c["messages"][-1]["content"]),
                "detail": "baseline answer",
                "seconds": 0.0,
            }
            for c in cases
        ]
        out.append(
            {
                "name": e["name"],
                "suiteSha256": e["suiteSha256"],
                "passed": len(cases),
                "total": len(cases),
                "passRate": 100.0,
                "cases": answered,
            }
        )
    return out


def _work_seconds(node: SimNode, payload: Mapping[str, Any], behaviour: Behaviour) -> float:
    """How long the job takes beyond the scripted delay: a live stage's
    download of what the node does not hold; a live apply's drain and warm-up."""
    if payload["mode"] != "live":
        return 0.0
    if payload["kind"] == "stage":
        if behaviour.stage.outcome == "no_space":
            return 0.0  # refused before a byte is fetched
        size = sum(a["size"] for a in payload["artifacts"] if a["sha256"] not in node.artifacts)
        return behaviour.stage.download_seconds(size) if size else 0.0
    if payload["kind"] == "apply":
        drain = behaviour.drain if "drain" in payload else 0.0
        return drain + (behaviour.warmup if "warmup" in payload else 0.0)
    return 0.0


def _fetches(node: SimNode, payload: Mapping[str, Any], behaviour: Behaviour) -> bool:
    """Whether this job is a live stage that really downloads (``stage: fetch``)."""
    return (
        behaviour.action != "fail"
        and behaviour.stage.outcome == "fetch"
        and payload["kind"] == "stage"
        and payload["mode"] == "live"
    )


def _stage_outcome(
    node: SimNode, payload: Mapping[str, Any], script: StageScript, fetch_error: str | None
) -> dict[str, Any]:
    """The finish event's fields of a stage job, as the real agent would answer;
    ``fetch_error`` is what a ``stage: fetch`` download found wrong."""
    artifacts = payload["artifacts"]
    held = [a for a in artifacts if a["sha256"] in node.artifacts]
    size = sum(a["size"] for a in artifacts)
    if payload["mode"] == "dry_run":
        return {"detail": f"the server reports {size} bytes; {len(held)} of {len(artifacts)} held"}
    needed = sum(a["size"] for a in artifacts if a not in held)
    if needed and script.outcome == "no_space":
        error = f"insufficient_space: needed {needed} bytes, free {SIM_FREE_BYTES} bytes"
        return {"state": "failed", "error": error}
    if needed and script.outcome == "digest_mismatch":
        first = next(a for a in artifacts if a not in held)
        error = f"digest_mismatch: {first['name']}: expected {first['sha256']}, got {'0' * 64}"
        return {"state": "failed", "error": error}
    if needed and fetch_error is not None:
        return {"state": "failed", "error": fetch_error}
    if needed and script.outcome == "download_failed":
        first = next(a for a in artifacts if a not in held)
        return {"state": "failed", "error": f"download_failed: {first['url']}: 404 Not Found"}
    return {"staged": [a["sha256"] for a in artifacts], "detail": f"{size} bytes held"}


def _slot_switch(
    payload: Mapping[str, Any],
    slots: Mapping[str, str | None] | None,
    runtime: str,
    timings: dict[str, str | None] | None,
    now: str,
) -> dict[str, Any]:
    """A finish event's fields for a switch on slots: a standby apply starts
    the idle slot and keeps the serving one warm; a restore routes back to
    the warm slot, or (none warm) switches cold to the idle one."""
    serving = (slots or {}).get("serving")
    warm = (slots or {}).get("warm")
    idle = "b" if serving == "a" else "a"
    routed = dict(timings or {"activatedAt": now, "warmedAt": now, "servingAt": now})
    routed.update(drainStartedAt=None, drainedAt=None)
    routed["routedAt"] = routed["servingAt"]
    if payload["kind"] == "restore":
        to = warm or idle
        standby: dict[str, Any] = {"slot": None, "serving": to, "warm": warm is not None}
        answer_timings = {"routedAt": routed["routedAt"]} if warm is not None else routed
        new = {"serving": to, "warm": None}
    else:
        standby = {"slot": serving, "serving": idle}
        answer_timings = routed
        new = {"serving": idle, "warm": serving}
    return {"timings": answer_timings, "extra": {"standby": standby}, "slots": [runtime, new]}


def _release_outcome(
    slots: Mapping[str, str | None] | None, runtime: str, behaviour: Behaviour
) -> dict[str, Any]:
    """A release job's finish event fields: the warm slot stopped, or nothing to stop."""
    warm = (slots or {}).get("warm")
    if warm is not None and behaviour.release_fails:
        return {"state": "failed", "error": f"stop_failed: slot {warm}: simulated stop failure"}
    fields: dict[str, Any] = {"extra": {"released": {"slot": warm, "stopped": warm is not None}}}
    if slots is not None:
        fields["slots"] = [runtime, {"serving": slots.get("serving"), "warm": None}]
    return fields


def _timings(
    payload: Mapping[str, Any], behaviour: Behaviour, now: datetime
) -> dict[str, str | None] | None:
    """A live apply's timings, ending ``now``: drain, then the switch, then
    warm-up; None for a job without artifacts, drain or warm-up (as before them)."""
    if not {"artifacts", "drain", "warmup"} & payload.keys():
        return None
    warm = behaviour.warmup if "warmup" in payload else 0.0
    drain = behaviour.drain if "drain" in payload else 0.0
    serving = now + timedelta(seconds=behaviour.clock_skew)
    activated = serving - timedelta(seconds=warm)
    started = activated - timedelta(seconds=drain)
    drained = "drain" in payload
    return {
        "drainStartedAt": format_time(started) if drained else None,
        "drainedAt": format_time(activated) if drained else None,
        "activatedAt": format_time(activated),
        "warmedAt": format_time(serving),
        "servingAt": format_time(serving),
    }


def _variant(payload: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes a payload this payload, send times aside (a verified payload
    has exactly the schema's fields, all plain values)."""
    return tuple(
        (k, canonical_json({"v": v}) if isinstance(v, dict | list) else v)
        for k, v in sorted(payload.items())
        if k not in SEND_TIME_FIELDS
    )


def node_names(count: int, prefix: str) -> list[str]:
    return [f"{prefix}{i:04d}" for i in range(1, count + 1)]


# -- running it -----------------------------------------------------------------


async def _watch_behaviour(fleet: SimFleet, path: Path) -> None:
    def signature() -> tuple[int, int, int] | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    seen = signature()
    while True:
        await asyncio.sleep(RELOAD_INTERVAL)
        now = signature()
        if now == seen or now is None:
            continue
        seen = now
        try:
            fleet.set_script(load_script(path))
        except ScriptError as exc:
            print(
                f"sim-fleet: behaviour file not reloaded, keeping the old one: {exc}",
                file=sys.stderr,
            )
        else:
            print(f"sim-fleet: behaviour reloaded from {path}", file=sys.stderr)


async def serve(
    fleet: SimFleet,
    host: str,
    port: int,
    *,
    behaviour_path: Path | None = None,
    ready: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve ``fleet`` until ``stop`` is set (or forever)."""
    # One process serves every node: a held read per job of a batch of
    # thousands needs as many connections, within the open files limit.
    connections = max(MAX_CONNECTIONS, min(raise_open_files_limit() - 256, 16_384))
    # A batch's held reads connect at once: none waits out a SYN retry.
    server = HttpServer(
        fleet.handle,
        host,
        port,
        on_error=_print_error,
        max_connections=connections,
        backlog=max(BACKLOG, min(connections, 4096)),
    )
    await server.start()
    watcher = (
        asyncio.ensure_future(_watch_behaviour(fleet, behaviour_path)) if behaviour_path else None
    )
    if ready is not None:
        ready(server.address)
    try:
        await (stop.wait() if stop is not None else asyncio.Event().wait())
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await server.close()
        fleet.close()


def _print_error(exc: BaseException) -> None:
    print(f"sim-fleet: internal error: {exc!r}", file=sys.stderr)


def _check_reports(job: SimJob, behaviour: Behaviour, now: datetime) -> list[dict[str, Any]]:
    """What the real agent would report for ``job``'s checks at ``now``:
    probes at the apply's end and every interval after, each holding or not
    as the script says."""
    assert job.finished_at is not None
    start = datetime.fromisoformat(job.finished_at.replace("Z", "+00:00"))
    elapsed = (now - start).total_seconds()
    reports = []
    for check in job.payload["checks"]:
        interval = check["intervalSeconds"]
        if elapsed < 0:
            continue
        last = int(elapsed // interval)  # probes 0..last have run
        script = behaviour.check_script(check["name"])
        # Walk back from the newest probe over the current run of equal outcomes.
        ok, first = script.current_run(last, interval)
        reports.append(
            {
                "name": check["name"],
                "jobId": job.payload["jobId"],
                "ok": ok,
                "okSince": format_time(start + timedelta(seconds=first * interval)) if ok else None,
                "failures": 0 if ok else last - first + 1,
                "lastError": "" if ok else f"simulated failure of check {check['name']}",
                "probedAt": format_time(start + timedelta(seconds=last * interval)),
            }
        )
    return reports


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    for woken in waiters:
        if not woken.done():
            woken.set_result(None)


def _hold(
    waiters: list[asyncio.Future[None]],
    wait: float,
    answer: Callable[[], Response | asyncio.Future[Response]],
) -> asyncio.Future[Response]:
    """``answer()``, once a future this adds to ``waiters`` is set or ``wait``
    seconds have passed. On callbacks, not a task with ``wait_for``: a batch
    of thousands of jobs holds a read per job. Cancelling the result (the
    client went away) withdraws the wait."""
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()
    waiters.append(woken)
    result: asyncio.Future[Response] = loop.create_future()
    timer = loop.call_later(wait, _set_none, woken)

    def ready(_: asyncio.Future[None]) -> None:
        timer.cancel()
        if woken in waiters:
            waiters.remove(woken)
        if result.done():
            return
        response = answer()
        if isinstance(response, Response):
            result.set_result(response)
        else:  # an answer that comes later, or never (stall)
            response.add_done_callback(lambda done: _pass_on(done, result))

    def withdrawn(_: asyncio.Future[Response]) -> None:
        if result.cancelled() and not woken.done():
            woken.cancel()  # ``ready`` cleans up

    woken.add_done_callback(ready)
    result.add_done_callback(withdrawn)
    return result


def _set_none(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _pass_on(source: asyncio.Future[Response], target: asyncio.Future[Response]) -> None:
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (exc := source.exception()) is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())
