"""The fleet sweep (docs/operating.md): every ``spec.fleetCheck.interval``
read every node's heartbeat, off the pass's path, and hand the result to
the next pass, which decides (``engine.fleet``) and commits.

How it stays out of the way of passes:
- at most one sweep in flight: a sweep runs in one background thread, and
  a new one starts only after the last one ended and the interval passed
  since it started;
- through the daemon's own ``AgentClient`` (its keep-alive connections and
  its concurrency cap), in chunks of ``SWEEP_CHUNK`` nodes;
- never delaying a pass: before each chunk the sweep waits while a pass is
  running (``pass_running``), so a pass shares the client with at most one
  chunk already in flight; the rules (``engine.fleet``) are applied here
  too, in slices that wait the same way, so the pass that takes the result
  only commits it;
- the result is kept until a pass has applied it (committed, or found
  nothing to commit); a pass that loses the compare-and-swap leaves it for
  the next attempt.

Its soft state (``SweepMemory``), handed in: since when each node has given
no answer (docs/rollouts.md allows that to be forgotten on restart: a
restart can delay ``offline``, never bring it forward).

Must not decide anything (that is ``engine.fleet``) or touch Git.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from reconciler.daemon.agent_client import AgentClient
from reconciler.engine.fleet import (
    NodeSighting,
    decide_nodes,
    desired_state,
    fleet_of,
)
from reconciler.protocol.observations import Heartbeat
from reconciler.spec.fleet_status import FleetStatus, fleet_to_files
from reconciler.spec.rollout_status import RolloutStatus
from reconciler.spec.safe_yaml import dump_yaml

# The agentKey check of a heartbeat (docs/trust.md), once agents have keys:
# (node, heartbeat) -> True believed, False refused, None not checked.
EvidenceCheck = Callable[[str, Heartbeat], bool | None]


def _not_checked(node: str, heartbeat: Heartbeat) -> bool | None:
    return None


@dataclass
class SweepMemory:
    """The fleet watch's soft state, forgotten on restart."""

    unreachable: dict[str, datetime] = field(default_factory=dict)  # node -> first failed contact


@dataclass(frozen=True)
class SweepBase:
    """What a sweep decides against, as the last pass held it: the fleet
    status at its status tip, the rollout statuses (the desired state) and
    ``offlineAfter``. Values, not copies."""

    fleet: FleetStatus | None
    statuses: Mapping[str, RolloutStatus]
    offline_after: int


@dataclass(frozen=True)
class Sweep:
    """One finished sweep: what it saw of each node, and when."""

    number: int
    started: datetime
    finished: datetime
    sightings: tuple[NodeSighting, ...]
    seconds: float  # wall time of the sweep
    # Decided in the sweep's thread, off the pass: against ``base`` (the
    # fleet status a pass last read), the new one (``base`` itself when
    # nothing changed) and its files that differ. A pass that reads another
    # ``base`` decides again itself.
    base: FleetStatus | None = None
    decided: FleetStatus | None = None
    files: Mapping[str, bytes | None] | None = None


def _not_before(moment: datetime) -> datetime:
    """A clock of whole seconds (the daemon's) reads up to a second early:
    round up, so that ``offline`` never comes before ``offlineAfter``."""
    return moment + timedelta(seconds=1) if moment.microsecond == 0 else moment


# Small steps, so that a pass starting meanwhile shares the process with
# little of the sweep: at most one chunk of requests, or one slice of rules.
SWEEP_CHUNK = 16  # heartbeats in flight at once (never more than --concurrency)
DECIDE_SLICE = 100  # nodes decided between two checks for a running pass


def fleet_file_changes(before: FleetStatus | None, after: FleetStatus) -> dict[str, bytes | None]:
    """The fleet status files that differ (a node page no longer needed: None)."""
    old = fleet_to_files(before) if before is not None else {}
    new = fleet_to_files(after)
    changes: dict[str, bytes | None] = {
        path: dump_yaml(record) for path, record in new.items() if old.get(path) != record
    }
    changes.update({path: None for path in old if path not in new})
    return changes


class FleetWatch:
    """Runs sweeps for one daemon. ``tick`` (from each pass) starts one when
    due; ``pending``/``applied`` hand the result over; ``sweep`` runs one
    in the calling thread (tests, benchmarks). ``on_sweep`` is called with
    each finished sweep (metrics)."""

    def __init__(
        self,
        client: AgentClient,
        *,
        clock: Callable[[], datetime],
        memory: SweepMemory | None = None,
        evidence: EvidenceCheck = _not_checked,
        on_sweep: Callable[[Sweep], None] = lambda sweep: None,
        chunk: int | None = None,
    ) -> None:
        self.client = client
        self.clock = clock
        self.memory = memory or SweepMemory()
        self.evidence = evidence
        self.on_sweep = on_sweep
        self.chunk = max(1, chunk or min(SWEEP_CHUNK, client.concurrency))
        self.enabled = False  # sweeps start only under ``Daemon.serve``
        self.wake: Callable[[], None] = lambda: None  # the loop's wake-up, on a result
        self._cond = threading.Condition()
        self._passes = 0  # passes running now
        self._thread: threading.Thread | None = None
        # Set when a sweep starts, cleared before its wake-up is sent: the
        # loop that saw a sweep in flight is sure to be woken when it ends.
        self._running = False
        self._result: Sweep | None = None
        self._started_at: float | None = None  # monotonic start of the last sweep
        self._interval = 0.0
        self._stopping = False
        self._count = 0
        self._base: SweepBase | None = None  # what the last pass held (``tick``)

    # -- the pass's side -----------------------------------------------------

    @contextlib.contextmanager
    def pass_running(self) -> Iterator[None]:
        """Around a pass: sweeps start no new chunk meanwhile."""
        with self._cond:
            self._passes += 1
        try:
            yield
        finally:
            with self._cond:
                self._passes -= 1
                self._cond.notify_all()

    def tick(
        self,
        nodes: Callable[[], Sequence[tuple[str, str]]],
        interval: int,
        base: SweepBase,
    ) -> None:
        """From each pass: start a sweep of ``nodes()`` ((agent URL, node
        name) pairs) if the watch is on, ``interval`` seconds (0: off)
        passed since the last one started, and none is in flight; a sweep
        decides against the ``base`` of the newest pass."""
        self._base = base
        self._interval = float(interval)
        if not self.enabled or interval <= 0 or self._stopping:
            return
        with self._cond:
            if self._running:
                return
            now = time.monotonic()
            if self._started_at is None:
                # The first sweep waits one interval, as ``seconds_until_due``
                # says: a daemon whose first passes fail (a push the server
                # refuses) must not be woken by a sweep out of its backoff.
                self._started_at = now
                return
            if now - self._started_at < interval:
                return
            self._started_at = now
            self._running = True
            self._thread = threading.Thread(
                target=self._run, args=(list(nodes()),), name="fleet-sweep", daemon=True
            )
            self._thread.start()

    def seconds_until_due(self) -> float | None:
        """How long until the next sweep may start (None: the watch is off)."""
        if not self.enabled or self._interval <= 0:
            return None
        if self._started_at is None:
            # The first sweep waits one interval: a daemon restarted in a
            # loop, or one run for a single rollout, does not sweep at once.
            self._started_at = time.monotonic()
        return max(0.0, self._started_at + self._interval - time.monotonic())

    def wants_pass(self) -> bool:
        """A pass has work here: a result to apply, or a sweep to start."""
        if self._result is not None:
            return True
        due = self.seconds_until_due()
        return due is not None and due <= 0 and not self.in_flight()

    @property
    def sweeps(self) -> int:
        """Sweeps finished since start."""
        return self._count

    def in_flight(self) -> bool:
        return self._running

    def pending(self) -> Sweep | None:
        """The newest finished sweep no pass has applied yet."""
        return self._result

    def applied(self, sweep: Sweep) -> None:
        """A pass committed what ``sweep`` showed, or found nothing to commit."""
        with self._cond:
            if self._result is sweep:
                self._result = None

    def start(self, wake: Callable[[], None]) -> None:
        """Sweeps may start from now on (``Daemon.serve``); ``wake`` is
        called when one has finished."""
        self.wake = wake
        self._stopping = False
        self.enabled = True

    def stop(self, timeout: float = 10.0) -> None:
        """No new sweeps; a sweep in flight ends after its current chunk."""
        self._stopping = True
        with self._cond:
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- the sweep -----------------------------------------------------------

    def sweep(self, nodes: Sequence[tuple[str, str]]) -> Sweep:
        """Read every node's heartbeat, chunk by chunk, yielding to passes;
        the result becomes ``pending``."""
        started = self.clock()
        began = time.perf_counter()
        beats: dict[str, Heartbeat | None] = {}
        failed_at: dict[str, datetime] = {}  # when a failure was seen, never before it happened
        for i in range(0, len(nodes), self.chunk):
            if not self._no_pass_running():
                break
            answers = self.client.read_heartbeats(nodes[i : i + self.chunk])
            beats.update(answers)
            if any(beat is None for beat in answers.values()):
                seen = _not_before(self.clock())
                failed_at.update((name, seen) for name, beat in answers.items() if beat is None)
        finished = self.clock()
        sightings: list[NodeSighting] = []
        unreachable: dict[str, datetime] = {}
        for _, name in nodes:
            if name not in beats:
                continue  # not read: the sweep was stopped
            beat = beats[name]
            if beat is None:
                unreachable[name] = self.memory.unreachable.get(name, failed_at[name])
                sightings.append(NodeSighting(name, None, unreachable[name]))
            else:
                sightings.append(NodeSighting(name, beat, None, self.evidence(name, beat)))
        self.memory.unreachable = unreachable
        base, decided, files = self._decide(sightings, finished)
        with self._cond:
            self._count += 1
            result = Sweep(
                self._count,
                started,
                finished,
                tuple(sightings),
                time.perf_counter() - began,
                base,
                decided,
                files,
            )
            if not self._stopping:
                self._result = result
        self.on_sweep(result)
        return result

    def _no_pass_running(self) -> bool:
        """Wait while a pass runs; False when the watch is stopping."""
        with self._cond:
            while self._passes and not self._stopping:
                self._cond.wait()
        return not self._stopping

    def _decide(
        self, sightings: list[NodeSighting], now: datetime
    ) -> tuple[FleetStatus | None, FleetStatus | None, Mapping[str, bytes | None] | None]:
        """``engine.fleet`` applied here, in slices that wait while a pass
        runs, so the pass that applies the sweep only commits."""
        held = self._base
        if held is None or not self._no_pass_running():
            return None, None, None
        base, offline_after = held.fleet, held.offline_after
        desired = desired_state(held.statuses.values())
        old = base.by_name() if base is not None else {}
        ordered = sorted(sightings, key=lambda s: s.name)
        nodes = []
        for i in range(0, len(ordered), DECIDE_SLICE):
            if not self._no_pass_running():
                return None, None, None
            nodes += decide_nodes(old, ordered[i : i + DECIDE_SLICE], desired, offline_after, now)
        decided = fleet_of(base, nodes)
        if decided is base or not self._no_pass_running():
            return base, decided, {}
        return base, decided, fleet_file_changes(base, decided)

    def _run(self, nodes: list[tuple[str, str]]) -> None:
        try:
            self.sweep(nodes)
        finally:
            with self._cond:
                self._running = False
            if not self._stopping:
                self.wake()


__all__ = [
    "EvidenceCheck",
    "FleetWatch",
    "Sweep",
    "SweepBase",
    "SweepMemory",
    "fleet_file_changes",
]
