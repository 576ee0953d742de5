"""A fleet repository's branch, read-only: the committed tree of a remote
(through ``GitStore``'s mirror), a bare repository or a working clone.
Commands that only read (``status``, ``plan``, ``backups``) come here; only
the daemon writes, through ``GitStore``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pygit2

from reconciler.git.store import GitStore, discover_repository, is_remote_location
from reconciler.git.tree_reader import TreeReader
from reconciler.git.watch import BranchWatcher, PollEvents

REMOTE_POLL = 2.0  # seconds between listings of a remote's refs while watching


@dataclass
class Branch:
    """One branch of a fleet repository, read-only."""

    reader: GitStore | TreeReader
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

    def watcher(self, branches: list[str], log: PollEvents | None = None) -> BranchWatcher:
        """Hints that ``branches`` moved; a remote's failed polls go to ``log``."""
        if isinstance(self.reader, GitStore):
            return BranchWatcher.for_store(self.reader, branches, poll=REMOTE_POLL, log=log)
        return BranchWatcher.local(Path(self.reader.repository().path), branches)


def open_branch(
    location: str,
    branch: str,
    *,
    ssh_key: Path | None = None,
    known_hosts: Path | None = None,
) -> Branch:
    """The branch at ``location``: a remote URL, a bare repository, or a
    working clone, whose ``origin`` is read instead when it has one (the
    daemon pushes status there; the clone's branch is as old as its last pull).
    A remote is reached with `ssh_key` and its host key checked against
    `known_hosts` (default ``~/.ssh/known_hosts``)."""
    if is_remote_location(location):
        store = GitStore.open(location, branch, ssh_key=ssh_key, known_hosts=known_hosts)
        return Branch(store, branch, location)
    repo = _discover(location)
    origin = None if repo.is_bare else _origin_url(repo)
    if origin is None:
        return _local(repo, branch, location)
    if is_remote_location(origin):
        store = GitStore.open(origin, branch, ssh_key=ssh_key, known_hosts=known_hosts)
        return Branch(store, branch, f"{origin} (origin of {location})")
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
    return Branch(TreeReader(repo, label), branch, label)


def _origin_url(repo: pygit2.Repository) -> str | None:
    try:
        url = repo.remotes["origin"].url
    except KeyError:
        return None
    return str(url) if url else None


def local_branch(repo: pygit2.Repository, label: str) -> Branch:
    """A repository already open (``plan``), read at given commits only."""
    return Branch(TreeReader(repo, label), "", label)
