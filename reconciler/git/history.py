"""Facts about the tracked branch's first-parent history that a reconcile
pass needs every time: which commit last changed a spec file, which commit
first added it, and a total order of commits.

Only files that are specs count: everything under ``rollouts/`` and
``nodes/``, and ``reconciler.yaml``. Status-only commits never count, so the
daemon's own commits never move a rollout's ``specCommit``.

The index is built once by a full walk and then advanced by walking only the
commits that are new since the previous tip; a pass on an unchanged tip
costs one string comparison. A commit changed a spec path when the subtree
id of ``rollouts/`` or ``nodes/`` (or the blob id of ``reconciler.yaml``)
differs from its first parent's; only then are those subtrees diffed.

``changed_paths`` answers the other question a pass asks: which files under
some folders differ between the position read last and the new one. It is
a tree diff, not a log walk, so a rewind (a force-push, a verified commit
held back) is answered like any other move.

This module reads Git objects; it must not write to the repository or decide
anything about rollouts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat

import pygit2

from reconciler.git.tree_reader import blobs_under, entry_id, subtree_of
from reconciler.spec.errors import StoreError
from reconciler.spec.paths import SPEC_FILES, SPEC_FOLDERS

# Subtree/blob ids of the spec paths of one commit: equal keys, equal specs.
_Key = tuple[pygit2.Oid | None, ...]
_Subs = tuple[pygit2.Tree | None, ...]


class History:
    """An incremental index over the first-parent history of one branch.

    ``advance(tip)`` before querying; queries answer as of that tip. Not
    thread-safe: one History per thread (it is cheap to rebuild).
    """

    def __init__(self, repo: pygit2.Repository) -> None:
        self._repo = repo
        self._tip: str | None = None
        self._order: list[str] = []  # first-parent commits, oldest first
        self._position: dict[str, int] = {}
        # path -> position of its last change: ints, so the newest of many
        # paths is one C-level max() over dict lookups.
        self._last_pos: dict[str, int] = {}
        self._first_added: dict[str, str] = {}
        self._changes: list[str] = []  # commits that changed a spec path, oldest first
        # Undo records of each change commit, by position: (path, previous
        # last-change position or -1, whether it was the first addition).
        # They let the index step back to a fork point instead of starting over.
        self._undo: dict[int, list[tuple[str, int, bool]]] = {}
        self._tip_key: _Key = ()
        # The tip's spec subtrees, kept loaded: a 10,000-entry nodes/ tree costs
        # milliseconds to inflate, so every version is loaded once, not twice.
        self._tip_subs: _Subs = _EMPTY_SUBS
        # Work counters, for tests and the benchmark: whole-history walks, and
        # commits visited by advance() in total.
        self.full_walks = 0
        self.walked = 0
        self.rewinds = 0
        # For ``changed_since``: each advance is a generation; the paths
        # whose facts it changed, newest last; and the last generation that
        # stepped back or started over (then any fact may have changed).
        self.generation = 0
        self._journal: list[tuple[int, frozenset[str]]] = []
        self._rewound_at = 0

    @property
    def tip(self) -> str | None:
        """The tip the index answers for (None before the first advance)."""
        return self._tip

    def advance(self, tip: str) -> None:
        """Bring the index up to `tip`, walking only first-parent commits not
        seen yet. When `tip`'s first-parent chain leaves the previous line
        below its tip (history rewritten, or a ``git pull`` merge whose first
        parent is the person's own commit), the index steps back to the fork
        point and walks forward from there; with no common commit at all it
        starts over. Callers that must refuse a rewrite check
        ``GitStore.is_descendant`` first."""
        if tip == self._tip:
            return
        self.generation += 1
        new: list[pygit2.Commit] = []
        stop: str | None = None
        try:
            commit = self._commit(tip)
            while True:
                cid = str(commit.id)
                if cid in self._position:
                    stop = cid
                    break
                new.append(commit)
                if not commit.parent_ids:
                    break
                commit = self._commit(str(commit.parent_ids[0]))
        except (KeyError, ValueError, pygit2.GitError) as e:
            raise StoreError(
                f"cannot walk history from {tip}: {e}",
                "the repository is missing objects; re-fetch or check the repository",
            ) from e
        if stop is not None and stop != self._tip:
            self._rewind(stop)
            self._rewound_at = self.generation
        if stop is None and self._tip is not None:
            self._reset()
            self._rewound_at = self.generation
        if self._tip is None:
            self.full_walks += 1
        new.reverse()
        self.walked += len(new)
        prev_key = self._tip_key if stop is not None else _EMPTY_KEY
        prev_subs = self._tip_subs if stop is not None else _EMPTY_SUBS
        for commit in new:
            cid = str(commit.id)
            tree = commit.tree
            key = _key(tree)
            subs = prev_subs
            if key != prev_key:
                subs = tuple(
                    prev_subs[i] if key[i] == prev_key[i] else subtree_of(tree, folder)
                    for i, folder in enumerate(SPEC_FOLDERS)
                )
                self._record(cid, prev_subs, subs, prev_key, key)
            self._position[cid] = len(self._order)
            self._order.append(cid)
            prev_key, prev_subs = key, subs
        self._tip = tip
        self._tip_key = prev_key
        self._tip_subs = prev_subs

    def changed_since(self, generation: int) -> frozenset[str] | None:
        """The spec paths whose ``last_change`` or ``first_added`` may have
        changed since ``generation`` (a value of ``self.generation`` read
        earlier): those a commit walked since then changed. None when any
        may have: the index stepped back (a rewind) or started over since,
        or ``generation`` is from before the first advance."""
        if generation <= 0 or self._rewound_at > generation:
            return None
        found: set[str] = set()
        for at, paths in reversed(self._journal):
            if at <= generation:
                break
            found.update(paths)
        return frozenset(found)

    def last_change(self, path: str) -> str | None:
        """The newest first-parent commit (as of the tip) that added, changed or
        deleted `path` (a spec path), or None if no commit ever touched it."""
        pos = self._last_pos.get(path)
        return self._order[pos] if pos is not None else None

    def first_added(self, path: str) -> str | None:
        """The oldest first-parent commit that added `path` (its queue order).
        A file deleted and added again keeps its first addition."""
        return self._first_added.get(path)

    def position(self, commit: str) -> int:
        """First-parent order of `commit`: the root commit is 0, the tip is the
        largest. KeyError for a commit not on the first-parent line."""
        return self._position[commit]

    def __contains__(self, commit: object) -> bool:
        return commit in self._position

    def newest(self, commits: Iterable[str | None]) -> str | None:
        """The newest of `commits` in first-parent order (None entries and
        commits off the line are ignored); None when there are none."""
        best: str | None = None
        best_pos = -1
        for c in commits:
            if c is None:
                continue
            pos = self._position.get(c, -1)
            if pos > best_pos:
                best, best_pos = c, pos
        return best

    def last_change_of(self, paths: Iterable[str]) -> str | None:
        """The newest commit that changed any of `paths`."""
        best = max(map(self._last_pos.get, paths, repeat(-1)), default=-1)
        return self._order[best] if best >= 0 else None

    def change_commits(self) -> Iterator[str]:
        """First-parent commits that changed a spec path, newest first (for the
        approval walk: the newest change commit decides what is verified)."""
        return reversed(self._changes)

    def __len__(self) -> int:
        return len(self._order)

    # -- internals ---------------------------------------------------------

    def _reset(self) -> None:
        self._tip = None
        self._journal.clear()
        self._order.clear()
        self._position.clear()
        self._last_pos.clear()
        self._first_added.clear()
        self._changes.clear()
        self._undo.clear()
        self._tip_key = ()
        self._tip_subs = _EMPTY_SUBS

    def _commit(self, cid: str) -> pygit2.Commit:
        obj = self._repo[cid]
        if not isinstance(obj, pygit2.Commit):
            raise StoreError(f"{cid} is not a commit")
        return obj

    def _record(
        self,
        cid: str,
        old_subs: _Subs,
        new_subs: _Subs,
        old_key: _Key,
        new_key: _Key,
    ) -> None:
        changed: list[tuple[str, bool]] = []  # (path, added)
        for i, folder in enumerate(SPEC_FOLDERS):
            if old_key[i] == new_key[i]:
                continue
            changed.extend(_diff(self._repo, folder, old_subs[i], new_subs[i]))
        for j, name in enumerate(SPEC_FILES, start=len(SPEC_FOLDERS)):
            if old_key[j] != new_key[j]:
                changed.append((name, old_key[j] is None))
        if not changed:
            return  # e.g. only a mode change outside spec blobs
        pos = len(self._order)  # cid's position: it is appended right after
        undo: list[tuple[str, int, bool]] = []
        for path, added in changed:
            first = added and path not in self._first_added
            undo.append((path, self._last_pos.get(path, -1), first))
            self._last_pos[path] = pos
            if first:
                self._first_added[path] = cid
        self._undo[pos] = undo
        self._changes.append(cid)
        self._journal.append((self.generation, frozenset(path for path, _ in changed)))
        if len(self._journal) > _JOURNAL_LIMIT:
            # Asking from before the oldest kept entry answers None.
            self._rewound_at = max(self._rewound_at, self._journal[_JOURNAL_LIMIT // 2][0])
            del self._journal[: _JOURNAL_LIMIT // 2]

    def _rewind(self, stop: str) -> None:
        """Forget every commit after `stop`, as if the index had been
        advanced only to `stop`."""
        keep = self._position[stop]
        for pos in range(len(self._order) - 1, keep, -1):
            for path, previous, first in reversed(self._undo.pop(pos, [])):
                if previous < 0:
                    self._last_pos.pop(path, None)
                else:
                    self._last_pos[path] = previous
                if first:
                    self._first_added.pop(path, None)
            del self._position[self._order[pos]]
        del self._order[keep + 1 :]
        while self._changes and self._changes[-1] not in self._position:
            self._changes.pop()
        tree = self._commit(stop).tree
        self._tip = stop
        self._tip_key = _key(tree)
        self._tip_subs = tuple(subtree_of(tree, folder) for folder in SPEC_FOLDERS)
        self.rewinds += 1


_JOURNAL_LIMIT = 4096  # change commits remembered for changed_since
_EMPTY_KEY: _Key = (None,) * (len(SPEC_FOLDERS) + len(SPEC_FILES))
_EMPTY_SUBS: _Subs = (None,) * len(SPEC_FOLDERS)


def _key(tree: pygit2.Tree) -> _Key:
    ids: list[pygit2.Oid | None] = []
    for folder in SPEC_FOLDERS:
        ids.append(entry_id(tree, folder, pygit2.Tree))
    for name in SPEC_FILES:
        ids.append(entry_id(tree, name, pygit2.Blob))
    return tuple(ids)


def _diff(
    repo: pygit2.Repository, folder: str, old: pygit2.Tree | None, new: pygit2.Tree | None
) -> list[tuple[str, bool]]:
    """(path, added) for every blob that differs between two versions of a folder."""
    if old is None and new is None:
        return []
    if old is None:
        assert new is not None
        return [(p, True) for p in _walk(repo, new, folder)]
    if new is None:
        return [(p, False) for p in _walk(repo, old, folder)]
    out: list[tuple[str, bool]] = []
    for status, old_path, new_path in tree_deltas(old, new):
        added = status == pygit2.enums.DeltaStatus.ADDED
        path = new_path if added else old_path
        out.append((f"{folder}/{path}", added))
        if status == pygit2.enums.DeltaStatus.TYPECHANGE:
            out.append((f"{folder}/{new_path}", True))
    return out


def tree_deltas(old: pygit2.Tree, new: pygit2.Tree) -> tuple[tuple[int, str, str], ...]:
    """(libgit2 delta status, old path, new path) of every file that
    differs between two trees."""
    return tuple(
        (int(delta.status), delta.old_file.path, delta.new_file.path)
        for delta in old.diff_to_tree(new).deltas
    )


def _walk(repo: pygit2.Repository, tree: pygit2.Tree, prefix: str) -> Iterator[str]:
    for entry in tree:
        path = f"{prefix}/{entry.name}"
        if entry.type_str == "tree":
            sub = repo[entry.id]
            assert isinstance(sub, pygit2.Tree)
            yield from _walk(repo, sub, path)
        elif entry.type_str == "blob":
            yield path


def changed_paths(
    repo: pygit2.Repository,
    old: pygit2.Tree | None,
    new: pygit2.Tree | None,
    folders: Sequence[str],
    files: Sequence[str] = (),
) -> frozenset[str]:
    """Every file path that differs between two root trees, under ``folders``
    (nested files included) and among the top-level ``files``: added,
    deleted, changed, changed in mode or kind; a rename is its two paths.
    ``old`` None means everything present in ``new`` (a first read).

    Neither tree need descend from the other: it compares content, so a
    rewind is one more difference. A folder whose tree id is the same on
    both sides costs one comparison; only differing folders are diffed
    (in libgit2, which skips identical subtrees inside them too)."""
    found: set[str] = set()
    for folder in folders:
        before = subtree_of(old, folder)
        after = subtree_of(new, folder)
        if before is not None and after is not None:
            if before.id == after.id:
                continue
            for _, old_path, new_path in tree_deltas(before, after):
                found.add(f"{folder}/{old_path}")
                found.add(f"{folder}/{new_path}")
            continue
        for side in (before, after):
            if side is not None:
                found.update(path for path, _ in blobs_under(side, folder))
    for name in files:
        if _file_entry(old, name) != _file_entry(new, name):
            found.add(name)
    return frozenset(found)


def _file_entry(tree: pygit2.Tree | None, name: str) -> tuple[pygit2.Oid, int] | None:
    if tree is None or name not in tree:
        return None
    entry = tree[name]
    return (entry.id, entry.filemode)
