"""Each rollout's engine input, built from one pass's values, and the cache
that spares building again the inputs nothing changed.

``InputCache.build`` takes everything as arguments (the tip, its history,
the documents, the statuses, what the readers found changed) and returns
the inputs and which of them differ from the last build, for the engine's
memo. Forgetting the cache changes nothing but the cost: an empty one
builds every input, as the plain mode does on every pass.

Must not: read the clock or the network, decide anything (that is the
engine's), or keep anything but inputs and what they were built from.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from reconciler.engine import step as engine
from reconciler.engine.step import RolloutInput
from reconciler.git.history import History
from reconciler.spec.documents import Documents, ParsedFile
from reconciler.spec.model import Problem, RolloutSpec
from reconciler.spec.paths import (
    FLEET_STATUS_NAME,
    ROLLOUTS_DIR,
    SETTINGS_PATH,
    name_in,
    node_path,
    rollout_path,
)
from reconciler.spec.rollout_status import (
    ACT_MESSAGE_LIMIT,
    ApprovalRecord,
    OperatorAct,
    RolloutStatus,
)

REQUEST_WALK = 1000  # spec commits searched for the one that asked for a rollback


class CommitSource(Protocol):
    """What inputs read of Git beyond the documents: a commit's author and
    a file's blob at a commit (``GitStore`` is one)."""

    def author(self, commit: str) -> str: ...

    def commit_message(self, commit: str) -> str: ...

    def file_blob(self, commit: str, path: str) -> str | None: ...


@dataclass(frozen=True)
class Context:
    """What every input of one pass is built with."""

    tip: str
    history: History
    source: CommitSource
    parse: Callable[[str, str], ParsedFile]  # (blob id, path) -> the parsed file, cached
    refusal: str | None  # why the newest change is not acted on, under verification
    approved_by: tuple[ApprovalRecord, ...]
    unverified: frozenset[str]  # rollouts seen only in an unverified tree
    settings_change: str | None
    # Under verification: the verified commit that covers a spec commit
    # (itself, or the oldest verified one after it); None: no verification.
    verified: Callable[[str], str] | None = None


@dataclass(frozen=True)
class Built:
    """A rollout's engine input and what it was built from (values, by
    identity), so the next pass can tell whether to build it again."""

    input: RolloutInput
    spec: RolloutSpec | None
    problems: tuple[Problem, ...] | None  # as in ``Documents.invalid_rollouts``
    status: RolloutStatus | None
    node_paths: tuple[str, ...]  # the node files whose history it read
    unstarted: bool  # its nodes come from the fleet, not from its status
    uses_tip: bool  # a commit id in it fell back to the tip read, or is off the line
    tip: str


class InputsView(Collection[RolloutInput]):
    """The inputs of a cache, without a list of thousands built every pass
    (the engine, told what changed, only counts them)."""

    __slots__ = ("_built",)

    def __init__(self, built: Mapping[str, Built]) -> None:
        self._built = built

    def __len__(self) -> int:
        return len(self._built)

    def __iter__(self) -> Iterator[RolloutInput]:
        return (built.input for built in self._built.values())

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, RolloutInput):
            return False
        built = self._built.get(item.name)
        return built is not None and built.input == item


@dataclass(frozen=True)
class BuiltInputs:
    """One build: every input, and those built or dropped since the last
    build (name -> input, None: dropped; None: look at every input)."""

    inputs: Collection[RolloutInput]
    changes: dict[str, RolloutInput | None] | None


@dataclass
class InputCache:
    """Engine inputs by rollout, kept while what they were built from stays."""

    built: dict[str, Built] = field(default_factory=dict)
    by_node: dict[str, set[str]] = field(default_factory=dict)  # node path -> rollouts
    generation: int = 0  # ``History.generation`` they were built at
    context: tuple[object, ...] = ()  # (refusal, approvals) they were built with
    fleet: object = None  # the fleet they were built against
    tip_bound: set[str] = field(default_factory=set)  # built with the tip read
    unstarted: set[str] = field(default_factory=set)  # built from the fleet

    def build(
        self,
        context: Context,
        documents: Documents,
        statuses: Mapping[str, RolloutStatus],
        broken: Mapping[str, str],
        changed: tuple[frozenset[str] | None, frozenset[str] | None],
        look_at_every: bool,
    ) -> BuiltInputs:
        """Each rollout's engine input. Built again only for the rollouts
        whose input may differ from the last build: its spec, problems or
        status value changed (the readers keep unchanged values' identity
        and say in ``changed`` which rollouts' spec and status files
        changed), history moved for its rollout file or the nodes it uses
        (``History.changed_since``), or, before it starts, the fleet
        changed. A rewind, new settings, a change in approvals, an
        unverified tree or ``look_at_every`` look at every rollout."""
        history = context.history
        touched = history.changed_since(self.generation)
        changes: dict[str, RolloutInput | None] | None = {}
        if (
            touched is None
            or SETTINGS_PATH in touched
            or context.unverified
            or self.context != (context.refusal, context.approved_by)
        ):
            self._clear()
            changes, touched = None, frozenset()
        affected = self._affected(touched)
        fleet_moved = self.fleet is not documents.fleet
        spec_changed, status_changed = changed
        names: Iterable[str]
        if self.built and spec_changed is not None and status_changed is not None:
            if look_at_every:
                names = self._every(context, documents, statuses, broken, changes)
            else:  # only the rollouts something happened to are looked at
                names = spec_changed | status_changed | affected | self.tip_bound
                if fleet_moved:
                    names |= self.unstarted
        else:
            names = self._every(context, documents, statuses, broken, changes)
        for name in names:
            self._refresh(
                name, context, documents, statuses, broken, affected, fleet_moved, changes
            )
        if isinstance(names, _Every):
            # Kept in queue order, so the engine's sort finds them sorted
            # (but for the few added later) and takes linear time.
            self.built = dict(
                sorted(self.built.items(), key=lambda item: (item[1].input.queue_key, item[0]))
            )
        self.generation = history.generation
        self.context = (context.refusal, context.approved_by)
        self.fleet = documents.fleet
        return BuiltInputs(InputsView(self.built), changes)

    def _clear(self) -> None:
        self.built.clear()
        self.by_node.clear()
        self.tip_bound.clear()
        self.unstarted.clear()

    def _affected(self, touched: frozenset[str]) -> set[str]:
        """The rollouts whose rollout file, or a node file they use, history
        says changed since the last build."""
        affected: set[str] = set()
        for path in touched:
            if path.startswith(ROLLOUTS_DIR + "/"):
                name = name_in(ROLLOUTS_DIR, path)
                if name is not None:
                    affected.add(name)
            else:
                affected.update(self.by_node.get(path, ()))
        return affected

    def _every(
        self,
        context: Context,
        documents: Documents,
        statuses: Mapping[str, RolloutStatus],
        broken: Mapping[str, str],
        changes: dict[str, RolloutInput | None] | None,
    ) -> _Every:
        """Every rollout that has an input; the cache's others are dropped."""
        every = _Every(
            (
                set(documents.rollouts)
                | set(documents.invalid_rollouts)
                | set(statuses)
                | context.unverified
            )
            - set(broken)
        )
        for name in [n for n in self.built if n not in every]:
            self._drop(name, changes)
        return every

    def _refresh(
        self,
        name: str,
        context: Context,
        documents: Documents,
        statuses: Mapping[str, RolloutStatus],
        broken: Mapping[str, str],
        affected: set[str],
        fleet_moved: bool,
        changes: dict[str, RolloutInput | None] | None,
    ) -> None:
        """Build ``name``'s input again unless what it was built from stays."""
        if name == FLEET_STATUS_NAME or name in broken:  # reserved; held
            self._drop(name, changes)
            return
        spec = documents.rollouts.get(name)
        problems = documents.invalid_rollouts.get(name)
        recorded = statuses.get(name)
        if (
            spec is None
            and problems is None
            and recorded is None
            and name not in context.unverified
        ):
            self._drop(name, changes)
            return
        cached = self.built.get(name)
        if (
            cached is not None
            and name not in affected
            and cached.spec is spec
            and cached.problems is problems
            and cached.status is recorded
            and not (cached.unstarted and fleet_moved)
            and not (cached.uses_tip and cached.tip != context.tip)
        ):
            return
        built = self._input(name, context, documents, recorded)
        self._drop(name, changes)
        if changes is not None:
            changes[name] = built.input
        for path in built.node_paths:
            self.by_node.setdefault(path, set()).add(name)
        if built.uses_tip:
            self.tip_bound.add(name)
        if built.unstarted:
            self.unstarted.add(name)
        self.built[name] = built

    def _drop(self, name: str, changes: dict[str, RolloutInput | None] | None) -> None:
        cached = self.built.pop(name, None)
        if cached is None:
            return
        if changes is not None:
            changes[name] = None
        for path in cached.node_paths:
            users = self.by_node.get(path)
            if users is not None:
                users.discard(name)
        self.tip_bound.discard(name)
        self.unstarted.discard(name)

    def _input(
        self,
        name: str,
        context: Context,
        documents: Documents,
        recorded: RolloutStatus | None,
    ) -> Built:
        """One rollout's engine input, and what it was built from."""
        history, tip = context.history, context.tip
        path = rollout_path(name)
        spec = documents.rollouts.get(name)
        source_problems = documents.invalid_rollouts.get(name)
        problems = tuple(source_problems or ())
        present = spec is not None or bool(problems)
        if spec is not None:
            used = (
                [n.name for n in recorded.nodes]
                if recorded and recorded.started
                else engine.select_nodes_by_index(spec, documents.fleet)
            )
            node_paths = [node_path(n) for n in used]
        else:
            node_paths = []
        spec_commit = history.newest(
            [history.last_change(path), context.settings_change, history.last_change_of(node_paths)]
        )
        if spec_commit is not None and context.verified is not None:
            spec_commit = context.verified(spec_commit)
        first_seen = history.first_added(path)
        if recorded is not None:
            spec_commit = spec_commit or recorded.spec_commit
            first_seen = recorded.first_seen_commit or first_seen
        if name in context.unverified and not present:
            # Only an unverified commit has this file (or nothing is
            # verified yet): it is held with the refusal, never started,
            # and never aborted by a removal nobody verified either.
            # Its own reason (``unverified``), with the refusal as it is now.
            present = True
        # A commit id that fell back to the tip, or a queue position that
        # may appear later, is worked out again every pass.
        uses_tip = not spec_commit or not (first_seen or spec_commit)
        first_seen = first_seen or spec_commit or tip
        uses_tip = uses_tip or first_seen not in history
        built = RolloutInput(
            name=name,
            spec=spec,
            file_present=present,
            problems=problems,
            status=recorded,
            spec_commit=spec_commit or tip,
            first_seen_commit=first_seen,
            queue_key=history.position(first_seen) if first_seen in history else 1 << 62,
            author=_author(context, name, spec, recorded, spec_commit),
            paused_by=_paused_by(context, name, spec, recorded, spec_commit),
            aborted_by=_aborted_by(context, name, spec, recorded, spec_commit),
            refusal=context.refusal,
            approved_by=context.approved_by,
        )
        return Built(
            built,
            spec,
            source_problems,
            recorded,
            tuple(node_paths),
            unstarted=spec is not None and not (recorded and recorded.started),
            uses_tip=uses_tip,
            tip=tip,
        )


def _author(
    context: Context,
    name: str,
    spec: RolloutSpec | None,
    recorded: RolloutStatus | None,
    spec_commit: str | None,
) -> str:
    """Who asked: the author of the commit that wrote the rollout's
    current ``rollbackRequest``, not of whatever commit touched its spec
    last (a colleague's resume pushed in the same batch). Searched only
    for a request the status has not recorded yet."""
    if not spec_commit:
        return ""
    source = context.source
    request = spec.rollback_request if spec is not None else None
    if request is None or (recorded and any(r.id == request.id for r in recorded.rollbacks)):
        return source.author(spec_commit)
    return source.author(_request_commit(context, name, request.id, spec_commit))


def _paused_by(
    context: Context,
    name: str,
    spec: RolloutSpec | None,
    recorded: RolloutStatus | None,
    spec_commit: str | None,
) -> OperatorAct | None:
    """Who set ``paused: true``, while it is true: the status's record once
    it has one (as operator pause, or paused before start), else the commit
    that set it (searched once)."""
    if spec is None or not spec.paused or not spec_commit:
        return None
    if (
        recorded is not None
        and recorded.paused_by is not None
        and (recorded.operator_paused or not recorded.started)
    ):
        return recorded.paused_by
    return _act(context, name, spec_commit, lambda r: r.paused)


def _aborted_by(
    context: Context,
    name: str,
    spec: RolloutSpec | None,
    recorded: RolloutStatus | None,
    spec_commit: str | None,
) -> OperatorAct | None:
    """Who set ``abort: true``: looked up only before the abort is
    recorded (a terminal status keeps its own)."""
    if spec is None or not spec.abort or not spec_commit:
        return None
    if recorded is not None and recorded.terminal:
        return recorded.aborted_by
    return _act(context, name, spec_commit, lambda r: r.abort)


def _act(
    context: Context, name: str, spec_commit: str, holds: Callable[[RolloutSpec], bool]
) -> OperatorAct:
    """The author and message of the commit that made ``holds`` true of
    the rollout: the oldest in the unbroken run ending at ``spec_commit``."""
    commit = _oldest_in_run(context, name, spec_commit, holds)
    source = context.source
    message = source.commit_message(commit).strip()[:ACT_MESSAGE_LIMIT]
    return OperatorAct(source.author(commit), commit, message)


def _request_commit(context: Context, name: str, request_id: str, start: str) -> str:
    """The oldest spec commit in the unbroken run, ending at ``start``,
    whose ``rollouts/NAME.yaml`` carries rollbackRequest ``request_id``."""

    def carries(rollout: RolloutSpec) -> bool:
        asked = rollout.rollback_request
        return asked is not None and asked.id == request_id

    return _oldest_in_run(context, name, start, carries)


def _oldest_in_run(
    context: Context, name: str, start: str, holds: Callable[[RolloutSpec], bool]
) -> str:
    """The oldest spec commit in the unbroken run, ending at ``start``,
    whose ``rollouts/NAME.yaml`` is a rollout of which ``holds`` is true."""
    history = context.history
    path = rollout_path(name)
    found = start
    if start not in history:
        return found
    newest = history.position(start)
    walked = 0
    for commit in history.change_commits():  # newest first
        if history.position(commit) > newest:
            continue
        walked += 1
        blob = context.source.file_blob(commit, path)
        rollout = context.parse(blob, path).rollout if blob is not None else None
        if rollout is None or not holds(rollout) or walked > REQUEST_WALK:
            break
        found = commit
    return found


class _Every(frozenset[str]):
    """Every name that has an input: the build then keeps queue order."""
