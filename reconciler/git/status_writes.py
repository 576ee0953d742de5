"""Which blob the daemon itself last wrote to each status file: with signed
status commits, a status file counts only while it still holds what the
newest commit signed by a daemon key wrote there (docs/trust.md).
Read from the branch's first-parent history."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pygit2
import pygit2.enums

from reconciler.git.approval import check_commit_signature
from reconciler.git.sshsig import AllowedSigner
from reconciler.git.tree_reader import blobs_under, subtree_of
from reconciler.spec.paths import STATUS_DIR

STATUS_FOLDER = STATUS_DIR


def status_files_at(repo: pygit2.Repository, commit: str) -> dict[str, str]:
    """Every file under ``status/`` at ``commit``, nested ones included:
    path -> blob id."""
    files: dict[str, str] = {}
    top = subtree_of(repo[commit].peel(pygit2.Commit).tree, STATUS_FOLDER)
    if top is not None:
        for path, blob in blobs_under(top, STATUS_FOLDER):
            files[path] = blob
    return files


class DaemonWrites:
    """With signed status commits: for each file under ``status/``, the blob
    that the newest daemon-signed commit on the branch's first-parent
    history wrote there. A status file counts only while it still holds
    that blob: a person's status-only commit, which nobody's daemon key
    signed, never changes what a job carries, while a `git revert` back to
    the daemon's own last version is accepted again.

    ``signers``: the daemon keys (its own, and the allowed-signers file's,
    for other daemons on the same branch), namespace ``git``. Built by one
    walk back from the first tip (until every current status file has its
    daemon write, or the root), then advanced over new commits only.

    ``adopted``: the status commit the daemon last acted on before it
    signed (its state directory keeps it): the status files as they are
    there are its own writes, so turning signing on keeps them. It counts
    only on the first-parent history below the tip.
    """

    def __init__(
        self,
        repo: pygit2.Repository,
        signers: Sequence[AllowedSigner],
        adopted: str | None = None,
    ) -> None:
        self.repo = repo
        self.signers = tuple(signers)
        self.adopted = adopted
        self._tip: str | None = None
        self._written: dict[str, str | None] = {}  # path -> blob id (None: deleted)
        self._signed: dict[str, bool] = {}  # commit -> signed by a daemon key

    def unwritten(self, tip: str, files: Mapping[str, str]) -> dict[str, str]:
        """Of ``files`` (path -> blob id at ``tip``, under ``status/``), those
        whose content is not what the newest daemon-signed write left there,
        with the reason in words."""
        self._advance(tip, files)
        wrong: dict[str, str] = {}
        for path, blob in files.items():
            written = self._written.get(path)
            if written is None:
                wrong[path] = "no commit signed by a daemon key ever wrote it"
            elif written != blob:
                wrong[path] = "it differs from what the newest daemon-signed commit wrote there"
        return wrong

    def _advance(self, tip: str, files: Mapping[str, str]) -> None:
        if tip == self._tip and all(p in self._written for p in files):
            return
        newer: list[pygit2.Commit] = []  # first-parent commits after the indexed tip
        commit: str | None = tip
        while commit is not None and commit != self._tip:
            obj = self.repo[commit].peel(pygit2.Commit)
            newer.append(obj)
            commit = str(obj.parent_ids[0]) if obj.parent_ids else None
        if commit is None and self._tip is not None:
            self._written = {}  # the old tip is not below: a rewrite; start over
        if commit is None or any(p not in self._written for p in files):
            self._rebuild(tip, files)
            return
        for obj in reversed(newer):
            for path, blob in self._changes(obj).items():
                if self._daemon_signed(obj):
                    self._written[path] = blob
        self._tip = tip

    def _rebuild(self, tip: str, files: Mapping[str, str]) -> None:
        """Walk back from ``tip`` until each of ``files`` has its newest
        daemon write (or the root: then it has none)."""
        written: dict[str, str | None] = {}
        pending = set(files)
        commit: str | None = tip
        while commit is not None and pending:
            obj = self.repo[commit].peel(pygit2.Commit)
            if commit == self.adopted:
                there = status_files_at(self.repo, commit)
                for path in pending:
                    written[path] = there.get(path)
                pending = set()
                break
            changes = self._changes(obj)
            if changes and self._daemon_signed(obj):
                for path in pending & changes.keys():
                    written[path] = changes[path]
                pending -= changes.keys()
            commit = str(obj.parent_ids[0]) if obj.parent_ids else None
        for path in pending:
            written[path] = None
        self._written = written
        self._tip = tip

    def _changes(self, commit: pygit2.Commit) -> dict[str, str | None]:
        """Files under ``status/`` this commit changed against its first
        parent: path -> new blob id (None: deleted)."""
        mine = subtree_of(commit.tree, STATUS_FOLDER)
        parent = self.repo[commit.parent_ids[0]].peel(pygit2.Commit) if commit.parent_ids else None
        theirs = subtree_of(parent.tree, STATUS_FOLDER) if parent is not None else None
        if mine is not None and theirs is not None and mine.id == theirs.id:
            return {}
        if mine is None and theirs is None:
            return {}
        empty = self.repo[self.repo.TreeBuilder().write()].peel(pygit2.Tree)
        diff = (theirs or empty).diff_to_tree(mine or empty)
        changes: dict[str, str | None] = {}
        for delta in diff.deltas:
            if delta.status == pygit2.enums.DeltaStatus.DELETED:
                changes[f"{STATUS_FOLDER}/{delta.old_file.path}"] = None
            else:
                changes[f"{STATUS_FOLDER}/{delta.new_file.path}"] = str(delta.new_file.id)
        return changes

    def _daemon_signed(self, commit: pygit2.Commit) -> bool:
        key = str(commit.id)
        known = self._signed.get(key)
        if known is None:
            known = check_commit_signature(commit, self.signers).ok
            if len(self._signed) > 20_000:
                self._signed.clear()
            self._signed[key] = known
        return known
