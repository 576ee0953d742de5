"""Statuses that ask nothing of a pass, remembered by identity so that a
pass over thousands of finished rollouts looks only at the others.

A status is inert when it has no job in flight, wants no heartbeat,
backup list or metric check, has no deadline or start time to wake for,
and needs no more passes: what ``observe`` and the loop's wake-up compute
from it is empty. Status values are immutable and the status reader keeps
an unchanged file's value (the same object) from pass to pass, so each is
judged once. A cache of pure functions of the status: forgetting it
changes nothing but the cost (tests pin the shortcut against the plain
computation)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import attrgetter

from reconciler.engine import step as engine
from reconciler.spec.rollout_status import RolloutStatus


def needs_passes(status: RolloutStatus) -> bool:
    """Active, and not only waiting for a person (docs/architecture.md, the
    loop's wait: the interval applies while a rollout can move on by itself)."""
    return engine.is_active(status) and not engine.waits_for_a_person(status)


def is_inert(status: RolloutStatus) -> bool:
    one = (status,)
    return not (
        needs_passes(status)
        or engine.in_flight(one)
        or engine.wanted_heartbeats(one)
        or engine.wanted_backups(one)
        or engine.wanted_metric_checks(one)
        or engine.next_wakeup(one) is not None
    )


class InertStatuses:
    """The inert statuses seen, by rollout name (the observer keeps one)."""

    def __init__(self) -> None:
        self._known: dict[str, RolloutStatus] = {}
        # The lively statuses the last call with every rollout's found, by name.
        self._lively: dict[str, RolloutStatus] | None = None

    def lively(
        self, statuses: Mapping[str, RolloutStatus], *, every: bool = True
    ) -> list[RolloutStatus]:
        """The statuses that are not inert, in the mapping's order.
        ``every``: ``statuses`` holds every rollout's (then what is kept
        for rollouts no longer there is forgotten)."""
        known = self._known
        found: list[RolloutStatus] = []
        for name, status in statuses.items():
            if known.get(name) is status:
                continue
            if is_inert(status):
                known[name] = status
            else:
                known.pop(name, None)
                found.append(status)
        if every:
            self._lively = {status.name: status for status in found}
            if len(known) > 2 * len(statuses) + 1000:
                self._known = {n: s for n, s in known.items() if statuses.get(n) is s}
        return found

    def lively_changed(
        self, statuses: Mapping[str, RolloutStatus], changed: Iterable[str]
    ) -> list[RolloutStatus]:
        """What ``lively(statuses)`` finds (by name order), when only the
        rollouts named in ``changed`` may have a status other than the one
        they had at the last call with every rollout's (the same object):
        only those are looked at."""
        lively = self._lively
        if lively is None:
            return sorted(self.lively(statuses), key=_name_of)
        known = self._known
        for name in changed:
            status = statuses.get(name)
            if status is None:
                known.pop(name, None)
                lively.pop(name, None)
            elif known.get(name) is status or is_inert(status):
                known[name] = status
                lively.pop(name, None)
            else:
                known.pop(name, None)
                lively[name] = status
        return sorted(lively.values(), key=_name_of)


_name_of = attrgetter("name")
