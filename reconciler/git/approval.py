"""Which tree the daemon may act on, when commits must be signed (docs/trust.md).

A *spec commit* has ``rollouts/``, ``nodes/`` or ``reconciler.yaml``
different from any of its parents' (a root commit: holds any of them). Only
spec commits need a signature; a commit touching only a README or
``status/`` never blocks anything. Walking first-parent history from the
root to a tip, each spec commit is judged on its change from the *verified
commit* before it (none yet: from nothing, with its own rules), or from the
commit the daemon last acted on (``judge_after``) when that one lies between
and no longer verifies, so that a signer leaving the allowed-signers file
never hands the next commit its own rules; the newest
one that passes is the verified commit, whose spec paths are what the
daemon acts on. Every newer spec commit is a refusal, kept with its reason,
and ignored entirely (an ``abort`` included). The daemon also never moves
backwards: a verified commit that does not descend by first parent from the
one it last acted on (kept in the ref ``ACTED_REF + branch``) is refused too
(``refuse_backwards``).

A commit passes with a valid signature by an allowed signer and, when asked
for, approvals in its note under ``refs/notes/reconciler-approvals``
(``reconciler.git.approval_notes``): ``required_approvals`` N people other
than its signer, and for every approval rule of the verified tree before it
that its change touches (``reconciler.git.approval_rules``), that rule's
``require`` people among its principals. A change that only sets ``paused:
true`` or ``abort: true`` needs its signature alone: stopping never waits.

Results are memoised per commit id: a first-parent chain's verdict is a
function of the chain, so a new tip costs a walk back to the last commit
seen, and an unchanged tip costs a dict lookup. Approvals change without the
branch moving, so the per-commit memo is dropped whenever the notes ref
moves or a validity window of an allowed signer opens or closes; what a
change touches is kept per (commit, verified commit before it), forever.

Reads the repository with pygit2 and decides nothing about rollouts; the
signature checks are ``reconciler.git.sshsig`` (SSH) and
``reconciler.git.openpgp`` (a forge's OpenPGP merge key, with
``--allowed-pgp-keys``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import TypeVar

import pygit2

from reconciler.git.approval_notes import (
    Approvals,
    ApprovedBy,
    RuleCount,
    changed_notes,
    count_approvals,
    note_ids,
    note_text,
    notes_tip,
    people,
)
from reconciler.git.approval_rules import Change, RuleTables, rules_at
from reconciler.git.openpgp import PGP_ARMOR, PgpKeyring
from reconciler.git.sshsig import (
    AllowedSigner,
    SignatureCheck,
    parse_allowed_signers,
    verify_sshsig,
)
from reconciler.git.tree_reader import entry_of
from reconciler.spec.errors import ReconcilerError, StoreError
from reconciler.spec.model import ApprovalRule
from reconciler.spec.paths import SPEC_PATHS

# Bounds on the memo tables: a long-running daemon adds a status commit per
# change; only the recent chain matters for the next tip.
_MAX_APPROVALS = 20_000
_MAX_CHECKS = 20_000
# More notes changed at once than this: forget everything, which is cheaper
# than finding each one's place in history.
_MANY_NOTES = 64

_K = TypeVar("_K")
_V = TypeVar("_V")


@dataclass(frozen=True)
class Refusal:
    """A spec commit the daemon will not act on, and why, in words."""

    commit: str
    reason: str
    author: str  # "Name <email>"
    # signed by an allowed signer and short only of approvals: the ordinary
    # wait of a reviewed change, not a push to be alarmed about
    awaits_approval: bool = False


@dataclass(frozen=True)
class Approval:
    # newest first-parent commit whose tree the daemon may act on for spec
    # paths (None: nothing verified yet)
    verified_commit: str | None
    # newest commit at the tip that changed spec paths (None: none ever did)
    newest_spec_commit: str | None
    # the unverified spec commits newer than verified_commit, newest first
    refusals: tuple[Refusal, ...]
    # the commit the daemon last acted on, when it lies on this chain after
    # verified_commit (it no longer verifies: its signer left the allowed
    # signers): later spec commits are judged against it, never from nothing
    acted_floor: str | None = None

    @property
    def base(self) -> str | None:
        """The commit the next spec commit on this chain is judged against."""
        return self.acted_floor or self.verified_commit

    @property
    def acted_on(self) -> bool:
        """True when the tip's spec is the verified one (nothing refused)."""
        return not self.refusals


_NOTHING = Approval(None, None, ())


@dataclass(frozen=True)
class Judgement:
    """A spec commit's verdict, judged on its change from ``base`` (the
    verified commit before it; None: none yet) with ``base``'s rules."""

    commit: str
    base: str | None
    signature: SignatureCheck
    # None when no approval is asked for (a bad signature, or neither a
    # global minimum nor a rule applies)
    approvals: Approvals | None = None
    rules: tuple[RuleCount, ...] = ()  # each rule that applies, in its order
    stops_only: bool = False  # only paused: true / abort: true edits

    @property
    def approved(self) -> bool:
        """Are the approvals enough (the global minimum and every rule)?"""
        if self.approvals is None:
            return True
        return self.approvals.ok and all(r.ok for r in self.rules)

    @property
    def ok(self) -> bool:
        return self.signature.ok and (self.approved or self.stops_only)

    @property
    def reason(self) -> str:
        signature, approvals = self.signature, self.approvals
        if not signature.ok or approvals is None:
            return signature.reason
        if not self.approved:
            if self.stops_only:
                return f"{signature.reason}; it only sets paused or abort, which needs no approval"
            short = [approvals.summary()] if not approvals.ok else []
            rules = [r.summary() for r in self.rules if not r.ok]
            if rules:
                short.append(
                    "; ".join(rules) + approvals.ignored_text() + approvals.how_to_approve()
                )
            return "; ".join(short)
        parts = [signature.reason]
        if approvals.required or not self.rules:
            parts.append(approvals.summary())
        parts += [r.summary() for r in self.rules]
        return "; ".join(parts)

    def approved_by(self) -> tuple[ApprovedBy, ...]:
        """The approvals counted, one per person, each with the rules it
        counted for."""
        if self.approvals is None:
            return ()
        approvals = self.approvals
        return tuple(
            ApprovedBy(
                a.principal,
                a.key_id,
                tuple(r.rule for r in self.rules if approvals.person_of(a) in r.persons),
            )
            for a in approvals.counted
        )

    @cached_property
    def check(self) -> SignatureCheck:
        """The verdict as a signature check (the signature's own when no
        approval was asked for)."""
        if self.approvals is None:
            return self.signature
        return SignatureCheck(self.ok, self.reason, self.signature.principal, self.signature.key_id)


class Approver:
    """Finds the verified commit for a tip; caches per commit id."""

    def __init__(
        self,
        repo: pygit2.Repository,
        allowed: Sequence[AllowedSigner],
        *,
        required_approvals: int = 0,
        pgp: PgpKeyring | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.repo = repo
        self.allowed = tuple(allowed)
        self.required_approvals = required_approvals
        self.pgp = pgp
        self.clock = clock
        self._acted: str | None = None  # the commit the daemon last acted on
        self._approvals: dict[str, Approval] = {}
        # first-parent distance from the root of each commit in _approvals
        self._depth: dict[str, int] = {}
        self._checks: dict[str, SignatureCheck] = {}  # signature verdicts, forever
        # (commit, base) -> verdict with approvals, per notes tip
        self._verdicts: dict[tuple[str, str | None], Judgement] = {}
        # (commit, base) -> the rules its change touches, forever
        self._matches: dict[tuple[str, str | None], tuple[ApprovalRule, ...]] = {}
        self._spec: dict[str, bool] = {}  # is it a spec commit, forever
        self._rule_tables = RuleTables()  # what judging the changes read, forever
        # (commit, note blob, signature ok, open windows) -> approvals counted
        self._counted: dict[tuple[str, str, bool, int], Approvals] = {}
        self._notes_index: tuple[str | None, dict[str, str]] | None = None
        self.persons = people(self.allowed)
        self._notes: str | None = None
        self._judged_at: datetime | None = None
        # When an allowed signer's window opens or closes, approvals change.
        self._boundaries = sorted(
            {t for s in self.allowed for t in (s.valid_after, s.valid_before) if t is not None}
        )

    def fresh(self) -> Approver:
        """An approver with this one's policy and none of its memory
        (``run --plain`` judges every pass afresh)."""
        return Approver(
            self.repo,
            self.allowed,
            required_approvals=self.required_approvals,
            pgp=self.pgp,
            clock=self.clock,
        )

    @property
    def counts_approvals(self) -> bool:
        """Can approvals change a verdict here? With a global minimum, or
        with allowed signers whose approvals a tree's rules may ask for."""
        return bool(self.required_approvals or self.allowed)

    def judge_after(self, acted: str | None) -> None:
        """Judge what follows ``acted``, the commit the daemon last acted on
        (its state directory's record), by that tree's rules even when it no
        longer verifies: a signer who leaves the allowed-signers file must
        not leave the next commit to be judged by the rules it writes."""
        if acted != self._acted:
            self._acted = acted
            self._approvals.clear()
            self._depth.clear()

    def approve(self, tip: str) -> Approval:
        if self.counts_approvals:
            self._forget_if_approvals_moved()
        cached = self._approvals.get(tip)
        if cached is not None:
            return cached
        # Walk back to a commit whose answer is known (or the root), then
        # fold forward: each spec commit is judged on its change from the
        # verified commit before it, so the answer depends on the chain.
        pending: list[tuple[str, bool]] = []  # (commit id, is spec commit), newest first
        base = _NOTHING
        depth = -1  # of the commit base answers for
        commit_id: str | None = tip
        while commit_id is not None:
            known = self._approvals.get(commit_id)
            if known is not None:
                base = known
                depth = self._depth[commit_id]
                break
            commit = self._commit(commit_id)
            pending.append((commit_id, self._is_spec(commit)))
            commit_id = str(commit.parent_ids[0]) if commit.parent_ids else None
        approval = base
        for commit_id, spec in reversed(pending):
            depth += 1
            if spec:
                judgement = self.judge(commit_id, approval.base)
                if judgement.ok:
                    approval = Approval(commit_id, commit_id, ())
                else:
                    refusal = Refusal(
                        commit_id,
                        judgement.reason,
                        _author(self._commit(commit_id)),
                        judgement.signature.ok,
                    )
                    approval = Approval(
                        approval.verified_commit,
                        commit_id,
                        (refusal, *approval.refusals),
                        approval.acted_floor,
                    )
            if commit_id == self._acted and approval.verified_commit != commit_id:
                approval = replace(approval, acted_floor=commit_id)
            self._remember(commit_id, approval, depth)
        return approval

    def base_of(self, commit: str) -> str | None:
        """The verified commit before ``commit`` on its first-parent chain,
        or the commit last acted on when that is newer (``judge_after``):
        the tree ``commit`` is judged against (None: none yet)."""
        parents = self._commit(commit).parent_ids
        return self.approve(str(parents[0])).base if parents else None

    def check_commit(self, commit: str) -> SignatureCheck:
        """The commit's signature verdict and, when approvals are asked
        for, its approvals': not ok when either is missing, with the reason."""
        return self.judgement(commit).check

    def judgement(self, commit: str) -> Judgement:
        """``commit``'s verdict as the walk gives it, rule by rule."""
        return self.judge(commit, self.base_of(commit))

    def judge(self, commit: str, base: str | None) -> Judgement:
        """``commit``'s verdict on its change from ``base``: its signature;
        then, with a global minimum or a rule of ``base`` (of ``commit``
        itself when nothing is verified yet) that the change touches, the
        approvals in its note; a change that only stops needs none."""
        signature = self.check_signature(commit)
        if not signature.ok:
            return Judgement(commit, base, signature)
        key = (commit, base)
        cached = self._verdicts.get(key)
        if cached is not None:
            return cached
        rules = self._rules(commit, base)
        judgement = Judgement(commit, base, signature)
        if self.required_approvals or rules:
            approvals = self.approvals(commit, signature)
            counts = tuple(approvals.for_rule(rule) for rule in rules)
            judgement = Judgement(commit, base, signature, approvals, counts)
            if not judgement.approved and self._only_stops(commit, base):
                judgement = Judgement(commit, base, signature, approvals, counts, True)
        if len(self._verdicts) >= _MAX_CHECKS:
            _drop_oldest(self._verdicts)
        self._verdicts[key] = judgement
        return judgement

    def rules_for(self, commit: str, base: str | None) -> tuple[ApprovalRule, ...]:
        """The approval rules ``commit``'s change from ``base`` touches."""
        return self._rules(commit, base)

    def _rules(self, commit: str, base: str | None) -> tuple[ApprovalRule, ...]:
        key = (commit, base)
        found = self._matches.get(key)
        if found is None:
            new = self._commit(commit).tree
            old = None if base is None else self._commit(base).tree
            tables = self._rule_tables
            rules = rules_at(self.repo, old, tables) if old is not None else None
            if rules is None:  # nothing verified yet, or unreadable settings there
                rules = rules_at(self.repo, new, tables) or ()
            found = Change.between(self.repo, old, new, tables).rules(rules) if rules else ()
            if len(self._matches) >= _MAX_CHECKS:
                _drop_oldest(self._matches)
            self._matches[key] = found
        return found

    def _only_stops(self, commit: str, base: str | None) -> bool:
        if base is None:
            return False
        new, old = self._commit(commit).tree, self._commit(base).tree
        return Change.between(self.repo, old, new, self._rule_tables).only_stops()

    def _is_spec(self, commit: pygit2.Commit) -> bool:
        commit_id = str(commit.id)
        found = self._spec.get(commit_id)
        if found is None:
            found = is_spec_commit(self.repo, commit)
            if len(self._spec) >= _MAX_APPROVALS:
                _drop_oldest(self._spec)
            self._spec[commit_id] = found
        return found

    def check_signature(self, commit: str) -> SignatureCheck:
        """The commit's own signature (SSH, or OpenPGP with ``pgp``)."""
        cached = self._checks.get(commit)
        if cached is not None:
            return cached
        check = check_commit_signature(self._commit(commit), self.allowed, self.pgp)
        if len(self._checks) >= _MAX_CHECKS:
            _drop_oldest(self._checks)
        self._checks[commit] = check
        return check

    def approvals(self, commit: str, signature: SignatureCheck | None = None) -> Approvals:
        """The approvals in ``commit``'s note that count toward the global
        minimum, and those ignored with why; checked at the clock's now (an
        approval carries no time)."""
        signature = signature or self.check_signature(commit)
        now = self.clock()
        blob = self._note_ids().get(commit)
        # An answer is a function of the note, the signer and which validity
        # windows are open: kept by those, so forgetting it changes only the cost.
        key = (commit, blob or "", signature.ok, bisect_right(self._boundaries, now))
        found = self._counted.get(key)
        if found is None:
            found = count_approvals(
                None if blob is None else note_text(self.repo, blob),
                commit,
                self.allowed,
                required=self.required_approvals,
                signer=(signature.principal or "") if signature.ok else "",
                signer_key=signature.key_id if signature.ok else None,
                at=now,
                persons=self.persons,
            )
            if len(self._counted) >= _MAX_CHECKS:
                _drop_oldest(self._counted)
            self._counted[key] = found
        return found

    def approvals_state(self) -> object:
        """A value that changes whenever an answer of ``approve`` may have
        changed without the branch moving: the notes ref's tip and which
        signers' validity windows are open (None when approvals are not
        counted)."""
        if not self.counts_approvals:
            return None
        return (notes_tip(self.repo), bisect_right(self._boundaries, self.clock()))

    def _note_ids(self) -> dict[str, str]:
        tip = notes_tip(self.repo)
        if self._notes_index is None or self._notes_index[0] != tip:
            self._notes_index = (tip, note_ids(self.repo, tip))
        return self._notes_index[1]

    def _forget_if_approvals_moved(self) -> None:
        """Drop the answers that counted approvals of commits whose note
        changed since (all of them when a signer's validity window opened or
        closed since, or the change cannot be told)."""
        tip = notes_tip(self.repo)
        now = self.clock()
        last = self._judged_at
        crossed = last is not None and any(last < t <= now for t in self._boundaries)
        if crossed:
            self._approvals.clear()
            self._depth.clear()
            self._verdicts.clear()
        elif tip != self._notes:
            changed = changed_notes(self.repo, self._notes, tip)
            if changed is None:
                self._approvals.clear()
                self._depth.clear()
                self._verdicts.clear()
            else:
                self._forget_notes_of(changed)
        self._notes = tip
        self._judged_at = now

    def _commit(self, commit_id: str) -> pygit2.Commit:
        try:
            obj = self.repo[commit_id]
        except (KeyError, ValueError) as exc:
            raise StoreError(
                f"commit {commit_id} is not in the repository",
                "fetch the branch again; the history may have been rewritten",
            ) from exc
        commit = obj.peel(pygit2.Commit)
        return commit

    def _remember(self, commit_id: str, approval: Approval, depth: int) -> None:
        if len(self._approvals) >= _MAX_APPROVALS:
            _drop_oldest(self._approvals)
            self._depth = {c: self._depth[c] for c in self._approvals}
        self._approvals[commit_id] = approval
        self._depth[commit_id] = depth

    def _depth_of(self, commit_id: str) -> int | None:
        """First-parent distance of ``commit_id`` from the root (None: not
        in the repository), walking back only to a commit already known."""
        steps = 0
        current: str | None = commit_id
        while current is not None:
            known = self._depth.get(current)
            if known is not None:
                return known + steps
            try:
                parents = self._commit(current).parent_ids
            except StoreError:
                return None
            current = str(parents[0]) if parents else None
            steps += 1
        return steps - 1

    def _forget_notes_of(self, changed: frozenset[str]) -> None:
        """Drop the answers a change to the notes of ``changed`` commits can
        alter: their own verdicts, and every chain answer from the oldest of
        them on (a commit's answer depends only on the notes of its chain)."""
        if not self._approvals and not self._verdicts:
            return
        if len(changed) > _MANY_NOTES:
            self._approvals.clear()
            self._depth.clear()
            self._verdicts.clear()
            return
        for key in [k for k in self._verdicts if k[0] in changed]:
            del self._verdicts[key]
        depths = [d for d in map(self._depth_of, changed) if d is not None]
        if not depths:
            return
        oldest = min(depths)
        for commit_id in [c for c, d in self._depth.items() if d >= oldest]:
            del self._depth[commit_id]
            self._approvals.pop(commit_id, None)


def load_allowed_signers(path: Path) -> tuple[AllowedSigner, ...]:
    """Read an allowed-signers file (kept outside the fleet repository).

    Raises ReconcilerError naming the file (and line) when it cannot be read,
    has a bad line, or lists nobody: a daemon told to verify must not start
    with a list that can approve nothing.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ReconcilerError(
            f"cannot read allowed-signers file {path}: {getattr(exc, 'strerror', None) or exc}",
            "give the path of a git allowed-signers file (`principals keytype base64-key` per line)",
        ) from None
    signers = parse_allowed_signers(text, source=str(path))
    if not signers:
        raise ReconcilerError(
            f"allowed-signers file {path} lists no signers",
            "add a line `EMAIL ssh-ed25519 AAAA...` for each person who may approve",
        )
    return signers


def check_commit_signature(
    commit: pygit2.Commit, allowed: Sequence[AllowedSigner], pgp: PgpKeyring | None = None
) -> SignatureCheck:
    """Verify a commit's gpgsig header as ``git verify-commit`` would, with the
    validity windows checked at the committer time (as git passes it). An
    OpenPGP signature is checked against ``pgp`` (``--allowed-pgp-keys``)."""
    signature, payload = commit.gpg_signature
    if not signature:
        return SignatureCheck(False, "the commit is not signed")
    text = signature.decode("utf-8", "replace")
    if pgp is not None and text.lstrip().startswith(PGP_ARMOR):
        return pgp.verify(text, payload)
    at = datetime.fromtimestamp(commit.committer.time, UTC)
    return verify_sshsig(text, payload, allowed, at=at)


def is_spec_commit(repo: pygit2.Repository, commit: pygit2.Commit) -> bool:
    """Do this commit's spec paths differ from those of ANY of its parents
    (a root commit: does it hold any)? Judging a merge by its first parent
    alone let an unsigned merge choose its parent order and so put an older
    or unmerged signed tree into effect (docs/trust.md)."""
    tree = commit.tree
    if not commit.parent_ids:
        return any(entry_of(tree, name) is not None for name in SPEC_PATHS)
    mine = [entry_of(tree, name) for name in SPEC_PATHS]
    for parent_id in commit.parent_ids:
        parent_tree = repo[parent_id].peel(pygit2.Commit).tree
        if mine != [entry_of(parent_tree, name) for name in SPEC_PATHS]:
            return True
    return False


# Where the daemon keeps the verified commit it last acted on, per branch: a
# ref in the repository it reads (for a remote, its own mirror, which no push
# reaches; fetches only touch refs/heads/). A commit cannot write it.
ACTED_REF = "refs/reconciler/acted/"


def last_acted(repo: pygit2.Repository, branch: str) -> str | None:
    """The verified commit the daemon last acted on for ``branch`` (None: none
    recorded, as on the first start with verification)."""
    try:
        ref = repo.references.get(ACTED_REF + branch)
    except (pygit2.GitError, ValueError):
        return None
    return None if ref is None else str(ref.target)


def record_acted(repo: pygit2.Repository, branch: str, commit: str) -> None:
    try:
        repo.references.create(ACTED_REF + branch, pygit2.Oid(hex=commit), force=True)
    except (pygit2.GitError, OSError) as exc:
        raise StoreError(
            f"cannot record the verified commit acted on ({ACTED_REF + branch}): {exc}",
            "check that the repository (or mirror) is writable by the daemon",
        ) from exc


def descends_by_first_parent(repo: pygit2.Repository, commit: str, ancestor: str) -> bool:
    """Is ``ancestor`` on ``commit``'s first-parent chain (or ``commit``
    itself)? Walks to the root at worst; callers keep the answer per pair."""
    current: str | None = commit
    while current is not None:
        if current == ancestor:
            return True
        parents = repo[current].peel(pygit2.Commit).parent_ids
        current = str(parents[0]) if parents else None
    return False


def refuse_backwards(approval: Approval, acted: str | None, moves_forward: bool) -> Approval:
    """``approval`` with its verified commit held back at ``acted`` when the
    newly verified commit does not descend by first parent from it: the
    daemon never moves backwards to an older or unmerged signed tree."""
    verified = approval.verified_commit
    if acted is None or verified == acted or moves_forward:
        return approval
    what = (
        f"verified commit {verified[:12]} does not descend"
        if verified
        else "no commit in the tip's first-parent history verifies, so none descends"
    )
    refusal = Refusal(
        verified or acted,
        f"{what} by first parent from {acted[:12]}, the verified commit last acted on: a "
        "move backwards is refused (an unsigned merge or a push of an older branch); push "
        "a signed commit on top of it",
        "",
    )
    return Approval(acted, approval.newest_spec_commit, (refusal, *approval.refusals))


def _author(commit: pygit2.Commit) -> str:
    return f"{commit.author.name} <{commit.author.email}>"


def _drop_oldest(table: dict[_K, _V]) -> None:
    # dicts keep insertion order: drop the older half in one go.
    for key in list(table)[: len(table) // 2]:
        del table[key]
