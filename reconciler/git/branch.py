"""A fleet repository's branch, read-only: the committed tree of a remote
(through ``GitStore``'s mirror), a bare repository or a working clone.
Commands that only read (``status``, ``plan``, ``backups``) come here; only
the daemon writes, through ``GitStore``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pygit2

from reconciler.git.store import GitStore, discover_repository, is_remote_location
from reconciler.git.watch import BranchWatcher
from reconciler.spec import documents
from reconciler.spec.paths import SPEC_FOLDERS

REMOTE_POLL = 2.0  # seconds between listings of a remote's refs while watching


class RepoReader:
    """The few reads the read-only commands need, on a repository GitStore will not
    open for the daemon (a working clone with the branch checked out).
    Reading committed objects is safe there; only moving the branch is not."""

    def __init__(self, repo: pygit2.Repository, location: str) -> None:
        self._repo = repo
        self.location = location
        self.is_remote = False

    def repository(self) -> pygit2.Repository:
        return self._repo

    def tip(self, branch: str) -> str | None:
        ref = self._repo.references.get(f"refs/heads/{branch}")
        return None if ref is None else str(ref.resolve().target)

    def files(self, commit: str, folder: str) -> dict[str, str]:
        try:
            sub = self._repo[commit].peel(pygit2.Tree)[folder]
        except KeyError:
            return {}
        if not isinstance(sub, pygit2.Tree):
            return {}
        return {f"{folder}/{e.name}": str(e.id) for e in sub if e.type_str == "blob"}

    def file_blob(self, commit: str, path: str) -> str | None:
        try:
            entry = self._repo[commit].peel(pygit2.Tree)[path]
        except KeyError:
            return None
        return str(entry.id) if entry.type_str == "blob" else None

    def blob(self, blob_id: str) -> bytes:
        obj = self._repo[blob_id]
        assert isinstance(obj, pygit2.Blob)
        return bytes(obj.data)


@dataclass
class Branch:
    """One branch of a fleet repository, read-only."""

    reader: GitStore | RepoReader
    branch: str
    label: str  # where it is read from, for headers and messages

    @property
    def is_remote(self) -> bool:
        return self.reader.is_remote

    def refresh(self) -> str | None:
        """The branch tip (fetching first from a remote)."""
        if isinstance(self.reader, GitStore):
            self.reader.refresh()
        return self.reader.tip(self.branch)

    def tip(self, branch: str) -> str | None:
        return self.reader.tip(branch)

    def read(self, commit: str, path: str) -> bytes | None:
        blob = self.reader.file_blob(commit, path)
        return None if blob is None else self.reader.blob(blob)

    def watcher(self, branches: list[str]) -> BranchWatcher:
        if isinstance(self.reader, GitStore):
            return BranchWatcher.for_store(self.reader, branches, poll=REMOTE_POLL)
        return BranchWatcher.local(Path(self.reader.repository().path), branches)


def open_branch(location: str, branch: str) -> Branch:
    """The branch at ``location``: a remote URL, a bare repository, or a
    working clone, whose ``origin`` is read instead when it has one (the
    daemon pushes status there; the clone's branch is as old as its last pull)."""
    if is_remote_location(location):
        return Branch(GitStore.open(location, branch), branch, location)
    repo = _discover(location)
    origin = None if repo.is_bare else _origin_url(repo)
    if origin is None:
        return _local(repo, branch, location)
    if is_remote_location(origin):
        return Branch(GitStore.open(origin, branch), branch, f"{origin} (origin of {location})")
    target = Path(repo.workdir) / origin  # a relative origin is relative to the clone
    return _local(_discover(str(target)), branch, f"{origin} (origin of {location})")


def _discover(location: str) -> pygit2.Repository:
    return discover_repository(
        location,
        "pass --repo with a fleet repository: a clone, a bare repository or a URL",
    )


def _local(repo: pygit2.Repository, branch: str, label: str) -> Branch:
    """A bare repository through GitStore, as the daemon reads it; a
    non-bare one directly (GitStore refuses a checked-out branch, which
    matters for writing only)."""
    if repo.is_bare:
        return Branch(GitStore.open(str(repo.path), branch), branch, label)
    return Branch(RepoReader(repo, label), branch, label)


def _origin_url(repo: pygit2.Repository) -> str | None:
    try:
        url = repo.remotes["origin"].url
    except KeyError:
        return None
    return str(url) if url else None


def document_files(repo: pygit2.Repository, commit: pygit2.Commit) -> dict[str, bytes]:
    """Every file of the commit the documents loader reads (settings,
    nodes/, rollouts/, stray top-level YAML), by path."""
    files: dict[str, bytes] = {}
    pending: list[tuple[str, pygit2.Tree]] = [("", commit.tree)]
    while pending:
        prefix, tree = pending.pop()
        for entry in tree:
            path = f"{prefix}{entry.name}"
            if entry.type_str == "tree":
                if path.split("/")[0] in SPEC_FOLDERS:
                    sub = repo[entry.id]
                    assert isinstance(sub, pygit2.Tree)
                    pending.append((path + "/", sub))
            elif entry.type_str == "blob" and documents.is_document_path(path):
                blob = repo[entry.id]
                assert isinstance(blob, pygit2.Blob)
                files[path] = bytes(blob.data)
    return files


def local_branch(repo: pygit2.Repository, label: str) -> Branch:
    """A repository already open (``plan``), read at given commits only."""
    return Branch(RepoReader(repo, label), "", label)


def first_branch_tip(repo: pygit2.Repository, refs: tuple[str, ...]) -> str | None:
    """The commit of the first of ``refs`` that exists."""
    for name in refs:
        ref = repo.references.get(name)
        if ref is not None:
            return str(ref.peel(pygit2.Commit).id)
    return None
