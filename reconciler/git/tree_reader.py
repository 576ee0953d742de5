"""The one reader of a repository's committed trees: branch tips, the
blobs of a folder, a file's blob, blob contents, subtree ids and commits,
with small caches by tree id. The Git store (which also writes) and the
read-only commands' branches (a working clone included) read through it.
Reading committed objects is safe in any repository; only moving a branch
is not, and that is the store's alone."""

from __future__ import annotations

import pygit2

from reconciler.spec.documents import is_document_path
from reconciler.spec.errors import StoreError
from reconciler.spec.paths import SETTINGS_PATH, SPEC_FOLDERS


def branch_ref(branch: str) -> str:
    """``main`` -> ``refs/heads/main``; a full ref name stays as it is."""
    return branch if branch.startswith("refs/") else f"refs/heads/{branch}"


# libgit2 keeps parsed trees in its object cache only up to 4 KiB each by
# default, so a folder of thousands of files (status/, nodes/) was inflated
# and parsed again at every lookup and diff: 16 ms against 0.3 ms for a diff
# of two 5,000-file folders. The cache's total size stays bounded (256 MiB).
TREE_CACHE_LIMIT = 4 * 1024 * 1024


def cache_large_trees() -> None:
    """Let libgit2 cache trees up to ``TREE_CACHE_LIMIT`` (process-wide)."""
    pygit2.settings.cache_object_limit(pygit2.enums.ObjectType.TREE, TREE_CACHE_LIMIT)


class TreeReader:
    """Reads of one repository's committed objects. Not thread-safe."""

    def __init__(self, repo: pygit2.Repository, location: str) -> None:
        cache_large_trees()
        self._repo = repo
        self.location = location
        self.is_remote = False
        self._files_cache: dict[pygit2.Oid, dict[str, str]] = {}
        self._tree_cache: dict[str, pygit2.Tree] = {}
        # Folders read at a commit: a large folder's tree is parsed once,
        # not at every file looked up in it.
        self._subtree_cache: dict[tuple[str, str], pygit2.Tree | None] = {}

    def repository(self) -> pygit2.Repository:
        """The underlying repository (for read-only helpers such as approval)."""
        return self._repo

    def tip(self, branch: str) -> str | None:
        """Commit id a local branch points at (the mirror's, for a remote), or
        None when the branch does not exist."""
        try:
            ref = self._repo.references.get(branch_ref(branch))
            if ref is None:
                return None
            return str(ref.resolve().target)
        except (pygit2.GitError, KeyError, ValueError, OSError) as e:
            raise StoreError(f"cannot read branch {branch!r}: {e}") from e

    def files(self, commit: str, folder: str) -> dict[str, str]:
        """The blobs directly in `folder` at `commit`: ``{"rollouts/a.yaml":
        blob id}``. Subfolders are left out; {} when the folder is absent."""
        sub = self._subtree(commit, folder)
        if sub is None:
            return {}
        cached = self._files_cache.get(sub.id)
        if cached is None:
            prefix = folder.strip("/") + "/"
            cached = {
                f"{prefix}{entry.name}": str(entry.id) for entry in sub if entry.type_str == "blob"
            }
            if len(self._files_cache) > 64:
                self._files_cache.clear()
            self._files_cache[sub.id] = cached
        return dict(cached)

    def file_blob(self, commit: str, path: str) -> str | None:
        """Blob id of the file at `path` in `commit`, or None if there is none."""
        folder, sep, name = path.rpartition("/")
        tree = self._subtree(commit, folder) if sep else self._tree(commit)
        if tree is None:
            return None
        try:
            entry = tree[name]
        except KeyError:
            return None
        return str(entry.id) if entry.type_str == "blob" else None

    def blob(self, blob_id: str) -> bytes:
        """The content of a blob."""
        try:
            obj = self._repo[blob_id]
        except (KeyError, ValueError) as e:
            raise StoreError(f"blob {blob_id} not found in {self.location}") from e
        if not isinstance(obj, pygit2.Blob):
            raise StoreError(f"{blob_id} is not a blob")
        return obj.data

    def subtree_id(self, commit: str, folder: str) -> str | None:
        """Tree id of `folder` at `commit` (None if absent): equal ids mean
        nothing under it changed."""
        sub = self._subtree(commit, folder)
        return str(sub.id) if sub is not None else None

    def spec_files(self, commit: str) -> dict[str, str]:
        """The files the daemon reads as the spec at ``commit``: those
        directly in ``rollouts/`` and ``nodes/``, and ``reconciler.yaml``;
        path -> blob id."""
        blobs: dict[str, str] = {}
        for folder in SPEC_FOLDERS:
            blobs.update(self.files(commit, folder))
        settings = self.file_blob(commit, SETTINGS_PATH)
        if settings:
            blobs[SETTINGS_PATH] = settings
        return blobs

    def document_files(self, commit: str) -> dict[str, bytes]:
        """Every file of the commit the documents loader reads (settings,
        nodes/, rollouts/, stray top-level YAML), by path."""
        files: dict[str, bytes] = {}
        pending: list[tuple[str, pygit2.Tree]] = [("", self._tree(commit))]
        while pending:
            prefix, tree = pending.pop()
            for entry in tree:
                path = f"{prefix}{entry.name}"
                if entry.type_str == "tree":
                    if path.split("/")[0] in SPEC_FOLDERS:
                        sub = self._repo[entry.id]
                        assert isinstance(sub, pygit2.Tree)
                        pending.append((path + "/", sub))
                elif entry.type_str == "blob" and is_document_path(path):
                    files[path] = self.blob(str(entry.id))
        return files

    def _commit(self, commit: str) -> pygit2.Commit:
        try:
            obj = self._repo[commit]
        except (KeyError, ValueError) as e:
            raise StoreError(f"commit {commit} not found in {self.location}") from e
        if not isinstance(obj, pygit2.Commit):
            raise StoreError(f"{commit} is not a commit")
        return obj

    def _tree(self, commit: str) -> pygit2.Tree:
        tree = self._tree_cache.get(commit)
        if tree is None:
            tree = self._commit(commit).tree
            if len(self._tree_cache) > 16:
                self._tree_cache.clear()
            self._tree_cache[commit] = tree
        return tree

    def _subtree(self, commit: str, folder: str) -> pygit2.Tree | None:
        key = (commit, folder)
        if key in self._subtree_cache:
            return self._subtree_cache[key]
        found = self._find_subtree(commit, folder)
        if len(self._subtree_cache) > 64:
            self._subtree_cache.clear()
        self._subtree_cache[key] = found
        return found

    def _find_subtree(self, commit: str, folder: str) -> pygit2.Tree | None:
        tree = self._tree(commit)
        folder = folder.strip("/")
        if not folder:
            return tree
        try:
            obj = tree / folder if "/" not in folder else tree[folder]
        except KeyError:
            return None
        if isinstance(obj, pygit2.Tree):
            return obj
        return None


# --- tree objects --------------------------------------------------------------
# For the walks over many commits (history, approval, the daemon's own status
# writes), which hold tree objects rather than commit ids.


def subtree_of(tree: pygit2.Tree | None, name: str) -> pygit2.Tree | None:
    """The folder ``name`` directly in ``tree``, or None."""
    if tree is None or name not in tree:
        return None
    obj = tree[name]
    return obj if isinstance(obj, pygit2.Tree) else None


def entry_id(tree: pygit2.Tree, name: str, kind: type) -> pygit2.Oid | None:
    """The id of ``name`` in ``tree`` when it is a ``kind`` (Tree or Blob)."""
    if name not in tree:
        return None
    entry = tree[name]
    return entry.id if entry.type_str == ("tree" if kind is pygit2.Tree else "blob") else None


def entry_of(tree: pygit2.Tree | None, name: str) -> tuple[str, int] | None:
    """(id, file mode) of ``name`` in ``tree``, or None."""
    if tree is None or name not in tree:
        return None
    entry = tree[name]
    return (str(entry.id), entry.filemode)


def blobs_under(tree: pygit2.Tree, prefix: str) -> list[tuple[str, str]]:
    """(``prefix/path``, blob id) of every file in ``tree``, nested ones too."""
    found: list[tuple[str, str]] = []
    for entry in tree:
        path = f"{prefix}/{entry.name}"
        if entry.type_str == "blob":
            found.append((path, str(entry.id)))
        elif entry.type_str == "tree":
            found.extend(blobs_under(entry.peel(pygit2.Tree), path))
    return found
