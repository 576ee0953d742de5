"""The engine's performance machinery, apart from its rules: caches of
pure functions, whose results never depend on them (forgetting one changes
nothing but the cost). No rule lives here."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from reconciler.spec.model import Fleet, Node, Settings

if TYPE_CHECKING:
    from reconciler.engine.step import RolloutInput


class FleetIndex:
    """The fleet's nodes by name and by label, built once per fleet."""

    def __init__(self, fleet: Fleet) -> None:
        self.by_name = fleet.by_name()
        self.by_label: dict[tuple[str, str], list[Node]] = {}
        for node in fleet.nodes:
            for pair in dict.fromkeys(node.labels):
                self.by_label.setdefault(pair, []).append(node)


# The indexes of the last few fleets seen: a pass (and the next, while the
# node files stay the same) hands the same Fleet value to every call; a few,
# for processes that run more than one daemon (the benchmarks). A cache of a
# pure function's intermediate value; results do not depend on it.
_last_index: list[tuple[Fleet, FleetIndex]] = []
_INDEXES_KEPT = 4


def fleet_index(fleet: Fleet) -> FleetIndex:
    for kept, index in _last_index:
        if kept is fleet:
            return index
    index = FleetIndex(fleet)
    _last_index[:] = [(fleet, index), *_last_index[: _INDEXES_KEPT - 1]]
    return index


class StepMemo:
    """Finished rollouts a previous ``step_fleet`` found at rest, kept by
    the caller from pass to pass so the next pass need not step them again.

    A terminal rollout with nothing in flight, no restore or rollback
    waiting and no rollback request left to handle reads only its own input
    and status (not the clock, the observations or the other rollouts); a
    step that changed nothing then changes nothing again while the input
    (the same status object), the fleet and the settings stay equal. A
    cache of a pure function: forgetting it changes nothing but the cost."""

    def __init__(self) -> None:
        self._fleet: Fleet | None = None
        self._settings: Settings | None = None
        self._at_rest: dict[str, RolloutInput] = {}

    def resting(
        self, rollouts: Iterable[RolloutInput], fleet: Fleet, settings: Settings
    ) -> set[str]:
        """The rollouts whose input equals one found at rest last time (the
        daemon hands the same input object while nothing it depends on
        changed). Forgets the others: they are stepped again."""
        if not (
            self._fleet is not None
            and (self._fleet is fleet or self._fleet == fleet)
            and self._settings == settings
        ):
            self._at_rest = {}
            return set()
        at_rest = self._at_rest
        kept: dict[str, RolloutInput] = {}
        for inp in rollouts:
            seen = at_rest.get(inp.name)
            if seen is not None and (seen is inp or (seen.status is inp.status and seen == inp)):
                kept[inp.name] = inp
        self._at_rest = kept
        return set(kept)

    def remember(self, fleet: Fleet, settings: Settings, at_rest: Iterable[RolloutInput]) -> None:
        """Also at rest now: ``at_rest`` (found by the step just done)."""
        self._fleet = fleet
        self._settings = settings
        self._at_rest.update((inp.name, inp) for inp in at_rest)
