"""The daemon's soft state, declared in one record: what it keeps in memory
between passes that is neither in Git nor in its state directory.

Every part is forgotten on restart, and losing it can delay a decision (an
``offline`` node, a soak, a run of metric answers), never bring one
forward. Each part is defined in, and changed only by, the module that owns
it; the daemon builds one ``SoftState`` and hands each part to its owner's
constructor, so nothing is wired onto an object after it is built.

Everything else the daemon keeps between passes is a cache of something in
Git or of a pure function, owned by the reader, the observer and the status
writer: dropping it costs only a read. ``run --plain`` (every pass) and a
pass that raises drop the caches by building those owners again with the
same ``SoftState``.

Not in the record, because they are work in progress rather than memory:
the agent client's connections and held reads in flight (``AgentClient``),
and the fleet watch's sweep in flight and its result until a pass applies
it (``FleetWatch``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reconciler.daemon.answer_check import AnswerCheck
from reconciler.daemon.canary_readings import SoakMemory
from reconciler.daemon.fleet_watch import SweepMemory
from reconciler.daemon.observer import AgentMemory
from reconciler.daemon.reader import ReadMemory


@dataclass
class LoggedOnce:
    """The loop's: what it has logged already, so a standing problem or a
    refused commit is logged once rather than every pass (logged again
    after a restart)."""

    problems: set[str] = field(default_factory=set)  # problem messages logged
    refused: set[str] = field(default_factory=set)  # refused spec commits logged
    announced: bool = False  # the standing events went to the notifier, on start

    def new_problem(self, message: str) -> bool:
        """Whether the problem ``message`` is not logged yet (it is now)."""
        return _first_time(self.problems, message)

    def new_refusal(self, commit: str) -> bool:
        """Whether the refusal of ``commit`` is not logged yet (it is now)."""
        return _first_time(self.refused, commit)


@dataclass
class SoftState:
    """All the daemon's soft state; each part forgotten on restart."""

    # reader.py: the tip acted on last (never act on rewritten history), the
    # last readable status of each rollout (what an unreadable one may hold).
    reading: ReadMemory = field(default_factory=ReadMemory)
    # observer.py: since when each agent is unreachable, the metric answers
    # folded so far, the jobs left to their held reads.
    agents: AgentMemory = field(default_factory=AgentMemory)
    # answer_check.py: the newest heartbeat believed of each node (with the
    # agentKeys parsed and signatures verified, which it keeps to be fast);
    # used from the pass, the agent client's thread and the sweep's.
    answers: AnswerCheck = field(default_factory=AnswerCheck)
    # canary_readings.py: each live node's soak and the comparisons judged.
    soaks: SoakMemory = field(default_factory=SoakMemory)
    # fleet_watch.py: since when each node has not answered a sweep.
    sweeps: SweepMemory = field(default_factory=SweepMemory)
    # loop.py: the problems and refusals logged, the events announced.
    logged: LoggedOnce = field(default_factory=LoggedOnce)


def _first_time(seen: set[str], key: str) -> bool:
    """Whether ``key`` is new to ``seen``, which forgets all it holds at
    10,000 keys rather than grow for the daemon's life."""
    if key in seen:
        return False
    if len(seen) >= 10_000:
        seen.clear()
    seen.add(key)
    return True


__all__ = ["LoggedOnce", "SoftState"]
