"""The daemon's one reader of Git: it owns every cache kept between passes
(parsed blobs, documents, statuses, built engine inputs, the fleet status,
the dashboard blob, the last tip) and hands each pass a ``Snapshot`` of what to act on and a
``Delta`` of what changed since the last pass.

It is also where verification is applied: with an approver, the snapshot's
documents are those of the verified tree (never one behind the commit last
acted on), and statuses the verified spec does not back, or that the daemon
did not write, are held. The steps after it read nothing from the tip.

Forgetting the caches changes nothing but the cost (``run --plain`` reads
with a new reader every pass). Must not: decide anything, write anything
but the last-acted positions (``daemon.acted``), or keep rollout state.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field

from reconciler.daemon.acted import ActedPosition, UnsignedStatusPosition
from reconciler.daemon.inputs import BuiltInputs, Context, InputCache
from reconciler.daemon.spec_choice import SpecChoice
from reconciler.daemon.started import StartedRollouts, gone_reason, rewound_reason
from reconciler.daemon.state import DaemonState
from reconciler.daemon.status_trust import StatusTrust, approved_by_records
from reconciler.daemon.verified_history import VerifiedHistory
from reconciler.engine import step as engine
from reconciler.git.approval import (
    Approval,
    Approver,
)
from reconciler.git.approval_notes import notes_tip
from reconciler.git.history import History
from reconciler.git.sshsig import AllowedSigner
from reconciler.git.status_writes import DaemonWrites
from reconciler.git.store import GitStore
from reconciler.readers.fleet_reader import FleetReader
from reconciler.readers.status_reader import StatusReader
from reconciler.spec.documents import Assembly, Documents, ParsedFile, parse_file
from reconciler.spec.errors import StoreError
from reconciler.spec.fleet_status import FleetStatus
from reconciler.spec.paths import (
    DASHBOARD_PATH,
    FLEET_PAGES_DIR,
    FLEET_STATUS_PATH,
    ROLLOUTS_DIR,
    SETTINGS_PATH,
    SPEC_FILES,
    SPEC_FOLDERS,
    STATUS_DIR,
    is_spec_path,
    name_in,
    rollout_path,
    status_path,
)
from reconciler.spec.rollout_status import ApprovalRecord, RolloutStatus

Report = Callable[..., None]  # (event, message, **fields): a standing problem, logged once
REQUEST_WALK = 1000  # old versions kept parsed, for the rollback requests' history


@dataclass(frozen=True)
class Snapshot:
    """What one pass acts on, read at one tip."""

    tip: str
    history: History  # first-parent history up to ``tip``
    approval: Approval | None  # with verification on: what is verified
    spec_commit: str | None  # the commit whose spec tree is acted on
    documents: Documents
    status_branch: str
    status_tip: str | None
    statuses: dict[str, RolloutStatus]
    broken: dict[str, str]  # rollouts whose status cannot be read or is held, with why
    ignored: Mapping[str, str]  # status files no rollout can own: shown path -> why
    # Rollouts seen only in an unverified tree: they get a status saying so.
    unverified: frozenset[str]
    fleet_status: FleetStatus | None  # status/fleet.yaml at the status tip
    refusal: str | None  # why the newest change is not acted on, under verification
    approved_by: tuple[ApprovalRecord, ...]  # who approved the commit acted on
    # The nodes each rollout with an unreadable status may hold.
    held_by_unreadable: dict[str, tuple[str, ...]]


@dataclass(frozen=True)
class Delta:
    """What changed since the last read (None: anything may have)."""

    spec: frozenset[str] | None  # rollouts whose spec files changed since the last read
    status: frozenset[str] | None  # rollouts whose status files changed since the last read
    # Rollouts whose statuses changed since the last pass that ran to its
    # end: what the steps that look at statuses judge again.
    since_pass: frozenset[str] | None
    read_everything: bool  # some folder was read whole (not from changes)


@dataclass
class ReadMemory:
    """The reader's soft state, forgotten on restart: kept by the daemon
    across new readers (``run --plain`` makes one every pass)."""

    # The tip acted on last (or the commit the daemon made on it): a tip
    # that does not contain it is rewritten history, never acted on.
    seen_tip: str | None = None
    # The last readable status of each rollout, since start-up: the nodes
    # a rollout whose status became unreadable may still hold.
    last_readable: dict[str, RolloutStatus] = field(default_factory=dict)

    def held_by_unreadable(
        self,
        documents: Documents,
        statuses: Mapping[str, RolloutStatus],
        broken: Mapping[str, str],
        changed: frozenset[str] | None,
    ) -> dict[str, tuple[str, ...]]:
        """The nodes each rollout with an unreadable status may hold: those
        of its last readable status (remembered here, from ``statuses``:
        those ``changed``, None: all) and those its spec selects. Nobody
        else starts on them until it is repaired."""
        last_readable = self.last_readable
        if changed is None:
            last_readable.update(statuses)
        else:  # only the statuses read again can be new
            for name in changed:
                status = statuses.get(name)
                if status is not None:
                    last_readable[name] = status
        held: dict[str, tuple[str, ...]] = {}
        for name in broken:
            last = last_readable.get(name)
            nodes = {n.name for n in last.nodes} if last is not None else set()
            spec = documents.rollouts.get(name)
            if spec is not None:
                nodes.update(engine.select_nodes_by_index(spec, documents.fleet))
            held[name] = tuple(sorted(nodes))
        return held


@dataclass
class _Caches:
    parsed: dict[str, ParsedFile] = field(default_factory=dict)  # blob id -> parsed document
    documents: tuple[tuple[str | None, ...], Documents] | None = None  # spec tree ids -> them
    documents_commit: str | None = None  # the commit those documents were read at
    assembly: Assembly = field(default_factory=Assembly)  # redone for what changed
    spec_blobs: dict[str, str] = field(default_factory=dict)  # spec path -> blob id
    status_reader: StatusReader = field(default_factory=StatusReader)  # by blob id
    fleet_reader: FleetReader = field(default_factory=FleetReader)  # status/fleet.yaml
    dashboard: tuple[str, bytes] | None = None  # the dashboard blob read last: (id, content)
    # The daemon's last status commit on the statuses it read: (the status
    # tip read, the commit made on it, the status paths it wrote).
    own_status_write: tuple[str, str, frozenset[str]] | None = None


class Reader:
    """Reads a store's tip into snapshots, keeping caches between reads."""

    def __init__(
        self,
        store: GitStore,
        *,
        approver: Approver | None,
        status_signers: Sequence[AllowedSigner],
        report: Report,
        info: Callable[[str, str], None],
        memory: ReadMemory,
        state: DaemonState | None = None,
    ) -> None:
        self.store = store
        self.memory = memory
        self.approver = approver
        self.choice = (
            SpecChoice(
                store.repository(),
                approver,
                ActedPosition(store.repository(), store.branch, state),
                report,
            )
            if approver is not None
            else None
        )
        self.report = report
        self.info = info
        self.caches = _Caches()
        self.input_cache = InputCache()  # engine inputs by rollout
        self._unsettled: set[str] | None = None  # status changes since the last full pass
        self.verified = (
            VerifiedHistory(store.repository(), approver) if approver is not None else None
        )
        self.started = StartedRollouts(state)
        signed = approver is not None and bool(status_signers)
        self.unsigned_status = UnsignedStatusPosition(state, recording=not signed)
        writes = (
            DaemonWrites(store.repository(), status_signers, self.unsigned_status.get())
            if status_signers
            else None
        )
        self.trust = StatusTrust(store, approver, writes) if approver is not None else None
        self._read_everything = False

    # -- the tip -------------------------------------------------------------

    def tip(self) -> str:
        """The branch tip, fetched first from a remote."""
        store = self.store
        tip = store.refresh()
        if tip is None:
            raise StoreError(
                f"branch {store.branch!r} does not exist in {store.location}",
                "push the fleet repository's first commit, or pass --branch",
            )
        return tip

    def rewritten(self, tip: str) -> str | None:
        """Why ``tip`` is refused, when it does not contain the tip seen last."""
        seen, store = self.memory.seen_tip, self.store
        if not seen or tip == seen or store.is_descendant(tip, seen):
            return None
        return (
            f"branch {store.branch!r} moved from {seen[:12]} to {tip[:12]}, which does "
            "not contain it: history was rewritten (a force-push?). Refusing to act on it; "
            "push a commit on top of the history the daemon has seen, or restart the daemon "
            "to accept the new history"
        )

    def approvals_tip(self) -> str | None:
        """A new approval moves no branch, only the notes ref: a quiet pass
        is quiet only while that stays too (docs/trust.md)."""
        if self.approver is None or not self.approver.counts_approvals:
            return None
        return notes_tip(self.store.repository())

    # -- one read ------------------------------------------------------------

    def read(self, tip: str) -> tuple[Snapshot, Delta]:
        """Pick the tree to act on at ``tip`` (the verified one, with
        verification on, and never one behind the last acted on;
        docs/trust.md) and read its documents and the recorded statuses,
        holding those the verified spec does not back."""
        store = self.store
        self._read_everything = False
        history = store.history()
        history.advance(tip)
        approval = self.choice.choose(tip) if self.choice is not None else None
        spec_commit = tip if approval is None else approval.verified_commit
        documents, spec_changed = self._read_documents(spec_commit)
        status_branch = documents.settings.status_branch or store.branch
        status_tip = tip if status_branch == store.branch else store.tip(status_branch)
        statuses, broken, status_changed = self._read_statuses(status_tip)
        ignored = dict(self.caches.status_reader.ignored)
        for path, reason in ignored.items():
            self.report("status_ignored", f"{path}: {reason}", path=path)
        since_pass = status_changed
        ended: set[str] = set()  # held rollouts that ended: they claim no node
        if status_tip is not None:
            self.unsigned_status.record(status_tip)
        if self.trust is None:
            self.started.note(statuses, status_changed)
        else:
            if status_tip is not None:
                ended = self._hold_untrusted(statuses, broken, status_tip, spec_commit)
            ended |= self._hold_gone(statuses, broken)
            since_pass = None  # held statuses leave the mapping
        self._unsettle(since_pass)
        snapshot = Snapshot(
            tip=tip,
            history=history,
            approval=approval,
            spec_commit=spec_commit,
            documents=documents,
            status_branch=status_branch,
            status_tip=status_tip,
            statuses=statuses,
            broken=broken,
            ignored=ignored,
            unverified=self._unverified_names(
                history, approval, spec_commit, statuses.keys() | broken
            ),
            fleet_status=self._own_fleet(status_tip, documents.settings.fleet_check_interval),
            refusal=_refusal_text(approval),
            approved_by=self._approved_by(approval),
            held_by_unreadable=self.memory.held_by_unreadable(
                documents,
                statuses,
                {n: r for n, r in broken.items() if n not in ended},
                status_changed if since_pass is not None else None,
            ),
        )
        unsettled = self._unsettled
        delta = Delta(
            spec=spec_changed,
            status=status_changed,
            since_pass=frozenset(unsettled) if unsettled is not None else None,
            read_everything=self._read_everything,
        )
        return snapshot, delta

    def inputs(self, snapshot: Snapshot, delta: Delta) -> BuiltInputs:
        """Each rollout's engine input for ``snapshot``, built again only
        where ``delta`` or history says it may differ (``inputs.py``)."""
        history, tip = snapshot.history, snapshot.tip
        verified: Callable[[str], str] | None = None
        if self.verified is not None and snapshot.spec_commit is not None:
            # Every commit id a status gets is a verified one (docs/trust.md).
            history, tip = self.verified.at(snapshot.spec_commit), snapshot.spec_commit
            verified = self.verified.covering
        context = Context(
            tip=tip,
            history=history,
            verified=verified,
            source=self.store,
            parse=self.parse,
            refusal=snapshot.refusal,
            approved_by=snapshot.approved_by,
            unverified=snapshot.unverified,
            settings_change=history.last_change(SETTINGS_PATH),
        )
        return self.input_cache.build(
            context,
            snapshot.documents,
            snapshot.statuses,
            snapshot.broken,
            (delta.spec, delta.status),
            look_at_every=self.trust is not None,
        )

    def settle(self) -> None:
        """A pass ran to its end: every step saw the changes handed out."""
        self._unsettled = set()

    def acted_on(self, tip: str) -> None:
        """A pass acted on ``tip`` (the tip it read, or the commit it made
        on it): every later tip must contain it."""
        self.memory.seen_tip = tip

    def _unsettle(self, names: frozenset[str] | None) -> None:
        if names is None:
            self._unsettled = None
        elif self._unsettled is not None:
            self._unsettled.update(names)

    def _hold_untrusted(
        self,
        statuses: dict[str, RolloutStatus],
        broken: dict[str, str],
        status_tip: str,
        spec_commit: str | None,
    ) -> set[str]:
        """Move the statuses the daemon did not write, or the verified spec
        does not back, from ``statuses`` into ``broken``; return those of
        them that ended (they claim no node)."""
        assert self.trust is not None
        before = dict(statuses)
        tampered = self.trust.hold_unwritten(statuses, status_tip)
        # Statuses belong to the verified history (never to a refused tip's,
        # nor to one held back at the commit last acted on).
        chain: Container[str] = (
            self.verified.at(spec_commit)
            if self.verified is not None and spec_commit is not None
            else frozenset()
        )
        tampered.update(
            self.trust.hold_tampered(statuses, chain, self.caches.parsed, self.started.wrote)
        )
        for name, reason in tampered.items():
            broken[name] = reason
            self.report("status_tampered", reason, rollout=name)
        return {name for name in tampered if before[name].terminal}

    def _hold_gone(self, statuses: dict[str, RolloutStatus], broken: dict[str, str]) -> set[str]:
        """Record the rollouts started, and hold those the daemon started
        whose status is gone (deleted, or its status branch deleted or
        rewound): never taken for not started. Return those that ended."""
        ended: set[str] = set()
        for name, entry in sorted(self.started.rewound(statuses).items()):
            del statuses[name]
            broken[name] = rewound_reason(name, entry)
            self.report("status_tampered", broken[name], rollout=name)
            ended.add(name)
        self.started.note(statuses)
        for name, entry in sorted(self.started.gone(statuses, broken).items()):
            reason = gone_reason(name, entry)
            broken[name] = reason
            self.report("status_tampered", reason, rollout=name)
            if entry.ended:
                ended.add(name)
        return ended

    def _approved_by(self, approval: Approval | None) -> tuple[ApprovalRecord, ...]:
        """Who approved the verified commit acted on, and the approval rules
        each counted for (docs/approval-rules.md), when approvals are asked
        for; () otherwise."""
        approver = self.approver
        if approver is None or approval is None or approval.verified_commit is None:
            return ()
        return approved_by_records(approver, approval.verified_commit)

    def _unverified_names(
        self,
        history: History,
        approval: Approval | None,
        spec_commit: str | None,
        recorded: Container[str],
    ) -> frozenset[str]:
        """Rollouts named in the tip's tree while it is not verified that
        get a status saying why nothing happens (docs/trust.md): those with
        one already, and those an allowed signer changed last (short of
        approvals, say). A name from a commit nobody signed becomes no
        status file: it is reported, and waits for a verified commit."""
        if approval is None or not approval.refusals or self.approver is None:
            return frozenset()
        held: set[str] = set()
        store, approver = self.store, self.approver
        for name, signed in unverified_rollouts(store, approver, history, spec_commit):
            if signed or name in recorded:
                held.add(name)
            else:
                self.report("unverified_rollout", unverified_only(name), rollout=name)
        return frozenset(held)

    # -- documents -----------------------------------------------------------

    def parse(self, blob_id: str, path: str) -> ParsedFile:
        """The file at ``path`` with blob ``blob_id``, parsed once per blob."""
        parsed = self.caches.parsed.get(blob_id)
        if parsed is None or parsed.path != path:
            parsed = parse_file(path, self.store.blob(blob_id))
            self.caches.parsed[blob_id] = parsed
        return parsed

    def _read_documents(self, commit: str | None) -> tuple[Documents, frozenset[str] | None]:
        """The documents of ``commit``'s tree, and the rollouts whose files
        changed since the last read (None: read whole); reassembled only
        when a spec subtree changed, and then only for the files that
        changed since the commit read last (``git.history.changed_paths``,
        rewinds included; ``spec.documents.Assembly`` falls back to every
        file when a node, the settings or a rule across files is involved);
        reparsed only for blobs not seen before."""
        store, caches = self.store, self.caches
        if commit is None:
            key: tuple[str | None, ...] = (None,)
        else:
            key = (
                *(store.subtree_id(commit, folder) for folder in SPEC_FOLDERS),
                store.file_blob(commit, SETTINGS_PATH),
            )
        if caches.documents and caches.documents[0] == key:
            return caches.documents[1], frozenset()
        before = caches.documents_commit
        paths = (
            self._changed_paths(before, commit, (*SPEC_FOLDERS, *SPEC_FILES))
            if commit is not None and before is not None and caches.assembly.documents is not None
            else None
        )
        changed_names: frozenset[str] | None
        if commit is not None and paths is not None:
            documents = caches.assembly.update(self._reparse(commit, paths))
            changed_names = caches.assembly.changed_names
        else:
            changed_names = None
            self._read_everything = True
            blobs = store.spec_files(commit) if commit is not None else {}  # path -> blob id
            documents = caches.assembly.rebuild(
                self.parse(blob_id, path) for path, blob_id in blobs.items()
            )
            caches.spec_blobs = blobs
        if len(caches.parsed) > 2 * len(caches.spec_blobs) + REQUEST_WALK:
            # Old versions parsed for rollback requests' history: forgotten.
            live = set(caches.spec_blobs.values())
            for blob_id in [b for b in caches.parsed if b not in live]:
                del caches.parsed[blob_id]
        for problem in documents.problems:
            self.report("invalid_document", str(problem), path=problem.path)
        caches.documents = (key, documents)
        caches.documents_commit = commit
        return documents, changed_names

    def _reparse(self, commit: str, paths: frozenset[str]) -> dict[str, ParsedFile | None]:
        """The spec files among ``paths`` as they are at ``commit`` (None: gone)."""
        caches = self.caches
        changed: dict[str, ParsedFile | None] = {}
        for path in paths:
            if not is_spec_path(path):
                continue  # nested deeper than the daemon reads
            old_blob = caches.spec_blobs.pop(path, None)
            if old_blob is not None:
                caches.parsed.pop(old_blob, None)
            blob_id = self.store.file_blob(commit, path)
            if blob_id is None:
                changed[path] = None
            else:
                caches.spec_blobs[path] = blob_id
                changed[path] = self.parse(blob_id, path)
        return changed

    def _changed_paths(
        self, before: str | None, commit: str | None, paths: tuple[str, ...]
    ) -> frozenset[str] | None:
        """The files under ``paths`` (folders, and top-level files) that
        differ between the commit read last and ``commit``; None when the
        commit read last is gone (a mirror's objects after a force-push):
        then everything is read again."""
        folders = tuple(p for p in paths if p not in SPEC_FILES)
        files = tuple(p for p in paths if p in SPEC_FILES)
        try:
            return self.store.changed_paths(before, commit, folders, files)
        except StoreError as exc:
            self.info("read_everything", f"{exc}; reading every file again")
            return None

    # -- statuses ------------------------------------------------------------

    def _read_statuses(
        self, commit: str | None
    ) -> tuple[dict[str, RolloutStatus], dict[str, str], frozenset[str] | None]:
        """Recorded statuses by rollout name, the names whose status files
        cannot be read (with why: those are held, never overwritten), and
        the rollouts whose files changed since the last read (None: any)."""
        caches = self.caches
        reader = caches.status_reader
        # After its own commit on the statuses read last, the daemon knows
        # what changed up to that commit: only what came after is compared
        # (one tree id, unless someone else wrote status files since).
        base, written = reader.at, frozenset[str]()
        own, caches.own_status_write = caches.own_status_write, None
        if own is not None and own[0] == reader.at:
            _, base, written = own
        changed = (
            self._changed_paths(base, commit, (STATUS_DIR,))
            if commit is not None and base is not None
            else None
        )
        if changed is not None:
            # Only the rollouts whose status files changed since the last
            # read are read again (a rewind is a change like any other).
            statuses, broken = reader.read_changed(self.store, commit, changed | written)
        else:
            statuses, broken = reader.read(self.store, commit)
            self._read_everything = True
        for name, reason in broken.items():
            self.report(
                "status_unreadable",
                f"{reason}; the rollout is held and its status file is left as it is: "
                f"restore it with `git revert` or delete {status_path(name)} to start the "
                "rollout anew",
                rollout=name,
            )
        return statuses, broken, reader.changed_names

    def _own_fleet(self, commit: str | None, check_interval: int) -> FleetStatus | None:
        """The fleet status at ``commit`` when it is the daemon's own
        record: none while the fleet check is off (no sweep of the daemon's
        stands behind any file then), and with signed status commits only
        files as the newest daemon-signed commit left them, as for rollout
        statuses (docs/trust.md). A pushed ``status/fleet.yaml`` is a
        person's claim: not served, and replaced by the next decision."""
        if commit is None or check_interval == 0:
            return None
        fleet = self._fleet_at(commit)
        writes = self.trust.writes if self.trust is not None else None
        if fleet is None or writes is None:
            return fleet
        store = self.store
        files = dict(store.files(commit, FLEET_PAGES_DIR))
        files[FLEET_STATUS_PATH] = store.file_blob(commit, FLEET_STATUS_PATH) or ""
        wrong = writes.unwritten(commit, files)
        if not wrong:
            return fleet
        path, why = min(wrong.items())
        self.report(
            "fleet_status_unwritten",
            f"{path}: {why}; the fleet status is not served or used until the next sweep's "
            "decision replaces it",
            path=path,
        )
        return None

    def _fleet_at(self, commit: str | None) -> FleetStatus | None:
        """``status/fleet.yaml`` at ``commit``, parsed once per blob. A file
        that is not a fleet status is reported and replaced by the next
        decision: it is the daemon's record, not an operator's input."""
        try:
            return self.caches.fleet_reader.read(self.store, commit)
        except ValueError as exc:
            self.report(
                "fleet_status_unreadable",
                f"{exc}; the next sweep's decision replaces {FLEET_STATUS_PATH}",
            )
            return None

    def dashboard_text(self, blob_id: str) -> bytes:
        """The dashboard blob's content; the last one read is kept (it is
        large at thousands of rollouts, and mostly the same blob)."""
        kept = self.caches.dashboard
        if kept is None or kept[0] != blob_id:
            kept = self.caches.dashboard = (blob_id, self.store.blob(blob_id))
        return kept[1]

    # -- after a commit ------------------------------------------------------

    def remember_commit(
        self,
        snapshot: Snapshot,
        commit: str,
        changes: Mapping[str, bytes | None],
        written: Mapping[str, object],
        statuses: Mapping[str, RolloutStatus],
        fleet: FleetStatus | None,
    ) -> None:
        """What the daemon just committed on ``snapshot``'s status tip is
        what the next read finds there: not read again."""
        caches = self.caches
        self.started.note(statuses, [n for n in statuses if status_path(n) in written])
        self.unsigned_status.record(commit)
        if snapshot.status_tip is not None and snapshot.status_tip == caches.status_reader.at:
            caches.own_status_write = (
                snapshot.status_tip,
                commit,
                frozenset(path for path in changes if path.startswith(STATUS_DIR + "/")),
            )
        if DASHBOARD_PATH in changes:
            written_id = self.store.file_blob(commit, DASHBOARD_PATH)
            dashboard = changes[DASHBOARD_PATH]
            if written_id is not None and dashboard is not None:
                caches.dashboard = (written_id, dashboard)
        if fleet is not None:
            caches.fleet_reader.remember(self.store, commit, fleet)
        caches.status_reader.remember(self.store, commit, written, statuses)


def _refusal_text(approval: Approval | None) -> str | None:
    """Why the newest change is not acted on, for the statuses it concerns."""
    if approval is None or not approval.refusals:
        return None
    newest = approval.refusals[0]
    fallback = (
        f"acting on {approval.verified_commit[:12]}, the newest verified change"
        if approval.verified_commit
        else "no verified change yet, so nothing is acted on"
    )
    if not newest.author:  # a backwards move, not a commit's signature
        return f"{newest.reason}; {fallback.replace('the newest verified', 'the last verified')}"
    return (
        f"commit {newest.commit[:12]} by {newest.author} not verified: {newest.reason}; {fallback}"
    )


def unverified_rollouts(
    store: GitStore, approver: Approver, history: History, verified: str | None
) -> list[tuple[str, bool]]:
    """The rollouts in the tip's tree (``history``'s) that the verified tree
    lacks, each with whether an allowed signer made its file's last change."""
    tip = history.tip
    if tip is None:
        return []
    known = set(store.files(verified, ROLLOUTS_DIR)) if verified else set()
    found: list[tuple[str, bool]] = []
    for path in sorted(store.files(tip, ROLLOUTS_DIR)):
        name = name_in(ROLLOUTS_DIR, path)
        if name is None or path in known:
            continue
        last = history.last_change(path)
        found.append((name, last is not None and approver.check_signature(last).ok))
    return found


def unverified_only(name: str) -> str:
    """Why a rollout only unverified commits have gets no status file."""
    return (
        f"{rollout_path(name)} is only in commits that are not verified: no status is "
        "written for it and nothing is sent; sign the commit (and approve it, where "
        "approvals are required) to start it"
    )
