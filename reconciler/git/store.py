"""The Git edge of the daemon: read a branch's committed tree, write status
in one commit, move the branch only by compare-and-swap (or a plain
fast-forward push to a remote).

- Reads never touch a working tree: objects are read at a commit id, so
  uncommitted edits do not exist for the daemon.
- Writes build trees with TreeBuilder (no index, no working tree) and move
  the branch only if it still points at the commit the pass read
  (``git update-ref NEW OLD``). A lost race raises ``RefMoved``: the caller
  re-reads and steps again; nothing is ever forced.
- A remote (``scheme://...`` or ``user@host:path``) is mirrored into a bare
  repository in a cache directory; ``refresh`` fetches it and ``commit``
  pushes fast-forward only, with a lease on the value read. Credentials come
  from ``--ssh-key``/``RECONCILER_SSH_KEY`` (or the SSH agent) and
  ``RECONCILER_GIT_TOKEN`` and are handed to libgit2 in memory only.
- An SSH server's host key is checked against ``--known-hosts`` (default
  ``~/.ssh/known_hosts``) in libgit2's certificate callback, before any
  authentication or Git data; a missing or different key fails the
  connection (``HostKeyError``). HTTPS certificates are verified by libgit2
  against the system's authorities, and an invalid one is refused too.

This module must not decide anything: it does not parse documents, choose
what to write or interpret history; ``history.History`` indexes history.
pygit2 errors are translated into ``StoreError`` here.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import sys
import time
import urllib.parse
import uuid
import zlib
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal, NoReturn

import cffi  # type: ignore[import-untyped]
import pygit2
from pygit2.enums import CredentialType, FetchPrune, FileMode, ObjectType, RepositoryOpenFlag
from pygit2.ffi import ffi as pygit2_ffi

from reconciler.git.history import History, changed_paths
from reconciler.git.known_hosts import DEFAULT_PORT, HostKey, default_known_hosts, verify_host_key
from reconciler.git.tree_reader import TreeReader, branch_ref
from reconciler.spec.errors import HostKeyError, KeyFileError, RefMoved, StoreError

DEFAULT_NAME = "reconciler"
DEFAULT_EMAIL = "reconciler@localhost"
SSH_KEY_ENV = "RECONCILER_SSH_KEY"
SSH_PASSPHRASE_ENV = "RECONCILER_SSH_KEY_PASSPHRASE"
TOKEN_ENV = "RECONCILER_GIT_TOKEN"
LOCK_WAIT = 0.5  # seconds to wait for another writer's ref lock
# libgit2 pushes from a ref, so each push gets its own under this prefix:
# two daemons sharing a mirror must never push each other's commit.
PUSH_REF_PREFIX = "refs/reconciler/push-"
FETCH_LOCK_TRIES = 10  # fetches into a mirror whose ref another daemon holds locked
# On a file:// remote the commit lands on a ref of its own first (see _push).
INCOMING_REF_PREFIX = "refs/reconciler/incoming-"

# git's rule: "host:path" is SSH when the colon comes before any slash.
_SCP_LIKE = re.compile(r"^(?:[^@/:]+@)?[^/:]+:(?!//)")
_NON_FF_WORDS = ("non-fast-forward", "fastforward", "fast-forward", "fetch first", "stale info")


def _no_crash_point(point: str) -> None:
    pass


def is_remote_location(location: str) -> bool:
    """True for URLs (``file://``, ``ssh://``, ``https://``, ...) and scp-like
    ``user@host:path``; False for a local path."""
    if "://" in location:
        return True
    return bool(_SCP_LIKE.match(location)) and not Path(location).exists()


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "reconciler" / "mirrors"


_ref = branch_ref


class GitStore(TreeReader):
    """One repository, one tracked branch. Build with ``GitStore.open``.

    Not thread-safe: use one GitStore per thread."""

    def __init__(
        self,
        repo: pygit2.Repository,
        branch: str,
        *,
        url: str | None,
        location: str,
        ssh_key: Path | None,
        name: str,
        email: str,
        known_hosts: Path | None = None,
    ) -> None:
        super().__init__(repo, location)
        self.branch = branch
        self.url = url
        self.is_remote = url is not None
        self._ssh_key = ssh_key
        self.known_hosts = known_hosts or default_known_hosts()
        self._name = name
        self._email = email
        self.read_only = False
        self._history: History | None = None
        self._write_blob: Callable[[bytes], pygit2.Oid] | None = None
        self._large_trees: LargeTrees | None = None
        self._pieces: PiecewiseBlobs | None = None
        # Called with "after_commit" between making a status commit and moving
        # the branch; the daemon passes its crash-point hook in (tests kill it there).
        self.crash_point: Callable[[str], None] = _no_crash_point

    # -- opening -----------------------------------------------------------

    @classmethod
    def open(
        cls,
        location: str,
        branch: str = "main",
        *,
        cache_dir: Path | None = None,
        ssh_key: Path | None = None,
        known_hosts: Path | None = None,
        name: str = DEFAULT_NAME,
        email: str = DEFAULT_EMAIL,
        read_only: bool = False,
    ) -> GitStore:
        """Open a local repository (path) or a mirror of a remote (URL).

        Refuses, with a StoreError saying what to do: a path that is not a Git
        repository, a non-bare repository whose `branch` is checked out (unless
        `read_only`: commands that only read, such as ``status``, may read a
        working clone's committed branch), a `branch` that does not exist, a
        remote that cannot be fetched, an SSH server whose host key
        `known_hosts` (default ``~/.ssh/known_hosts``) does not vouch for, an
        SSH key file that is missing or encrypted without
        ``RECONCILER_SSH_KEY_PASSPHRASE``. A read-only store refuses to commit."""
        if ssh_key is None and os.environ.get(SSH_KEY_ENV):
            ssh_key = Path(os.environ[SSH_KEY_ENV])
        if is_remote_location(location):
            if ssh_key is not None:
                check_ssh_key(ssh_key)
            repo = _open_mirror(location, cache_dir or default_cache_dir())
            store = cls(
                repo,
                branch,
                url=location,
                location=location,
                ssh_key=ssh_key,
                name=name,
                email=email,
                known_hosts=known_hosts,
            )
            store.read_only = read_only
            store.refresh()
        else:
            repo = _open_local(location)
            store = cls(
                repo,
                branch,
                url=None,
                location=location,
                ssh_key=None,
                name=name,
                email=email,
            )
            store.read_only = read_only
            if not read_only:
                store._refuse_checked_out(branch)
        if store.tip(branch) is None:
            known = sorted(
                r.removeprefix("refs/heads/")
                for r in repo.references
                if r.startswith("refs/heads/")
            )
            raise StoreError(
                f"branch {branch!r} not found in {location}",
                f"existing branches: {', '.join(known) or 'none'}; pass --branch",
            )
        return store

    def _refuse_checked_out(self, branch: str) -> None:
        """A branch checked out in a working tree must not move under it."""
        if self.is_remote:
            return
        refname = _ref(branch)
        for path in _checked_out_worktrees(self._repo, refname):
            raise StoreError(
                f"branch {branch!r} is checked out in the working tree {path}",
                "the daemon moves the branch without touching a working tree: use a bare "
                "repository (git clone --bare) or a remote URL",
            )

    # -- reading -----------------------------------------------------------

    def refresh(self) -> str | None:
        """Fetch (for a remote) and return the tip of the tracked branch."""
        if self.is_remote:
            self._fetch()
        return self.tip(self.branch)

    def history(self) -> History:
        """The first-parent history index of the tracked branch (one per store,
        kept across passes; call ``advance(tip)`` before querying)."""
        if self._history is None:
            self._history = History(self._repo)
        return self._history

    def forget_history(self) -> None:
        """Drop the history index: the next ``history()`` walks from scratch."""
        self._history = None

    def changed_paths(
        self,
        old: str | None,
        new: str | None,
        folders: tuple[str, ...],
        files: tuple[str, ...] = (),
    ) -> frozenset[str]:
        """The files under ``folders`` (and among top-level ``files``) that
        differ between commits ``old`` and ``new``, which need not be related
        (a rewind is a difference like any other); None is an empty tree."""
        try:
            return changed_paths(
                self._repo,
                self._tree(old) if old is not None else None,
                self._tree(new) if new is not None else None,
                folders,
                files,
            )
        except (KeyError, ValueError, pygit2.GitError) as e:
            raise StoreError(
                f"cannot compare {old} with {new}: {e}",
                "the repository is missing objects; re-fetch or check the repository",
            ) from e

    def file_blob(self, commit: str, path: str) -> str | None:
        # A file in a large folder this store wrote (status/ of thousands of
        # rollouts, in a status commit or a person's commit on top of one)
        # is found in the folder's kept entries: libgit2 would parse the
        # whole folder first (about a millisecond at 5,000 entries).
        folder, sep, name = path.rpartition("/")
        if sep and self._large_trees is not None:
            sub = self._subtree(commit, folder)  # its id, without parsing it
            found = self._large_trees.file(sub.id, name) if sub is not None else False
            if found is not False:
                return found
        return super().file_blob(commit, path)

    def is_descendant(self, commit: str, ancestor: str) -> bool:
        """True when `ancestor` is reachable from `commit` (or is `commit`)."""
        if commit == ancestor:
            return True
        try:
            return bool(self._repo.descendant_of(commit, ancestor))
        except (pygit2.GitError, KeyError, ValueError):
            return False

    def author(self, commit: str) -> str:
        """``Name <email>`` of the commit's author."""
        a = self._commit(commit).author
        return f"{a.name} <{a.email}>"

    def commit_message(self, commit: str) -> str:
        return self._commit(commit).message

    def signature(self, commit: str) -> tuple[str, bytes] | None:
        """(armored signature, signed payload) of a signed commit, else None."""
        sig, payload = self._commit(commit).gpg_signature
        if sig is None or payload is None:
            return None
        return sig.decode("utf-8", "replace"), payload

    @property
    def ssh_key(self) -> Path | None:
        return self._ssh_key

    # -- writing -----------------------------------------------------------

    def commit(
        self,
        branch: str,
        parent: str | None,
        changes: Mapping[str, bytes | None],
        message: str,
        *,
        sign: Callable[[bytes], str] | None = None,
        pieces: Mapping[str, Sequence[bytes]] | None = None,
    ) -> str:
        """Write `changes` (path -> content; None deletes) on top of `parent` in
        one commit and move `branch` from `parent` to it, only if the branch
        still points at `parent` (None: the branch must not exist yet, and the
        commit has no parent). For a remote, push fast-forward with a lease.

        Returns the new commit id. Raises RefMoved when the branch moved (the
        caller re-reads and steps again), StoreError for anything else.
        `sign(payload) -> armored signature` adds a ``gpgsig`` header.
        `pieces`: for some paths, their content as pieces that recur from
        commit to commit (the same objects), which joined are exactly the
        content: a large blob is then compressed piece by piece, and a piece
        compressed for the last commit is not compressed again.
        If the changes leave the tree as it is, nothing is committed and
        `parent` is returned."""
        refname = _ref(branch)
        if self.read_only:
            raise StoreError(
                f"{self.location} was opened read-only", "open it without read_only to commit"
            )
        self._refuse_checked_out(branch)
        try:
            base = self._commit(parent).tree if parent is not None else None
            write_blob = self._blob_writer()
            if pieces and self._pieces is not None:
                write_blob = self._pieces.writer(write_blob, changes, pieces)
            tree_id = _apply(self._repo, base, dict(changes), write_blob, self._large_trees)
        except ValueError as e:
            raise StoreError(f"cannot write status: {e}") from e
        except pygit2.GitError as e:
            raise StoreError(f"cannot write objects into {self.location}: {e}") from e
        if tree_id is None:
            tree_id = self._repo.TreeBuilder().write()
        if parent is not None and base is not None and tree_id == base.id:
            if not self.is_remote and self.tip(branch) != parent:
                raise RefMoved(f"branch {branch!r} moved from {parent}", "re-read and step again")
            return parent
        new = self._create_commit(tree_id, parent, message, sign)
        # Tests kill the daemon here: the commit object exists, the branch has not moved.
        self.crash_point("after_commit")
        if self.is_remote:
            self._push(branch, parent, new)
        else:
            self._swap(refname, parent, new, message)
        return new

    def _create_commit(
        self,
        tree_id: pygit2.Oid,
        parent: str | None,
        message: str,
        sign: Callable[[bytes], str] | None,
    ) -> str:
        who = pygit2.Signature(self._name, self._email, int(time.time()), 0)
        parents: list[str | pygit2.Oid] = [pygit2.Oid(hex=parent)] if parent is not None else []
        if not message.endswith("\n"):
            message += "\n"
        try:
            if sign is None:
                oid = self._repo.create_commit(None, who, who, message, tree_id, parents)
            else:
                # The stubs say Oid; libgit2 hands back the commit text (str).
                payload = str(self._repo.create_commit_string(who, who, message, tree_id, parents))
                armored = sign(payload.encode("utf-8"))
                oid = self._repo.create_commit_with_signature(payload, armored, "gpgsig")
        except pygit2.GitError as e:
            raise StoreError(f"cannot create a commit in {self.location}: {e}") from e
        return str(oid)

    def _swap(self, refname: str, parent: str | None, new: str, message: str) -> None:
        _compare_and_swap(self._repo, self.location, refname, parent, new, message)

    # -- remote ------------------------------------------------------------

    def _callbacks(self) -> _Callbacks:
        return _Callbacks(self._ssh_key, self.known_hosts, _ssh_port(self.url or ""))

    def poller(self) -> RemotePoller:
        """A lister of the remote's branch tips for another thread (pygit2
        objects are not shared across threads)."""
        assert self.url is not None, "only a remote is polled"
        return RemotePoller(Path(self._repo.path), self.url, self._callbacks)

    def _remote(self) -> pygit2.Remote:
        return self._repo.remotes["origin"]

    def _fetch(self) -> None:
        # Two daemons may share one mirror: a fetch that meets the other's ref
        # lock in it waits briefly and fetches again.
        for attempt in range(FETCH_LOCK_TRIES):
            try:
                self._remote().fetch(
                    # Reviewers' approvals travel with the branch (docs/trust.md).
                    ["+refs/heads/*:refs/heads/*", "+refs/notes/*:refs/notes/*"],
                    callbacks=self._callbacks(),
                    prune=FetchPrune.PRUNE,
                )
                return
            except (pygit2.GitError, OSError) as e:
                if _transient_fetch_error(e) and attempt + 1 < FETCH_LOCK_TRIES:
                    time.sleep(0.02 * (attempt + 1))
                    continue
                raise _remote_error(f"cannot fetch {self.url}", e, self._ssh_key) from e

    def _push(self, branch: str, parent: str | None, new: str) -> None:
        """Fast-forward push of `new` onto `branch`, only if the remote branch
        is still `parent` (a lease checked during negotiation; a server
        applies it atomically). libgit2's file:// transport overwrites the
        ref without that check, so there the commit goes to a fresh ref of its
        own and the branch is moved by compare-and-swap in the remote
        repository itself."""
        refname = _ref(branch)
        unique = f"{os.getpid()}-{uuid.uuid4().hex}"
        push_ref = f"{PUSH_REF_PREFIX}{unique}"
        local_remote = _file_url_path(self.url or "")
        target = f"{INCOMING_REF_PREFIX}{unique}" if local_remote else refname
        self._repo.references.create(push_ref, new, force=False)
        callbacks = self._callbacks()
        callbacks.lease = (refname, parent) if local_remote is None else None
        moved = RefMoved(
            f"{refname} on {self.url} no longer points at {parent or 'nothing'}",
            "someone pushed meanwhile: fetch, re-read and step again",
        )
        try:
            self._remote().push([f"{push_ref}:{target}"], callbacks=callbacks)
        except _LeaseBroken as e:
            raise moved from e
        except (pygit2.GitError, OSError) as e:
            said = callbacks.server_text()
            why = f"failed: {e}" + (f"; the server said: {said}" if said else "")
            self._refused(refname, parent, moved, why, e)
        finally:
            ref = self._repo.references.get(push_ref)
            if ref is not None:
                ref.delete()
        if callbacks.rejected is not None:
            said = callbacks.server_text()
            why = f"refused: {callbacks.rejected}" + (f"; the server said: {said}" if said else "")
            self._refused(refname, parent, moved, why, None)
        if local_remote is not None:
            try:
                remote_repo = pygit2.Repository(str(local_remote), RepositoryOpenFlag.NO_SEARCH)
            except (pygit2.GitError, OSError) as e:
                raise StoreError(f"cannot open {self.url}: {e}") from e
            try:
                _compare_and_swap(remote_repo, str(self.url), refname, parent, new, "push")
            finally:
                incoming = remote_repo.references.get(target)
                if incoming is not None:
                    incoming.delete()
        # The remote took it: the mirror follows without another fetch.
        self._repo.references.create(refname, new, force=True)

    def _refused(
        self,
        refname: str,
        parent: str | None,
        moved: RefMoved,
        why: str,
        cause: BaseException | None,
    ) -> NoReturn:
        """A push that did not land: a race if the remote branch moved (in any
        wording a server may use), otherwise an error worth a backoff."""
        if _looks_non_ff(why):
            raise moved from cause
        try:
            heads = self._list_heads()
        except (pygit2.GitError, OSError, StoreError):
            heads = None
        if heads is not None and heads.get(refname) != parent:
            raise moved from cause
        raise StoreError(
            f"push to {self.url} {why}",
            f"not a race (the branch did not move): check that the daemon may push {refname} "
            "and what the server's hooks require; a server that lets the daemon push only "
            "some branches can take status on one of those (statusBranch in reconciler.yaml); "
            "the daemon retries with backoff",
        ) from cause

    def _list_heads(self) -> dict[str, str]:
        """The remote's refs now (``git ls-remote``), without fetching."""
        # A fresh remote: a reused one answers its first listing again.
        assert self.url is not None
        remote = self._repo.remotes.create_anonymous(self.url)
        return {
            h.name: str(h.oid) for h in remote.list_heads(self._callbacks()) if h.name is not None
        }

    # -- helpers -----------------------------------------------------------

    def _blob_writer(self) -> Callable[[bytes], pygit2.Oid]:
        """How ``commit`` writes a new blob. libgit2 rescans the pack
        directory each time an object it is about to write is not found
        (to freshen an existing copy), so in a packed repository 1,000 new
        status blobs cost half a second. New blobs are written through an
        object database with the loose backend alone: same ids, bytes and
        file modes as the repository's own writes. A repository with
        ``core.sharedRepository`` keeps its own writer (its file modes)."""
        if self._write_blob is None:
            self._write_blob = self._repo.create_blob
            write_tree: Callable[[bytes], pygit2.Oid] = partial(
                self._repo.odb.write, ObjectType.TREE
            )
            try:
                shared = "core.sharedRepository" in self._repo.config
            except (pygit2.GitError, OSError):
                shared = True
            if not shared:
                odb = pygit2.Odb()
                objects = str(Path(self._repo.path) / "objects")
                odb.add_backend(pygit2.OdbBackendLoose(objects, -1, False), 1)
                self._write_blob = partial(
                    _write_blob, partial(odb.write, ObjectType.BLOB), Path(objects)
                )
                # Large trees stored without compression (see LargeTrees).
                write_tree = partial(_write_loose, Path(objects), b"tree", 0)
                self._pieces = PiecewiseBlobs(Path(objects))
            self._large_trees = LargeTrees(write_tree)
        return self._write_blob


# -- module helpers ---------------------------------------------------------


def _compare_and_swap(
    repo: pygit2.Repository,
    location: str,
    refname: str,
    parent: str | None,
    new: str,
    message: str,
) -> None:
    """``git update-ref REF NEW PARENT``: move only if REF is still PARENT
    (PARENT None: REF must not exist).

    A held ref lock means another writer is mid-update: wait for it briefly,
    then it is either a race (the ref moved: RefMoved) or a lock nobody
    releases (StoreError naming the lock file)."""
    moved = RefMoved(
        f"{refname} no longer points at {parent or 'nothing'}",
        "another writer moved the branch: re-read it and step again",
    )
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            if parent is None:
                repo.references.create(refname, new, force=False)
                return
            ref = repo.references.get(refname)
            if ref is None or str(ref.target) != parent:
                raise moved
            ref.set_target(new, message.splitlines()[0] if message else "reconciler")
            return
        except RefMoved:
            raise
        except pygit2.AlreadyExistsError as e:
            raise moved from e
        except (pygit2.GitError, OSError) as e:
            current = repo.references.get(refname)
            if (str(current.target) if current is not None else None) != parent:
                raise moved from e
            if "lock" not in str(e).lower():
                raise StoreError(f"cannot move {refname} in {location}: {e}") from e
            if time.monotonic() >= deadline:
                lock = Path(repo.path) / f"{refname}.lock"
                raise StoreError(
                    f"{refname} in {location} stays locked",
                    f"another git process is writing it; if none is, remove {lock}",
                ) from e
            time.sleep(0.005)


def _file_url_path(url: str) -> Path | None:
    """The repository path of a ``file://`` URL, else None."""
    if not url.startswith("file://"):
        return None
    parsed = urllib.parse.urlparse(url)
    return Path(urllib.parse.unquote(parsed.path))


def discover_repository(location: str, hint: str) -> pygit2.Repository:
    """The repository at or above ``location``, as ``git`` finds it from a
    working directory (for the commands that read a person's clone)."""
    try:
        found = pygit2.discover_repository(str(Path(location).resolve()))
    except (pygit2.GitError, OSError):
        found = None
    if found is None:
        raise StoreError(f"{location} is not a Git repository", hint)
    return pygit2.Repository(found, RepositoryOpenFlag.NO_SEARCH)


def _open_local(location: str) -> pygit2.Repository:
    path = Path(location)
    if not path.exists():
        raise StoreError(f"{location} does not exist", "pass the path of a Git repository or a URL")
    try:
        return pygit2.Repository(str(path), RepositoryOpenFlag.NO_SEARCH)
    except (pygit2.GitError, KeyError, OSError) as e:
        raise StoreError(
            f"{location} is not a Git repository",
            "pass a bare repository (git init --bare / git clone --bare) or a remote URL",
        ) from e


def _checked_out_worktrees(repo: pygit2.Repository, refname: str) -> list[str]:
    """Working trees (main and linked) whose HEAD is `refname`."""
    found: list[str] = []
    if not repo.is_bare and _head_name(repo) == refname:
        found.append(str(repo.workdir))
    for name in repo.list_worktrees():
        try:
            wt = repo.lookup_worktree(name)
            other = pygit2.Repository(wt.path)
        except (pygit2.GitError, KeyError, OSError):
            continue
        if _head_name(other) == refname:
            found.append(wt.path)
    return found


def _head_name(repo: pygit2.Repository) -> str | None:
    try:
        target = repo.references["HEAD"].target
    except (KeyError, pygit2.GitError):
        return None
    return target if isinstance(target, str) else None


def _open_mirror(url: str, cache_dir: Path) -> pygit2.Repository:
    """The bare mirror of `url` in `cache_dir`, made on first use."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", url.rstrip("/").rsplit("/", 1)[-1])[:40] or "repo"
    path = cache_dir / f"{stem}-{digest}.git"
    try:
        if not path.exists():
            # Made aside and renamed into place: two daemons starting together
            # must not initialise the same directory at once.
            cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = cache_dir / f".{path.name}.{os.getpid()}-{uuid.uuid4().hex}"
            made = pygit2.init_repository(str(tmp), bare=True)
            made.remotes.create("origin", url, "+refs/heads/*:refs/heads/*")
            del made
            try:
                os.rename(tmp, path)
            except OSError:
                if not path.exists():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # the other one won
        repo = pygit2.Repository(str(path), RepositoryOpenFlag.NO_SEARCH)
        if repo.remotes["origin"].url != url:
            repo.remotes.set_url("origin", url)
        # The remote's URL (a token in it included) is in the config: owner only.
        os.chmod(path / "config", 0o600)
        return repo
    except (pygit2.GitError, OSError, KeyError) as e:
        raise StoreError(
            f"cannot prepare a mirror of {url} in {path}: {e}",
            "check that the cache directory is writable (--cache-dir)",
        ) from e


def _apply(
    repo: pygit2.Repository,
    base: pygit2.Tree | pygit2.Oid | None,
    changes: dict[str, bytes | None],
    write_blob: Callable[[bytes], pygit2.Oid],
    large: LargeTrees | None = None,
) -> pygit2.Oid | None:
    """Write a tree: `base` with `changes` applied (nested paths allowed).
    Returns None when the result would be empty (git stores no empty trees).
    ``large``: folders of many entries are patched from their kept entries;
    `base` is then the id of a tree ``large`` keeps, not parsed by libgit2
    (a millisecond at 5,000 entries)."""
    entries: dict[str, tuple[pygit2.Oid, int] | None] = {}  # name -> (id, mode); None: removed
    nested: dict[str, dict[str, bytes | None]] = {}
    for path, data in changes.items():
        head, sep, rest = path.partition("/")
        if not head or head in (".", "..", ".git") or (sep and not rest):
            raise ValueError(f"bad path {path!r}")
        if sep:
            nested.setdefault(head, {})[rest] = data
        elif data is None:
            if _entry(base, head, large) is not None:
                entries[head] = None
        else:
            entries[head] = (write_blob(data), FileMode.BLOB)
    for head, sub in nested.items():
        existing = _entry(base, head, large)
        subtree: pygit2.Tree | pygit2.Oid | None = None
        if existing is not None and existing[1] == FileMode.TREE:
            subtree = existing[0] if large is not None and large.keeps(existing[0]) else None
            if subtree is None:
                found = repo[existing[0]]
                assert isinstance(found, pygit2.Tree)
                subtree = found
        oid = _apply(repo, subtree, sub, write_blob, large)
        if oid is None:
            if existing is not None:
                entries[head] = None
        else:
            entries[head] = (oid, FileMode.TREE)
    if isinstance(base, pygit2.Oid):
        assert large is not None
        return large.patch(base, entries)
    if large is not None and base is not None and len(base) >= LARGE_TREE:
        return large.patch(base.id, entries, base)
    builder = repo.TreeBuilder(base) if base is not None else repo.TreeBuilder()
    for name, entry in entries.items():
        if entry is None:
            builder.remove(name)
        else:
            builder.insert(name, *entry)
    if len(builder) == 0:
        return None
    return builder.write()


LARGE_TREE = 512  # entries: a folder this large is patched, not rebuilt (LargeTrees)


class LargeTrees:
    """The trees of large folders (``status/`` of thousands of rollouts),
    kept as their entries' bytes in Git's order by tree id, so that a
    commit changing a few files patches the folder's entries and writes
    the tree, instead of loading and sorting every entry into a
    TreeBuilder (4 ms at 5,000 entries, against 0.5). Such trees are
    written uncompressed: their 20-byte ids do not compress (zlib took
    2 ms to save a third of a 5,000-entry tree), and ``git gc`` packs them
    with deltas anyway. The tree ids are the ones TreeBuilder writes (tests
    pin this)."""

    KEPT = 4  # folders' trees kept

    def __init__(self, write_tree: Callable[[bytes], pygit2.Oid]) -> None:
        self._write_tree = write_tree
        self._kept: dict[pygit2.Oid, tuple[list[bytes], list[bytes]]] = {}

    def file(self, tree_id: pygit2.Oid, name: str) -> str | Literal[False] | None:
        """The blob id of the file ``name`` in a kept tree (None when it has
        no file of that name: absent, or a folder or submodule); False when
        the tree is not kept."""
        if tree_id not in self._kept:
            return False
        found = self.entry(tree_id, name)
        return str(found[0]) if found is not None and found[1] in _BLOB_MODES else None

    def keeps(self, tree_id: pygit2.Oid) -> bool:
        return tree_id in self._kept

    def entry(self, tree_id: pygit2.Oid, name: str) -> tuple[pygit2.Oid, int] | None:
        """(id, file mode) of ``name`` in a kept tree, or None."""
        keys, entries = self._kept[tree_id]
        raw = name.encode()
        for key in (raw, raw + b"/"):  # a file, a folder
            at = bisect_left(keys, key)
            if at < len(keys) and keys[at] == key:
                entry = entries[at]
                return (pygit2.Oid(raw=entry[-20:]), int(entry[: entry.index(b" ")], 8))
        return None

    def patch(
        self,
        base_id: pygit2.Oid,
        changes: Mapping[str, tuple[pygit2.Oid, int] | None],
        base: pygit2.Tree | None = None,
    ) -> pygit2.Oid | None:
        """The tree ``base_id`` (kept, or else ``base``) with ``changes``
        (name -> (id, file mode), None: removed)."""
        kept = self._kept.pop(base_id, None)
        if kept is None:
            assert base is not None, "a tree not kept is patched from its object"
            kept = _tree_entries(base)
        keys, entries = kept
        for name, change in changes.items():
            raw = name.encode()
            for key in (raw, raw + b"/"):  # as a file, as a folder
                at = bisect_left(keys, key)
                if at < len(keys) and keys[at] == key:
                    del keys[at], entries[at]
            if change is not None:
                oid, mode = change
                key = raw + b"/" if mode == FileMode.TREE else raw
                at = bisect_left(keys, key)
                keys.insert(at, key)
                entries.insert(at, b"%o %s\0%s" % (mode, raw, oid.raw))
        if not keys:
            return None
        tree_id = self._write_tree(b"".join(entries))
        if len(self._kept) >= self.KEPT:
            self._kept.pop(next(iter(self._kept)))
        self._kept[tree_id] = (keys, entries)
        return tree_id


_BLOB_MODES = (FileMode.BLOB, FileMode.BLOB_EXECUTABLE, FileMode.LINK)  # files' entries

LARGE_BLOB = 64 * 1024  # bytes: written by _write_loose (the dashboard)


def _write_blob(write: Callable[[bytes], pygit2.Oid], objects: Path, data: bytes) -> pygit2.Oid:
    """A new blob: a large one (the 600 KB dashboard of 5,000 rollouts)
    written here, at libgit2's loose compression level, with OpenSSL's
    SHA-1 (libgit2's collision-detecting one took a millisecond of the
    two a dashboard cost); the others by libgit2."""
    if len(data) >= LARGE_BLOB:
        return _write_loose(objects, b"blob", 1, data)
    return write(data)


def _write_loose(objects: Path, kind: bytes, level: int, data: bytes) -> pygit2.Oid:
    """An object written loose the way libgit2's loose backend writes (a
    read-only file renamed into place; kept if there), at zlib ``level``.
    Level 0 is written here because libgit2 1.9 writes level 0 objects it
    cannot read back ("failed to inflate loose object")."""
    raw = b"%s %d\0" % (kind, len(data)) + data
    hexid = hashlib.sha1(raw).hexdigest()
    folder = objects / hexid[:2]
    path = folder / hexid[2:]
    if not path.exists():
        folder.mkdir(exist_ok=True)
        temporary = folder / f"tmp_obj_{os.getpid()}_{uuid.uuid4().hex}"
        with open(temporary, "xb") as out:
            out.write(zlib.compress(raw, level))
        temporary.chmod(0o444)
        os.replace(temporary, path)
    return pygit2.Oid(hex=hexid)


class PiecewiseBlobs:
    """Large blobs given as pieces that recur from commit to commit (the
    dashboard of 5,000 rollouts: its rows in blocks, of which a pass
    changes one or two), written loose with each piece compressed on its
    own: the pieces compressed for the last write are kept, so only new
    pieces are compressed (zlib took a millisecond a pass for the whole
    600 KB). The object is a valid zlib stream of the same bytes (each
    piece ends in a full flush, so none refers back to another: the
    pieces' deflate segments can be put together in any order), a fifth
    to a third larger than one stream until ``git gc`` packs it; its id
    is the content's, as for any other write (tests pin both)."""

    def __init__(self, objects: Path) -> None:
        self._objects = objects
        # piece -> (its raw deflate segment, its Adler-32): the last write's only
        self._kept: dict[bytes, tuple[bytes, int]] = {}

    def writer(
        self,
        write_blob: Callable[[bytes], pygit2.Oid],
        changes: Mapping[str, bytes | None],
        pieces: Mapping[str, Sequence[bytes]],
    ) -> Callable[[bytes], pygit2.Oid]:
        """``write_blob``, except for the contents ``pieces`` are given for.
        The content in ``changes`` is the one source: pieces that do not
        join to exactly its bytes are refused, and they are found again by
        that content, never by which object holds it."""
        split: dict[bytes, Sequence[bytes]] = {}
        for path, parts in pieces.items():
            data = changes.get(path)
            if data is None or len(data) < LARGE_BLOB:
                continue
            if b"".join(parts) != data:
                raise ValueError(f"the pieces of {path} are not its content")
            split[data] = parts

        def write(data: bytes) -> pygit2.Oid:
            parts = split.get(data) if len(data) >= LARGE_BLOB else None
            return write_blob(data) if parts is None else self.write(parts)

        return write

    def write(self, parts: Sequence[bytes]) -> pygit2.Oid:
        """The blob of ``b"".join(parts)``, written loose if new."""
        size = sum(map(len, parts))
        header = b"blob %d\0" % size
        digest = hashlib.sha1(header)
        for part in parts:
            digest.update(part)
        hexid = digest.hexdigest()
        folder = self._objects / hexid[:2]
        path = folder / hexid[2:]
        kept, self._kept = self._kept, {}
        if path.exists():
            for part in parts:  # what the next write may reuse
                if part in kept:
                    self._kept[part] = kept[part]
            return pygit2.Oid(hex=hexid)
        compressor = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS)
        segments = [_ZLIB_HEADER]
        checksum = zlib.adler32(header)
        for part in (header, *parts):
            found = kept.get(part) if part is not header else None
            if found is None:
                found = (
                    compressor.compress(part) + compressor.flush(zlib.Z_FULL_FLUSH),
                    zlib.adler32(part),
                )
            if part is not header:
                self._kept[part] = found
                checksum = adler32_combine(checksum, found[1], len(part))
            segments.append(found[0])
        segments += [_DEFLATE_END, checksum.to_bytes(4, "big")]
        folder.mkdir(exist_ok=True)
        temporary = folder / f"tmp_obj_{os.getpid()}_{uuid.uuid4().hex}"
        with open(temporary, "xb") as out:
            out.write(b"".join(segments))
        temporary.chmod(0o444)
        os.replace(temporary, path)
        return pygit2.Oid(hex=hexid)


_ZLIB_HEADER = b"\x78\x01"  # deflate, 32 KiB window, fastest level (as zlib level 1 writes)
_DEFLATE_END = b"\x03\x00"  # an empty final block
_ADLER_BASE = 65521


def adler32_combine(first: int, second: int, second_length: int) -> int:
    """The Adler-32 of two byte strings one after the other, from each
    one's Adler-32 and the second's length (zlib's ``adler32_combine``,
    which Python's zlib module does not offer)."""
    rem = second_length % _ADLER_BASE
    sum1 = first & 0xFFFF
    sum2 = (rem * sum1) % _ADLER_BASE
    sum1 += (second & 0xFFFF) + _ADLER_BASE - 1
    sum2 += (first >> 16) + (second >> 16) + _ADLER_BASE - rem
    return (sum1 % _ADLER_BASE) | ((sum2 % _ADLER_BASE) << 16)


def _tree_entries(tree: pygit2.Tree) -> tuple[list[bytes], list[bytes]]:
    """A tree's entries in Git's order (names compared as bytes, a folder's
    as if it ended in ``/``): their sort keys and their bytes in the tree
    object (``MODE NAME\\0ID``)."""
    found: list[tuple[bytes, bytes]] = []
    for entry in tree:
        raw = entry.raw_name or b""
        key = raw + b"/" if entry.filemode == FileMode.TREE else raw
        found.append((key, b"%o %s\0%s" % (entry.filemode, raw, entry.id.raw)))
    found.sort()
    return [key for key, _ in found], [raw for _, raw in found]


def _entry(
    tree: pygit2.Tree | pygit2.Oid | None, name: str, large: LargeTrees | None
) -> tuple[pygit2.Oid, int] | None:
    """(id, file mode) of ``name`` in a tree, or in a tree ``large`` keeps."""
    if tree is None:
        return None
    if isinstance(tree, pygit2.Oid):
        assert large is not None
        return large.entry(tree, name)
    if name not in tree:
        return None
    entry = tree[name]
    return (entry.id, entry.filemode)


def _looks_non_ff(text: str) -> bool:
    low = text.lower()
    return any(w in low for w in _NON_FF_WORDS) or "not present locally" in low


class _LeaseBroken(Exception):
    pass


class _Callbacks(pygit2.RemoteCallbacks):
    """Credentials from memory; the server's host key checked; push results,
    the server's own text and the lease check recorded."""

    def __init__(
        self, ssh_key: Path | None, known_hosts: Path | None = None, port: int = DEFAULT_PORT
    ) -> None:
        super().__init__()
        self.ssh_key = ssh_key
        self.known_hosts = known_hosts or default_known_hosts()
        self.port = port
        self.attempts = 0
        self.lease: tuple[str, str | None] | None = None
        self.lease_broken = False
        self.rejected: str | None = None
        self.said: list[str] = []  # what the server printed ("remote: ..." lines)

    def certificate_check(self, certificate: Any, valid: bool, host: bytes | str) -> bool:
        """Fail closed: an SSH host key must match ``known_hosts`` for this
        host and port; a TLS certificate must be one libgit2 found valid.
        Raising here aborts the connection before anything is read."""
        name = host.decode("utf-8", "replace") if isinstance(host, bytes) else str(host)
        kind, offered = _offered_certificate()
        if kind == _CERT_X509:
            if valid:
                return True
            raise StoreError(
                f"refusing {name}: its TLS certificate is not valid (self-signed, expired, "
                "or not for this name)",
                "give the server a certificate from an authority this machine trusts; "
                "nothing turns this check off",
            )
        if kind != _CERT_HOSTKEY or offered is None:
            raise HostKeyError(
                f"refusing {name}: cannot read the host key it offered",
                "this build of pygit2/libgit2 does not expose SSH host keys; "
                "use the pygit2 version in pyproject.toml",
            )
        verify_host_key(self.known_hosts, name, self.port, offered)
        return True

    def sideband_progress(self, string: str) -> None:
        self.said.append(string)

    def server_text(self) -> str:
        """What the server printed, as one line (a hook's or gitolite's refusal)."""
        lines = "".join(self.said).replace("\r", "\n").splitlines()
        return " / ".join(line.strip() for line in lines if line.strip())[:1000]

    def credentials(self, url: str, username_from_url: str | None, allowed_types: Any) -> Any:
        self.attempts += 1
        user = username_from_url or "git"
        if self.attempts > 3:
            if self.ssh_key is not None and allowed_types & CredentialType.SSH_KEY:
                raise StoreError(
                    f"{url} refused the SSH key {self.ssh_key} for user {user!r}",
                    f"add {self.ssh_key}.pub to the server's authorized keys for {user!r}, "
                    f"or pass another key with --ssh-key / {SSH_KEY_ENV}",
                )
            raise StoreError(
                f"authentication to {url} failed",
                f"check --ssh-key / {SSH_KEY_ENV} (or the SSH agent) or {TOKEN_ENV}",
            )
        if allowed_types & CredentialType.SSH_KEY:
            if self.ssh_key is not None:
                passphrase = check_ssh_key(self.ssh_key)
                pub = Path(f"{self.ssh_key}.pub")
                return pygit2.Keypair(
                    user, str(pub) if pub.exists() else None, str(self.ssh_key), passphrase
                )
            return pygit2.KeypairFromAgent(user)
        token = os.environ.get(TOKEN_ENV)
        if allowed_types & CredentialType.USERPASS_PLAINTEXT and token:
            return pygit2.UserPass(username_from_url or "x-access-token", token)
        if allowed_types & CredentialType.USERNAME:
            return pygit2.Username(user)
        raise StoreError(
            f"{url} asks for credentials and none are configured",
            f"set {TOKEN_ENV} for HTTPS or --ssh-key / {SSH_KEY_ENV} for SSH",
        )

    def push_negotiation(self, updates: list[Any]) -> None:
        if self.lease is None:
            return
        refname, expected = self.lease
        for u in updates:
            if u.dst_refname != refname:
                continue
            current = None if u.src.raw == b"\0" * len(u.src.raw) else str(u.src)
            if current != expected:
                self.lease_broken = True
                raise _LeaseBroken(f"{refname} is {current}, expected {expected}")

    def push_update_reference(self, refname: str, message: str | None) -> None:
        if message:
            self.rejected = f"{refname}: {message}"


class RemotePoller:
    """Lists a remote's branch tips (``git ls-remote``, no fetch) and compares
    them with the mirror's copies, from a thread of its own. Each listing
    is a fresh connection, closed as soon as the tips are read: a
    connection kept open would keep a ``git-upload-pack`` running on the
    server until the next poll."""

    def __init__(self, mirror: Path, url: str, callbacks: Callable[[], _Callbacks]) -> None:
        self._mirror = mirror
        self._url = url
        self._callbacks = callbacks
        self._repo: pygit2.Repository | None = None

    def differs(self, refnames: list[str]) -> bool:
        """True when the remote's tip of any of `refnames` is not the mirror's.
        Raises StoreError (HostKeyError for a refused host key)."""
        try:
            if self._repo is None:
                self._repo = pygit2.Repository(str(self._mirror), RepositoryOpenFlag.NO_SEARCH)
            repo = self._repo
            # A fresh remote each time: a reused one answers its first listing again.
            remote = repo.remotes.create_anonymous(self._url)
            try:
                heads = {h.name: str(h.oid) for h in remote.list_heads(self._callbacks())}
            finally:
                del remote  # frees libgit2's remote, which closes the connection
            for name in refnames:
                ref = repo.references.get(name)
                if heads.get(name) != (str(ref.target) if ref is not None else None):
                    return True
            return False
        except (pygit2.GitError, OSError, KeyError) as e:
            key = self._callbacks().ssh_key
            raise _remote_error(f"cannot list the branches of {self._url}", e, key) from e


def check_ssh_key(path: Path) -> str:
    """The passphrase to unlock the SSH key at `path` ("" for an unencrypted
    key). Raises KeyFileError naming the file when it is missing or
    unreadable, or encrypted while ``RECONCILER_SSH_KEY_PASSPHRASE`` is unset."""
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        raise KeyFileError(
            f"SSH key {path} does not exist",
            f"pass the private key file with --ssh-key or {SSH_KEY_ENV}",
        ) from None
    except OSError as e:
        raise KeyFileError(f"cannot read SSH key {path}: {e}", "check the path and its mode") from e
    passphrase = os.environ.get(SSH_PASSPHRASE_ENV, "")
    if _is_encrypted(text) and not passphrase:
        raise KeyFileError(
            f"SSH key {path} is protected by a passphrase",
            f"set {SSH_PASSPHRASE_ENV}, or use an unencrypted key kept readable only by the "
            "daemon's user (reconciler keys generate writes one)",
        )
    return passphrase


def _is_encrypted(text: str) -> bool:
    """An OpenSSH key names its cipher ("none" when unencrypted); a PEM key says ENCRYPTED."""
    if "BEGIN OPENSSH PRIVATE KEY" not in text:
        return "Proc-Type: 4,ENCRYPTED" in text or "BEGIN ENCRYPTED PRIVATE KEY" in text
    body = "".join(line for line in text.splitlines() if line and not line.startswith("-----"))
    try:
        raw = base64.b64decode(body)
    except ValueError:
        return False
    magic = b"openssh-key-v1\0"
    if not raw.startswith(magic) or len(raw) < len(magic) + 4:
        return False
    size = int.from_bytes(raw[len(magic) : len(magic) + 4], "big")
    return raw[len(magic) + 4 : len(magic) + 4 + size] != b"none"


def _remote_error(what: str, error: BaseException, ssh_key: Path | None) -> StoreError:
    """A libgit2 failure to reach a remote, with what to check next."""
    if "authentication" in str(error).lower():
        key = f"the SSH key {ssh_key}" if ssh_key is not None else "the SSH agent's keys"
        return StoreError(
            f"{what}: the server refused {key} ({error})",
            "add the public key to the server's authorized keys for the URL's user, "
            f"or pass another key with --ssh-key / {SSH_KEY_ENV} ({TOKEN_ENV} for HTTPS)",
        )
    return StoreError(
        f"{what}: {error}",
        f"check the URL, the network and the credentials (--ssh-key / {SSH_KEY_ENV}, {TOKEN_ENV})",
    )


def _ssh_port(url: str) -> int:
    """The port of an ``ssh://`` URL (22 when absent, and for scp-like ``host:path``)."""
    if "://" not in url:
        return DEFAULT_PORT
    try:
        return urllib.parse.urlsplit(url).port or DEFAULT_PORT
    except ValueError:
        return DEFAULT_PORT


# libgit2's certificate kinds (git_cert_t) and its SSH host key record
# (git_cert_hostkey, libgit2 1.9). pygit2 hands the callback None for the
# certificate, so the record is read from pygit2's own callback frame.
_CERT_X509 = 1
_CERT_HOSTKEY = 2
_SSH_SHA256 = 1 << 2  # GIT_CERT_SSH_SHA256: hash_sha256 is set
_SSH_RAW = 1 << 3  # GIT_CERT_SSH_RAW: hostkey/hostkey_len are set
_CERT_FFI = cffi.FFI()
_CERT_FFI.cdef(
    """
    typedef struct { int cert_type; } git_cert;
    typedef struct {
        git_cert parent;
        int type;
        unsigned char hash_md5[16];
        unsigned char hash_sha1[20];
        unsigned char hash_sha256[32];
        int raw_type;
        const char *hostkey;
        size_t hostkey_len;
    } git_cert_hostkey;
    """
)


def _offered_certificate() -> tuple[int | None, HostKey | None]:
    """(certificate kind, SSH host key) of the connection being checked;
    (None, None) when they cannot be found, which the caller refuses."""
    frame = sys._getframe(1)
    for _ in range(4):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            return None, None
        if frame.f_code.co_name == "_certificate_check_cb" and "cert_i" in frame.f_locals:
            break
    else:
        return None, None
    address = int(pygit2_ffi.cast("uintptr_t", frame.f_locals["cert_i"]))
    if not address:
        return None, None
    cert = _CERT_FFI.cast("git_cert_hostkey *", address)
    kind = int(cert.parent.cert_type)
    if kind != _CERT_HOSTKEY:
        return kind, None
    if not (cert.type & _SSH_RAW) or not cert.hostkey or cert.hostkey_len == 0:
        return kind, None
    key = HostKey(bytes(_CERT_FFI.buffer(cert.hostkey, cert.hostkey_len)))
    # libgit2 hashed the key itself: a record read with the wrong layout fails here.
    if cert.type & _SSH_SHA256 and hashlib.sha256(key.blob).digest() != bytes(cert.hash_sha256):
        return kind, None
    return kind, key


def _transient_fetch_error(error: BaseException) -> bool:
    """A fetch that met another writer mid-push in a shared mirror or a local
    remote: its ref lock, or the short-lived ref its push lands on, listed and
    then deleted before it was read. Fetching again sees the settled state."""
    text = str(error)
    return ".lock" in text or (INCOMING_REF_PREFIX in text and "not found" in text)
