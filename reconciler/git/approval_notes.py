"""Reviewers' signed approvals, kept as git notes (docs/trust.md).

An approval is an SSH signature (``SSHSIG``, namespace
``reconciler-approval``) over the text ``reconciler-approval v1\\ncommit
<full id>\\n``, exactly as ``ssh-keygen -Y sign -n reconciler-approval``
writes it. Each commit's approvals are the armored signatures in its note
under ``refs/notes/reconciler-approvals``, one after the other; a reviewer
appends, nobody rewrites.

- ``approval_message``, ``append_approval``: what is signed, and adding a
  signature to a commit's note in a local repository.
- ``push_approvals``: push the notes ref with the ``git`` binary (the
  person's own remote, credentials and hooks); a push refused because
  another reviewer pushed first fetches theirs, merges and pushes again.
- ``merge_notes``: fold another copy of the notes ref (a remote's, fetched)
  into ours, keeping every signature of both, so approvals pushed at the
  same time by two reviewers are both kept.
- ``count_approvals``: which signatures in a note count for a commit, and
  why each other one does not: garbage, another commit, another namespace,
  a key not allowed (or not for this namespace, or outside its validity
  window), the commit's own signer, a principal already counted.

Reads and writes notes with pygit2; decides nothing about rollouts. The
signature checks are ``reconciler.git.sshsig``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pygit2

from reconciler.git.git_binary import run_git
from reconciler.git.sshsig import ARMOR_BEGIN, ARMOR_END, AllowedSigner, verify_sshsig
from reconciler.spec.errors import ReconcilerError, StoreError
from reconciler.spec.model import ApprovalRule

NOTES_REF = "refs/notes/reconciler-approvals"
NAMESPACE = "reconciler-approval"
MAX_NOTE_BYTES = 256 * 1024  # a note larger than this is not read (hundreds of approvals)
_BLOCK = re.compile(re.escape(ARMOR_BEGIN) + r".*?" + re.escape(ARMOR_END), re.DOTALL)


def approval_message(commit: str) -> bytes:
    """The text a reviewer signs to approve ``commit`` (its full id)."""
    return f"reconciler-approval v1\ncommit {commit}\n".encode("ascii")


@dataclass(frozen=True)
class ApprovedBy:
    """One approval that counts: the allowed-signers principal(s) and key,
    and the approval rules it counted for (docs/approval-rules.md)."""

    principal: str
    key_id: str
    rules: tuple[str, ...] = ()


@dataclass(frozen=True)
class RuleCount:
    """One approval rule's verdict on a commit: the people of the rule who
    approved it, one entry per person (their principals, comma-joined)."""

    rule: str
    require: int
    principals: tuple[str, ...]
    counted: tuple[str, ...]
    persons: tuple[str, ...] = ()  # who each entry of counted is (``people``)

    @property
    def ok(self) -> bool:
        return len(self.counted) >= self.require

    def summary(self) -> str:
        """``needs 1 of serving-owners (alice@..., bob@...); has 0``, or
        ``serving-owners: approved by bob@...``."""
        if self.ok:
            return f"{self.rule}: approved by {', '.join(self.counted)}"
        text = (
            f"needs {self.require} of {self.rule} ({', '.join(self.principals)}); "
            f"has {len(self.counted)}"
        )
        return text + (f" ({', '.join(self.counted)})" if self.counted else "")


@dataclass(frozen=True)
class Approvals:
    """The verdict on a commit's note: what counts and what was ignored."""

    commit: str
    required: int
    signer: str  # the principal(s) who signed the commit itself ("" if unknown)
    counted: tuple[ApprovedBy, ...]  # one per person, the first approval of each
    ignored: tuple[str, ...]  # one sentence per signature (or text) not counted
    # every valid approval not by the signer, with its person (a person may
    # hold several keys whose lines name different principals)
    valid: tuple[tuple[ApprovedBy, str], ...] = ()

    @property
    def ok(self) -> bool:
        return len(self.counted) >= self.required

    def for_rule(self, rule: ApprovalRule) -> RuleCount:
        """How many people of ``rule`` approved: an approval counts when its
        key's line names one of the rule's principals, once per person."""
        wanted = set(rule.principals)
        people: dict[str, str] = {}
        for approval, person in self.valid:
            if person not in people and wanted & set(approval.principal.split(",")):
                people[person] = approval.principal
        return RuleCount(
            rule.name, rule.require, rule.principals, tuple(people.values()), tuple(people)
        )

    def person_of(self, approval: ApprovedBy) -> str:
        return next((p for a, p in self.valid if a == approval), approval.principal)

    def summary(self) -> str:
        """``needs 1 approval besides alice's; has 0`` (with what was ignored),
        or ``approved by bob (SHA256:...)``."""
        if self.ok:
            who = ", ".join(f"{a.principal} ({a.key_id})" for a in self.counted)
            return f"approved by {who}" if who else "no approvals required"
        plural = "approval" if self.required == 1 else "approvals"
        besides = f" besides {self.signer}'s" if self.signer else ""
        text = f"needs {self.required} {plural}{besides}; has {len(self.counted)}"
        if self.counted:
            text += " (" + ", ".join(a.principal for a in self.counted) + ")"
        return text + self.ignored_text() + self.how_to_approve()

    def ignored_text(self) -> str:
        return "; ignored: " + "; ".join(self.ignored) if self.ignored else ""

    def how_to_approve(self) -> str:
        return (
            f"; a reviewer approves with `reconciler approve {self.commit[:12]} --key FILE --push`"
        )


def people(allowed: Sequence[AllowedSigner]) -> dict[str, str]:
    """Principal -> the person it names: principals listed on one line of
    the allowed-signers file are one person (whoever holds that key speaks
    for each), and so, transitively, are lines sharing a principal. A
    person is named by the smallest of their principals."""
    parent: dict[str, str] = {}

    def find(p: str) -> str:
        while parent.setdefault(p, p) != p:
            parent[p] = parent[parent[p]]
            p = parent[p]
        return p

    for signer in allowed:
        first, *rest = signer.principals or ("",)
        for other in rest:
            a, b = find(first), find(other)
            if a != b:
                parent[max(a, b)] = min(a, b)
        find(first)
    return {p: find(p) for p in parent}


def read_note(repo: pygit2.Repository, commit: str) -> str | None:
    """The text of ``commit``'s approvals note, or None when it has none."""
    try:
        note = repo.lookup_note(commit, NOTES_REF)
    except (KeyError, pygit2.GitError, ValueError):
        return None
    blob = repo[note.id]
    data = blob.data if isinstance(blob, pygit2.Blob) else b""
    if len(data) > MAX_NOTE_BYTES:
        return f"(a note of {len(data)} bytes, larger than {MAX_NOTE_BYTES}, is not read)"
    return data.decode("utf-8", "replace")


def note_ids(repo: pygit2.Repository, tip: str | None) -> dict[str, str]:
    """Annotated commit id -> note blob id, in the notes tree at ``tip``
    (flat or with git's fan-out folders): one walk instead of a lookup per
    commit."""
    found: dict[str, str] = {}
    if tip is None:
        return found
    try:
        tree = repo[tip].peel(pygit2.Commit).tree
    except (KeyError, ValueError, pygit2.GitError):
        return found
    stack = [(tree, "")]
    while stack:
        folder, prefix = stack.pop()
        for entry in folder:
            name = prefix + (entry.name or "")
            if entry.type_str == "tree":
                sub = repo[entry.id]
                if isinstance(sub, pygit2.Tree):
                    stack.append((sub, name))
            elif entry.type_str == "blob":
                found[name] = str(entry.id)
    return found


def note_text(repo: pygit2.Repository, blob_id: str) -> str:
    """A note's text by its blob id (as ``read_note`` reads it)."""
    blob = repo[blob_id]
    data = blob.data if isinstance(blob, pygit2.Blob) else b""
    if len(data) > MAX_NOTE_BYTES:
        return f"(a note of {len(data)} bytes, larger than {MAX_NOTE_BYTES}, is not read)"
    return data.decode("utf-8", "replace")


def notes_tip(repo: pygit2.Repository) -> str | None:
    """Where the notes ref points (None: no approvals anywhere yet)."""
    try:
        ref = repo.references.get(NOTES_REF)
    except (pygit2.GitError, ValueError):
        return None
    return None if ref is None else str(ref.target)


def changed_notes(
    repo: pygit2.Repository, old: str | None, new: str | None
) -> frozenset[str] | None:
    """The commits whose approvals note differs between two tips of the
    notes ref (None: cannot tell, as when an object is missing)."""
    try:
        trees = [None if tip is None else repo[tip].peel(pygit2.Commit).tree for tip in (old, new)]
    except (KeyError, ValueError, pygit2.GitError):
        return None
    before, after = trees
    if before is None and after is None:
        return frozenset()
    if before is None:
        assert after is not None
        diff = after.diff_to_tree(swap=True)
    else:
        diff = before.diff_to_tree(after) if after is not None else before.diff_to_tree()
    found: set[str] = set()
    for delta in diff.deltas:
        for path in (delta.old_file.path, delta.new_file.path):
            if path:
                found.add(path.replace("/", ""))  # git's fan-out folders
    return frozenset(found)


def signature_blocks(text: str) -> tuple[list[str], list[str]]:
    """The armored SSH signatures in a note, and the other non-blank text
    (each run between signatures, shortened), which is ignored."""
    blocks = [m.group(0) for m in _BLOCK.finditer(text)]
    rest = [part.strip() for part in _BLOCK.split(text)]
    garbage = [part if len(part) <= 40 else part[:37] + "..." for part in rest if part]
    return blocks, garbage


def count_approvals(
    note: str | None,
    commit: str,
    allowed: Sequence[AllowedSigner],
    *,
    required: int,
    signer: str = "",
    signer_key: str | None = None,
    at: datetime | None = None,
    persons: Mapping[str, str] | None = None,
) -> Approvals:
    """Which signatures in ``note`` approve ``commit``: each must verify
    over ``approval_message(commit)`` in namespace ``reconciler-approval``
    by a key allowed for that namespace at ``at`` (default now: an approval
    carries no time, so a revoked or expired key stops counting). Neither
    the commit's own signer (``signer`` principals, or ``signer_key``) nor
    a person already counted counts: two approvals count twice only when
    their principals name different people (``people``; ``persons`` is its
    answer for ``allowed``, computed once by callers). Never raises on bad
    input."""
    persons = people(allowed) if persons is None else persons
    counted: list[ApprovedBy] = []
    valid: list[tuple[ApprovedBy, str]] = []
    ignored: list[str] = []
    blocks, garbage = signature_blocks(note or "")
    for text in garbage:
        ignored.append(f"text that is not an SSH signature ({text!r})")
    own = {persons.get(p, p) for p in signer.split(",") if p}
    message = approval_message(commit)
    by_person: dict[str, str] = {}  # person -> principal of their counted approval
    for number, block in enumerate(blocks, start=1):
        check = verify_sshsig(block, message, allowed, namespace=NAMESPACE, at=at)
        where = f"signature {number}"
        if not check.ok:
            reason = check.reason
            if "does not match the signed content" in reason:
                reason += f" (not an approval of {commit[:12]}: made for another commit?)"
            ignored.append(f"{where}: {reason}")
            continue
        principal = check.principal or ""
        key_id = check.key_id or ""
        mine = {persons.get(p, p) for p in principal.split(",") if p}
        person = min(mine, default=principal)
        if own & mine or (signer_key is not None and key_id == signer_key):
            ignored.append(f"{where}: {principal} signed the commit; an author cannot approve it")
            continue
        approval = ApprovedBy(principal, key_id)
        valid.append((approval, person))
        if person in by_person:
            first = by_person[person]
            ignored.append(
                f"{where}: {principal} already approved; counted once"
                if first == principal
                else f"{where}: {principal} shares a principal with {first}, who already "
                "approved; one person counts once"
            )
            continue
        by_person[person] = principal
        counted.append(approval)
    return Approvals(commit, required, signer, tuple(counted), tuple(ignored), tuple(valid))


# --- writing --------------------------------------------------------------


def identity(repo: pygit2.Repository) -> pygit2.Signature:
    """The person's git identity for notes commits (a placeholder when
    none is configured: the signature inside the note is what counts)."""
    try:
        return repo.default_signature
    except (KeyError, pygit2.GitError):
        return pygit2.Signature("reconciler approve", "approve@reconciler.invalid")


def append_approval(
    repo: pygit2.Repository, commit: str, armored: str, who: pygit2.Signature
) -> bool:
    """Append ``armored`` to ``commit``'s note (a new notes commit on
    ``NOTES_REF``); False when that exact signature is already there."""
    current = read_note(repo, commit) or ""
    if armored.strip() in current:
        return False
    text = _joined(current, armored)
    try:
        repo.create_note(text, who, who, commit, NOTES_REF, True)
    except pygit2.GitError as exc:
        raise StoreError(f"cannot write the approval note of {commit[:12]}: {exc}") from exc
    return True


def merge_notes(repo: pygit2.Repository, theirs: str, who: pygit2.Signature) -> str | None:
    """Fold the notes commit ``theirs`` into ``NOTES_REF``: every commit's
    note becomes ours followed by their signatures we lack. The result is a
    merge commit with both as parents, so pushing it is a fast-forward.
    Returns the new tip (None: nothing to do, ``theirs`` already in ours)."""
    ours = notes_tip(repo)
    if ours is None:
        repo.references.create(NOTES_REF, pygit2.Oid(hex=theirs), force=True)
        return theirs
    if ours == theirs or repo.descendant_of(ours, theirs):
        return None
    if repo.descendant_of(theirs, ours):
        repo.references.create(NOTES_REF, pygit2.Oid(hex=theirs), force=True)
        return theirs
    mine = _notes_by_commit(repo, ours)
    other = _notes_by_commit(repo, theirs)
    merged = dict(mine)
    for annotated, text in other.items():
        here = merged.get(annotated, "")
        blocks, _garbage = signature_blocks(text)
        missing = [b for b in blocks if b not in here]
        if annotated not in merged:
            merged[annotated] = text
        elif missing:
            merged[annotated] = _joined(here, "\n".join(missing))
    builder = repo.TreeBuilder()
    for annotated, text in sorted(merged.items()):
        builder.insert(annotated, repo.create_blob(text.encode("utf-8")), pygit2.GIT_FILEMODE_BLOB)
    tree = builder.write()
    new = repo.create_commit(
        None,
        who,
        who,
        "Merge approvals\n",
        tree,
        [pygit2.Oid(hex=ours), pygit2.Oid(hex=theirs)],
    )
    repo.references.create(NOTES_REF, new, force=True)
    return str(new)


INCOMING_REF = "refs/reconciler/approvals-incoming"
PUSH_TRIES = 10


def push_approvals(
    repo: pygit2.Repository, workdir: Path, remote: str, who: pygit2.Signature
) -> int:
    """Push ``NOTES_REF`` to ``remote``, merging approvals pushed meanwhile
    by others (never forcing); returns how many merges it took. Raises
    ReconcilerError when the remote refuses for another reason."""
    spec = f"{NOTES_REF}:{NOTES_REF}"
    merges = 0
    for _ in range(PUSH_TRIES):
        try:
            run_git(workdir, "push", "--quiet", remote, spec)
            return merges
        except ReconcilerError as exc:
            if not _looks_rejected(exc.message):
                raise
        run_git(workdir, "fetch", "--quiet", remote, f"+{NOTES_REF}:{INCOMING_REF}")
        theirs = repo.references.get(INCOMING_REF)
        if theirs is not None and merge_notes(repo, str(theirs.target), who) is not None:
            merges += 1
    raise ReconcilerError(
        f"could not push {NOTES_REF} to {remote}: other approvals kept arriving "
        f"({PUSH_TRIES} tries)",
        "run the same command again; your approval is kept locally",
    )


def _looks_rejected(text: str) -> bool:
    """Refused because the remote's notes moved, or another push held their
    lock at that moment (two first approvals creating the ref at once: "failed
    to update ref", "cannot lock ref"); not other "[remote rejected]" causes,
    a hook or a permission, which another try cannot fix."""
    return any(
        w in text
        for w in (
            "[rejected]",
            "non-fast-forward",
            "fetch first",
            "stale info",
            "(failed to update ref)",
            "(cannot lock ref",
        )
    )


def _notes_by_commit(repo: pygit2.Repository, notes_commit: str) -> dict[str, str]:
    """Annotated commit id -> note text, in the notes tree of ``notes_commit``
    (flat or with git's fan-out folders)."""
    found: dict[str, str] = {}

    def walk(tree: pygit2.Tree, prefix: str) -> None:
        for entry in tree:
            obj = repo[entry.id]
            if isinstance(obj, pygit2.Tree):
                walk(obj, prefix + (entry.name or ""))
            elif isinstance(obj, pygit2.Blob):
                found[prefix + (entry.name or "")] = obj.data.decode("utf-8", "replace")

    walk(repo[notes_commit].peel(pygit2.Commit).tree, "")
    return found


def _joined(current: str, armored: str) -> str:
    if not current.strip():
        return armored.strip() + "\n"
    return current.rstrip("\n") + "\n" + armored.strip() + "\n"
