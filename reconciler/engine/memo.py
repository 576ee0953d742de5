"""The engine's performance machinery, apart from its rules: caches of
pure functions, whose results never depend on them (forgetting one changes
nothing but the cost). No rule lives here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter

from reconciler.engine.inputs import RolloutInput
from reconciler.spec.model import Fleet, Settings
from reconciler.spec.rollout_status import RolloutStatus


class StepMemo:
    """Finished rollouts a previous ``step_fleet`` found at rest, kept by
    the caller from pass to pass so the next pass need not step them again.

    A terminal rollout with nothing in flight, no restore or rollback
    waiting and no rollback request left to handle reads only its own input
    and status (not the clock, the observations or the other rollouts); a
    step that changed nothing then changes nothing again while the input
    (the same status object), the fleet and the settings stay equal. A
    cache of a pure function: forgetting it changes nothing but the cost.

    It also keeps the last call's inputs in queue order (the seed of every
    status, their positions, which are not at rest), so that a caller that
    names the inputs that differ from the last call's (``step_fleet``'s
    ``changed``) gets a step that costs what changed, not what exists."""

    def __init__(self) -> None:
        self._fleet: Fleet | None = None
        self._settings: Settings | None = None
        self._at_rest: dict[str, RolloutInput] = {}
        self._inputs: dict[str, RolloutInput] | None = None  # the last call's, by name
        self._seed: dict[str, RolloutStatus] = {}  # their statuses, in queue order
        self._position: dict[str, int] = {}  # rollout -> its place in the seed (gaps allowed)
        self._next_position = 0
        self._last_key: tuple[int, str] | None = None  # no seeded input sorts after it
        self._unrested: set[str] = set()  # inputs not at rest: stepped
        self.seeds_kept = 0  # calls that built on the last one's seed (for tests)

    def _same_world(self, fleet: Fleet, settings: Settings) -> bool:
        return (
            self._fleet is not None
            and (self._fleet is fleet or self._fleet == fleet)
            and self._settings == settings
        )

    def resting(
        self, rollouts: Iterable[RolloutInput], fleet: Fleet, settings: Settings
    ) -> set[str]:
        """The rollouts whose input equals one found at rest last time (the
        daemon hands the same input object while nothing it depends on
        changed). Forgets the others: they are stepped again."""
        if not self._same_world(fleet, settings):
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

    def keep_seed(
        self, order: Sequence[RolloutInput], seed: dict[str, RolloutStatus], resting: set[str]
    ) -> None:
        """The seed a full call built from ``order`` (queue order), before
        its step changed anything, for the next call's ``changed``."""
        self._inputs = {inp.name: inp for inp in order}
        self._seed = dict(seed)
        self._position = {name: i for i, name in enumerate(seed)}
        self._next_position = len(seed)
        last = next(reversed(seed), None)
        self._last_key = (self._inputs[last].queue_key, last) if last is not None else None
        self._unrested = set(self._inputs) - resting

    def seed_changed(
        self, changed: Mapping[str, RolloutInput | None], fleet: Fleet, settings: Settings
    ) -> tuple[dict[str, RolloutStatus], dict[str, int], int, list[RolloutInput]] | None:
        """The last call's seed brought up to date with ``changed`` (name ->
        its input now, None when it is gone; every other input is the last
        call's object): a copy of the statuses in queue order, their
        positions, the next free position, and the inputs not at rest in
        queue order. None when the last call cannot be built on (none yet,
        another fleet or settings, or a change that moves a status within
        the queue order): then the caller seeds from every input."""
        inputs = self._inputs
        if inputs is None or not self._same_world(fleet, settings):
            return None
        seed = self._seed
        # A status whose place stays is replaced in place; one that is new
        # to the seed must sort after every seeded one (a rollout added
        # last, the usual change); anything else: seeded from scratch.
        appended: list[RolloutInput] = []
        for name, inp in changed.items():
            if inp is None or inp.status is None:
                continue
            old = inputs.get(name)
            if name in seed and old is not None and old.queue_key == inp.queue_key:
                continue
            appended.append(inp)
        appended.sort(key=_queue_order)
        last = self._last_key
        for inp in appended:
            if inp.name in seed:
                return None  # its place in the queue moved
            if last is not None and _queue_order(inp) <= last:
                return None
            last = _queue_order(inp)
        at_rest = self._at_rest
        for name, inp in changed.items():
            seen = at_rest.get(name)
            if inp is None:
                inputs.pop(name, None)
                seed.pop(name, None)
                self._position.pop(name, None)
                at_rest.pop(name, None)
                self._unrested.discard(name)
                continue
            inputs[name] = inp
            if seen is not None and not (
                seen is inp or (seen.status is inp.status and seen == inp)
            ):
                del at_rest[name]
            if name in at_rest:
                self._unrested.discard(name)
            else:
                self._unrested.add(name)
            if inp.status is None:
                seed.pop(name, None)
                self._position.pop(name, None)
            elif name in seed:
                seed[name] = inp.status
        for inp in appended:
            status = inp.status
            assert status is not None  # only inputs with a status are appended
            seed[inp.name] = status
            self._position[inp.name] = self._next_position
            self._next_position += 1
        self._last_key = last
        self.seeds_kept += 1
        stepped = sorted((inputs[name] for name in self._unrested), key=_queue_order)
        # copy(), not dict(): after names were removed and added again,
        # dict() inserts 5,000 entries one by one, copy() copies them whole.
        return seed.copy(), self._position.copy(), self._next_position, stepped

    def remember(self, fleet: Fleet, settings: Settings, at_rest: Iterable[RolloutInput]) -> None:
        """Also at rest now: ``at_rest`` (found by the step just done)."""
        self._fleet = fleet
        self._settings = settings
        for inp in at_rest:
            self._at_rest[inp.name] = inp
            self._unrested.discard(inp.name)


_queue_order = attrgetter("queue_key", "name")
