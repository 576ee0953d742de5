"""Whether a recorded status may be acted on under verification (docs/trust.md): nothing a job carries may come from unverified data.

Status files are written by the daemon, but anyone with push access can
commit to ``status/`` without a signature, and jobs are built from status
alone. So, with ``--allowed-signers``, the daemon derives again, from the
verified spec at the rollout's ``startCommit``, everything the engine froze
at start (target, mode, batch size, policy, selection and node list) and
compares. It also checks what can be checked of each node record without
the agents: job ids are derived from (rollout, startCommit, node, attempt,
kind), and a job's ``sourceCommit`` must be a commit of the branch's
first-parent history. A status that disagrees anywhere is *tampered*: the
daemon holds it as it holds an unreadable one (nothing stepped, nothing
sent, the file left as it is) and names the fields.

``tampered_fields`` is pure: values in, field names out. ``StatusTrust``
reads the verified spec at each ``startCommit`` from the repository for the
daemon and for ``reconciler verify``, which must agree. Which blob the
daemon itself last wrote to a status file is ``git.status_writes``.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from reconciler.engine.step import select_nodes_by_index
from reconciler.git.approval import Approver
from reconciler.git.status_writes import STATUS_FOLDER, DaemonWrites, status_files_at
from reconciler.git.store import GitStore
from reconciler.protocol.job_ids import job_id
from reconciler.spec.batch_shapes import batch_numbers, spread_numbers
from reconciler.spec.documents import Documents, ParsedFile, assemble, parse_file
from reconciler.spec.model import Fleet, RolloutSpec
from reconciler.spec.paths import ROLLOUTS_DIR as ROLLOUTS_FOLDER
from reconciler.spec.rollout_status import (
    FROZEN_FIELDS,
    ApprovalRecord,
    FrozenSpec,
    RolloutStatus,
    freeze,
    main_path,
)


@dataclass(frozen=True)
class StartSpec:
    """What the verified spec at a rollout's ``startCommit`` fixes."""

    frozen: FrozenSpec
    nodes: tuple[str, ...]  # the selection at that commit, in rollout order
    # with spreadBy: each selected node's value of its label at that commit
    labels: Mapping[str, str] = field(default_factory=dict)


def start_spec(spec: RolloutSpec, fleet: Fleet) -> StartSpec:
    """The frozen values the engine records when it starts ``spec``
    (``engine`` ``start``), and the nodes it selects in ``fleet``."""
    nodes = select_nodes_by_index(spec, fleet)
    labels: dict[str, str] = {}
    if spec.spread_by is not None:
        by_name = fleet.by_name()
        labels = {n: by_name[n].label(spec.spread_by.label) or "" for n in nodes}
    return StartSpec(frozen=freeze(spec), nodes=nodes, labels=labels)


# What a status must agree on with its start: every frozen field, the target
# field by field (so that a tampered model is named as such).
_FROZEN_FIELDS: tuple[tuple[str, Callable[[FrozenSpec], object]], ...] = (
    ("target.runtime", lambda f: f.target.runtime),
    ("target.provider", lambda f: f.target.provider),
    ("target.model", lambda f: f.target.model),
    ("target.profile", lambda f: f.target.profile),
    *(
        (doc, attrgetter(attr))
        for attr, doc in FROZEN_FIELDS
        if attr not in ("target", "artifacts")
    ),
    ("artifacts", attrgetter("artifacts")),  # as the status file writes it
)


def _batch_numbers(status: RolloutStatus, expected: StartSpec) -> tuple[int, ...]:
    """The batch of each node record as the engine numbers them at start."""
    frozen = status.frozen
    assert frozen is not None
    if frozen.spread_by is None:
        return batch_numbers(frozen.batches, frozen.batch_size, len(status.nodes))
    values = [expected.labels.get(n.name, "") for n in status.nodes]
    return spread_numbers(values, frozen.batches, frozen.batch_size, frozen.spread_by.max_per_batch)


def tampered_fields(
    status: RolloutStatus,
    expected: StartSpec | None,
    on_branch: Callable[[str], bool],
) -> tuple[str, ...]:
    """The fields of a started ``status`` that the verified spec at its
    ``startCommit`` (``expected``; None: no verified spec there) does not
    back, as written in the status file; () when it agrees.

    ``on_branch(commit)``: is the commit in the branch's first-parent
    history? A ``startCommit`` elsewhere (an unmerged branch, an unverified
    commit) would let a status name its own spec.
    """
    if not status.started or status.frozen is None:
        return ()
    start = status.start_commit
    assert start is not None
    if not on_branch(start):
        return ("startCommit",)
    if expected is None:
        return ("startCommit",)
    wrong = [
        f"frozen.{name}"
        for name, get in _FROZEN_FIELDS
        if get(status.frozen) != get(expected.frozen)
    ]
    names = [n.name for n in status.nodes]
    if not _in_order_within(names, expected.nodes):
        wrong.append("frozen.nodes")
    numbers = _batch_numbers(status, expected)
    for i, node in enumerate(status.nodes):
        where = f"nodes[{node.name}]"
        if status.frozen.batch_size > 0 and node.batch != numbers[i]:
            wrong.append(f"{where}.batch")
        if node.job_id is not None and node.job_id != job_id(
            status.name, start, node.name, node.attempt, "apply"
        ):
            wrong.append(f"{where}.jobId")
        if node.source_commit is not None and not on_branch(node.source_commit):
            wrong.append(f"{where}.sourceCommit")
        restore = node.restore
        if restore is not None:
            if restore.job_id != job_id(
                status.name, start, node.name, restore.attempt, "restore", restore.request
            ):
                wrong.append(f"{where}.restore.jobId")
            if not on_branch(restore.source_commit):
                wrong.append(f"{where}.restore.sourceCommit")
    return tuple(wrong)


def _in_order_within(names: list[str], selected: tuple[str, ...]) -> bool:
    """Are ``names`` distinct and a subsequence of ``selected``? Not equal:
    a node whose file changed after ``startCommit`` may have left the
    selection the daemon saw at start, never joined it (its change would
    have moved ``startCommit``)."""
    if len(set(names)) != len(names):
        return False
    position = {name: i for i, name in enumerate(selected)}
    last = -1
    for name in names:
        i = position.get(name)
        if i is None or i <= last:
            return False
        last = i
    return True


class StatusTrust:
    """Holds statuses the verified spec does not back (see the module
    docstring). Keeps, per status value, its answer while approvals stay
    as they were, and per (rollout, verified commit at its startCommit)
    what the verified spec there fixes: a commit's verified spec never
    changes, so each is read once."""

    def __init__(
        self, store: GitStore, approver: Approver, writes: DaemonWrites | None = None
    ) -> None:
        self.store = store
        self.approver = approver
        self.writes = writes
        # by id(value), the value kept alive with its answer
        self._checked: dict[int, tuple[RolloutStatus, tuple[str, ...]]] = {}
        self._start_specs: dict[tuple[str, str], StartSpec | None] = {}
        self._approvals_seen: object = None
        self._documents: dict[str, Documents] = {}

    def hold_tampered(
        self,
        statuses: dict[str, RolloutStatus],
        history: Container[str],
        parsed: Mapping[str, ParsedFile] | None = None,
        wrote: Callable[[str, str], bool] | None = None,
    ) -> dict[str, str]:
        """Remove every tampered status from ``statuses``; return why each
        is held, by rollout name. ``history``: the branch's first-parent
        commits; ``parsed``: documents already parsed, by blob id;
        ``wrote(name, startCommit)``: did the daemon start it there?

        A status the daemon started from a commit that does not verify
        under the current policy (verification or approvals turned on
        since) is not tampered: an ended one is kept as it is (nothing is
        sent for it but restores a verified request asks for), a running
        one is held, worded as what it is."""
        checked: dict[int, tuple[RolloutStatus, tuple[str, ...]]] = {}
        held: dict[str, str] = {}
        approvals = self.approver.approvals_state()
        if approvals != self._approvals_seen:
            self._checked = {}  # an answer may rest on approvals that moved
            self._approvals_seen = approvals
        for name, value in list(statuses.items()):
            if not value.started or value.start_commit is None:
                continue
            known = self._checked.get(id(value))
            if known is not None and known[0] is value:
                fields = known[1]
            else:
                expected = self.start_spec(name, value.start_commit, parsed or {})
                fields = tampered_fields(value, expected, history.__contains__)
            checked[id(value)] = (value, fields)
            if not fields:
                continue
            if fields == ("startCommit",) and wrote is not None and wrote(name, value.start_commit):
                if value.terminal:
                    continue
                del statuses[name]
                held[name] = unverifiable_reason(name, value.start_commit)
                continue
            del statuses[name]
            held[name] = tampered_reason(name, value.start_commit, fields)
        self._checked = checked
        return held

    def hold_unwritten(self, statuses: dict[str, RolloutStatus], status_tip: str) -> dict[str, str]:
        """With signed status commits (``writes``): remove every status one
        of whose files is not as the newest daemon-signed write left it;
        return why each is held."""
        if self.writes is None or not statuses:
            return {}
        files = status_files_at(self.store.repository(), status_tip)
        wrong = self.writes.unwritten(status_tip, files)
        held: dict[str, str] = {}
        for path, why in sorted(wrong.items()):
            name = path[len(STATUS_FOLDER) + 1 :].split("/", 1)[0].removesuffix(".yaml")
            if name in statuses and name not in held:
                del statuses[name]
                held[name] = held_reason(name, f"{path}: {why}")
        return held

    def start_spec(
        self, name: str, start: str, parsed: Mapping[str, ParsedFile]
    ) -> StartSpec | None:
        """What the verified spec at ``start`` fixes for rollout ``name``
        (None: no verified spec of it there)."""
        # Keyed by the verified commit, which approvals can move (a new or a
        # withdrawn approval): its spec never changes, so each is read once.
        verified = self.approver.approve(start).verified_commit
        key = (name, verified or "")
        if key in self._start_specs:
            return self._start_specs[key]
        expected = None
        if verified is not None:
            documents = self.documents_at(verified, parsed)
            spec = documents.rollouts.get(name)
            expected = start_spec(spec, documents.fleet) if spec is not None else None
        if len(self._start_specs) > 10_000:
            self._start_specs.clear()
        self._start_specs[key] = expected
        return expected

    def documents_at(self, commit: str, parsed: Mapping[str, ParsedFile]) -> Documents:
        """The documents of a verified tree; the last few are kept."""
        cached = self._documents.get(commit)
        if cached is not None:
            return cached
        store = self.store
        blobs = store.spec_files(commit)
        known = (parsed.get(blob_id) for blob_id in blobs.values())
        documents = assemble(
            seen if seen is not None and seen.path == path else parse_file(path, store.blob(blob))
            for (path, blob), seen in zip(blobs.items(), known, strict=True)
        )
        if len(self._documents) >= 4:
            self._documents.pop(next(iter(self._documents)))
        self._documents[commit] = documents
        return documents


def tampered_reason(name: str, start: str, fields: tuple[str, ...]) -> str:
    """The held status's message: what disagrees and what a person can do."""
    why = (
        f"its startCommit {start[:12]} has no verified spec of it in the branch's "
        "first-parent history (started from a change that was not verified?)"
        if fields == ("startCommit",)
        else f"it disagrees with the verified spec at startCommit {start[:12]} in "
        + ", ".join(fields[:10])
        + (f" and {len(fields) - 10} more" if len(fields) > 10 else "")
    )
    return held_reason(name, why)


def unverifiable_reason(name: str, start: str) -> str:
    """A running rollout the daemon started at a commit that the current
    policy does not verify: held, and said to be that, not tampering."""
    return (
        f"not_verifiable: rollout {name} was started by the daemon at {start[:12]}, which "
        "is not verifiable under the current policy (verification or approvals were turned "
        "on since): nothing is sent for it and its nodes stay claimed; let it end under the "
        f"old policy, or remove {ROLLOUTS_FOLDER}/{name}.yaml and {main_path(name)} in a "
        "signed commit"
    )


def held_reason(name: str, why: str) -> str:
    path = main_path(name)
    return (
        f"status_tampered: {path} is not verified: {why}; nothing is sent for it and "
        f"the file is left as it is: restore the daemon's last version (`git log -p -- "
        f"{path}`); a status of a rollout the daemon never started may be deleted, to "
        "start it from the verified spec"
    )


def approved_by_records(approver: Approver, verified: str) -> tuple[ApprovalRecord, ...]:
    """The ``approvedBy`` records of a status acted on at ``verified``: each
    approval counted, one per person, with the approval rules it counted
    for (docs/approval-rules.md); () when no approval was asked for."""
    return tuple(
        ApprovalRecord(a.principal, a.key_id, a.rules)
        for a in approver.judgement(verified).approved_by()
    )
