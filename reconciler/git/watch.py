"""Wake the daemon when the tracked branch may have changed.

A local repository is watched with inotify (Linux), non-recursively, on just
the folders that hold the watched ref files: ``refs/heads/`` (or wherever
each branch's file lives) and the repository folder for ``packed-refs``.
Git and libgit2 write ``NAME.lock`` and rename it (or, for a new ref,
libgit2 hard-links it) into place, so the rename or creation (or a close
after writing, for a file written in place, or its removal) of a wanted
name is the hint, sent at once: no debounce, no timer. The
watching thread sleeps in ``poll`` on the inotify descriptor and a stop
pipe, so an idle daemon costs no CPU. A ref whose folder does not exist yet
(``refs/notes/`` before the first approval) is watched through its nearest
existing ancestor; the folder's creation moves the watch down to it and is a
hint itself, since the ref may have been written before the new folder was
watched. A watched folder that goes away (``git pack-refs`` prunes empty
ones) moves the watch back up. The binding is ``inotify_simple`` (one small
ctypes module). Where inotify cannot be had (not Linux, no more inotify
instances or watches allowed) the ref files' stat is looked at every
``STAT_POLL`` seconds instead.

A remote is polled: every ``poll`` seconds the remote's branch tip is listed
(``git ls-remote``, no fetch) and compared with the mirror's copy, so the
daemon's own fetches stay the only writes to the mirror. A failed poll is an
event (``poll_failed``, counted in ``reconciler_poll_failures``) and the
next one waits longer, up to ``POLL_BACKOFF_CAP``; the first poll that works
again is a hint, so a daemon backing off after a failed pass tries again at
once.

Both are hints: file events can be missed (a polling watch misses changes
less than a second apart), so the caller keeps a periodic full re-read. ``wait`` is for a synchronous loop; ``stop`` may be
called from a signal handler or another thread: it only sets a flag and
writes a byte to two pipes, never takes a lock.

This module must not read documents or decide anything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from reconciler.git.store import GitStore, RemotePoller
from reconciler.spec.errors import ReconcilerError

try:  # Linux only; elsewhere the ref files' stat is looked at instead
    from inotify_simple import INotify
except (ImportError, OSError):  # pragma: no cover - not Linux
    INotify = None

log = logging.getLogger(__name__)


class PollEvents(Protocol):
    """Where poll failures and recoveries are reported: the daemon's event
    log (passed in; ``git`` does not import the daemon)."""

    def info(self, event: str, message: str = "", **fields: Any) -> None: ...

    def warning(self, event: str, message: str = "", **fields: Any) -> None: ...


class PollMetrics(Protocol):
    """What counts failed polls: the daemon's metrics (passed in)."""

    poll_failures: Any


class _LoggedEvents:
    """Poll events through ``logging`` when no event log is passed in."""

    def info(self, event: str, message: str = "", **fields: Any) -> None:
        log.info("%s: %s", event, message)

    def warning(self, event: str, message: str = "", **fields: Any) -> None:
        log.warning("%s: %s", event, message)


STAT_POLL = 0.1  # seconds between looks at the ref files when events cannot be had
POLL_BACKOFF_CAP = 30.0  # seconds: the longest wait after failed polls (or the poll, if longer)
_WAKE = b"c"
_STOP = b"s"

# inotify event bits (inotify.h), named here so reading them needs no lookup.
_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_FROM = 0x00000040
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE = 0x00000200
_IN_DELETE_SELF = 0x00000400
_IN_MOVE_SELF = 0x00000800
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_ONLYDIR = 0x01000000
# A ref file is reported when renamed into place (Git's lock files),
# created (libgit2 hard-links a new ref's lock file into place), closed after
# writing (written in place) or removed.
_FILE_EVENTS = _IN_MOVED_TO | _IN_CREATE | _IN_CLOSE_WRITE | _IN_DELETE | _IN_MOVED_FROM
# A folder on the way to a ref that does not exist yet: created, or removed
# again, it moves the watch.
_FOLDER_EVENTS = _IN_CREATE | _IN_MOVED_TO | _IN_DELETE | _IN_MOVED_FROM
# The watched folder itself gone (removed, renamed) or the queue overflowed:
# watch again from scratch.
_GONE_EVENTS = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED | _IN_Q_OVERFLOW
_MASK = _FILE_EVENTS | _FOLDER_EVENTS | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR


class _Flag:
    """A lock-free stop flag: set from a signal handler, read by threads."""

    def __init__(self) -> None:
        self.value = False


class _RefFolders:
    """inotify watches on the folders holding `files` (paths under `root`):
    each file's own folder, or, while that does not exist, its nearest
    existing ancestor, watched for the next folder on the way.

    Raises OSError when inotify cannot be set up (no more instances or
    watches allowed); RuntimeError when inotify does not exist here."""

    def __init__(self, root: Path, files: Sequence[Path]) -> None:
        if INotify is None:  # pragma: no cover - not Linux
            raise RuntimeError("inotify is not available on this system")
        self.root = root
        self.files = list(files)
        self.inotify = INotify(nonblocking=True)
        # watch descriptor -> (folder, the file names wanted in it, the
        # folder names on the way to a wanted file that does not exist yet)
        self.watches: dict[int, tuple[Path, frozenset[str], frozenset[str]]] = {}
        try:
            self.arm()
        except BaseException:
            self.inotify.close()
            raise

    def fileno(self) -> int:
        return int(self.inotify.fileno())

    def arm(self) -> None:
        """Watch, for every file, the deepest folder of its path that exists
        now; drop watches no longer needed. A folder that vanishes meanwhile
        is planned again (its parent is then the deepest)."""
        for attempt in range(5):
            try:
                self._arm_once()
                return
            except (FileNotFoundError, NotADirectoryError):
                if attempt == 4:
                    raise

    def _arm_once(self) -> None:
        plan: dict[Path, tuple[set[str], set[str]]] = {}
        for path in self.files:
            folder, name, is_file = path.parent, path.name, True
            while folder != self.root and not folder.is_dir():
                folder, name, is_file = folder.parent, folder.name, False
            names = plan.setdefault(folder, (set(), set()))
            names[0 if is_file else 1].add(name)
        watches: dict[int, tuple[Path, frozenset[str], frozenset[str]]] = {}
        for folder, (files, folders) in plan.items():
            wd = int(self.inotify.add_watch(folder, _MASK))
            watches[wd] = (folder, frozenset(files), frozenset(folders))
        for wd in self.watches.keys() - watches.keys():
            with contextlib.suppress(OSError):  # gone with its folder already
                self.inotify.rm_watch(wd)
        self.watches = watches

    def changes(self) -> bool:
        """Read the queued events: True if a wanted file (or a folder on the
        way to one) changed. Watches moved where needed first."""
        changed = rearm = False
        for event in self.inotify.read(timeout=0):
            if event.mask & _IN_Q_OVERFLOW:
                rearm = True  # events were lost: anything may have changed
                continue
            watched = self.watches.get(event.wd)
            if watched is None:
                continue  # a watch dropped by ``arm``
            _, files, folders = watched
            if event.mask & _GONE_EVENTS:
                rearm = True
            elif event.name in files and event.mask & _FILE_EVENTS:
                changed = True
            elif event.name in folders and event.mask & _FOLDER_EVENTS:
                rearm = True
        if rearm:
            # Watch first, then hint: whatever was written before the new
            # watch is read by the pass the hint starts, anything after it
            # is an event of its own.
            self.arm()
        return changed or rearm

    def close(self) -> None:
        self.inotify.close()


class BranchWatcher:
    """Change hints for one repository's branches.

    ``wait(timeout)`` returns True as soon as a hint arrived (hints that
    arrived since the previous ``wait`` count), False on timeout or after
    ``stop()``. Use as a context manager, or call ``close()`` at the end."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        os.set_blocking(self._read_fd, False)
        # The watching thread's own wake-up on stop (the pipe above is the
        # caller's: both must see a stop).
        self._halt_read_fd, self._halt_write_fd = os.pipe()
        os.set_blocking(self._halt_write_fd, False)
        self._stop = _Flag()
        self._threads: list[threading.Thread] = []
        self.hints = 0  # how many hints were sent (for tests and metrics)
        # refname -> the commit the caller last acted on there (``acted_on``);
        # replaced whole, never changed in place, so the watching thread reads
        # it without a lock.
        self._acted: dict[str, str] = {}
        self._ref_files: dict[str, Path] = {}  # refname -> its loose ref file (local only)

    # -- construction ------------------------------------------------------

    @classmethod
    def for_store(
        cls,
        store: GitStore,
        branches: Sequence[str] | None = None,
        *,
        poll: float = 15.0,
        log: PollEvents | None = None,
        metrics: PollMetrics | None = None,
    ) -> BranchWatcher:
        """Watch `branches` (default: the store's tracked branch): file events
        for a local repository, a poll every `poll` seconds for a remote
        (failed polls reported to `log` and counted in `metrics`)."""
        names = list(branches) if branches else [store.branch]
        gitdir = Path(store.repository().path)
        if store.is_remote:
            assert store.url is not None
            return cls.polling(
                store.poller(), store.url, names, poll=poll, log=log, metrics=metrics
            )
        return cls.local(gitdir, names)

    @classmethod
    def local(cls, gitdir: Path, branches: Sequence[str]) -> BranchWatcher:
        """Watch the ref files of `branches` in the Git directory `gitdir`
        (a bare repository, or the ``.git`` of a non-bare one)."""
        self = cls()
        root = Path(os.path.realpath(gitdir))
        self._ref_files = {_refname(b): root / _refname(b) for b in branches}
        files = [root / "packed-refs", *self._ref_files.values()]
        # Watched here, before returning: a push right after start is seen.
        try:
            folders = _RefFolders(root, files)
        except (OSError, RuntimeError, AttributeError) as e:  # no inotify here
            log.warning(
                "watching %s with inotify failed (%s): looking at the ref files every %ss",
                root,
                e,
                STAT_POLL,
            )
            t = threading.Thread(
                target=self._run_stat_poll,
                args=(_stat_paths(root, files),),
                name="branch-watch",
                daemon=True,
            )
        else:
            t = threading.Thread(
                target=self._run_local,
                args=(folders, _stat_paths(root, files)),
                name="branch-watch",
                daemon=True,
            )
        self._threads.append(t)
        t.start()
        return self

    @classmethod
    def polling(
        cls,
        poller: RemotePoller,
        url: str,
        branches: Sequence[str],
        *,
        poll: float,
        log: PollEvents | None = None,
        metrics: PollMetrics | None = None,
    ) -> BranchWatcher:
        """Every `poll` seconds, compare the remote's tips of `branches` with
        the mirror's copies; any difference is a hint."""
        self = cls()
        t = threading.Thread(
            target=self._run_poll,
            args=(
                poller,
                url,
                [_refname(b) for b in branches],
                poll,
                log or _LoggedEvents(),
                metrics,
            ),
            name="branch-poll",
            daemon=True,
        )
        self._threads.append(t)
        t.start()
        return self

    # -- the caller's side -------------------------------------------------

    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds for a change hint. True if one came."""
        if self._stop.value or self._read_fd < 0:
            return False
        try:
            ready, _, _ = select.select([self._read_fd], [], [], max(0.0, timeout))
        except InterruptedError:  # pragma: no cover - PEP 475 retries select
            return False
        if not ready:
            return False
        try:
            data = os.read(self._read_fd, 4096)
        except (BlockingIOError, OSError):
            return False
        return _WAKE in data and not self._stop.value

    def wake(self) -> None:
        """A hint from outside the watch (a finished fleet sweep): the next
        or pending ``wait`` returns True. Safe from any thread."""
        self._send(_WAKE)

    def acted_on(self, branch: str, commit: str | None) -> None:
        """The caller has acted on ``commit`` at the tip of ``branch`` (its
        own status commit, say): a change of the ref files that leaves every
        watched branch where the caller acted on it is no hint (local
        repositories only). Any other value, a ref not named here or a ref
        that cannot be read is still a hint."""
        refname = _refname(branch)
        acted = {k: v for k, v in self._acted.items() if k != refname}
        if commit is not None:
            acted[refname] = commit
        self._acted = acted

    def _acted_on_all(self) -> bool:
        acted = self._acted
        files = self._ref_files
        if not files:
            return False
        for refname, path in files.items():
            try:
                value = path.read_text(encoding="ascii").strip()
            except (OSError, UnicodeDecodeError):
                return False  # packed, moving or gone: let the pass look
            if acted.get(refname) != value:
                return False
        return True

    def stop(self) -> None:
        """End watching; a pending or later ``wait`` returns False at once.
        Safe from a signal handler and from any thread."""
        self._stop.value = True
        self._send(_STOP)
        fd = self._halt_write_fd
        if fd >= 0:
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(fd, _STOP)

    @property
    def stopped(self) -> bool:
        return self._stop.value

    def close(self, timeout: float = 2.0) -> None:
        """Stop and wait for the watching threads; release the pipe."""
        self.stop()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)
        # Mark the pipe closed before closing it: a late stop() from a signal
        # handler must not write into a descriptor number reused meanwhile.
        fds = (self._read_fd, self._write_fd, self._halt_read_fd, self._halt_write_fd)
        self._read_fd = self._write_fd = self._halt_read_fd = self._halt_write_fd = -1
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def __enter__(self) -> BranchWatcher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- producers ---------------------------------------------------------

    def _send(self, byte: bytes) -> None:
        fd = self._write_fd
        if fd >= 0:
            with contextlib.suppress(BlockingIOError, OSError):
                # A full pipe already holds a pending wake-up.
                os.write(fd, byte)

    def _hint(self) -> None:
        self.hints += 1
        self._send(_WAKE)

    def _run_local(self, folders: _RefFolders, stat_paths: set[str]) -> None:
        try:
            poller = select.poll()
            poller.register(folders.fileno(), select.POLLIN)
            poller.register(self._halt_read_fd, select.POLLIN)
            while not self._stop.value:
                poller.poll()  # no timeout: an idle watch never wakes
                if self._stop.value:
                    break
                if not folders.changes():
                    continue
                if self._acted_on_all():
                    continue  # the caller's own commit: nothing it has not seen
                self._hint()
        except OSError as e:
            # No more watches for a new folder, say: keep watching by stat.
            if not self._stop.value:
                log.warning(
                    "watching refs failed (%s): looking at the ref files every %ss", e, STAT_POLL
                )
                folders.close()
                self._hint()  # what happened meanwhile is unknown
                self._run_stat_poll(stat_paths)
        except Exception:  # pragma: no cover - the periodic re-read covers us
            log.exception("watching refs failed; falling back to periodic re-reads")
        finally:
            folders.close()

    def _run_stat_poll(self, wanted: set[str]) -> None:
        """The fallback when file events cannot be had: look at the ref
        files every ``STAT_POLL`` seconds."""
        seen = {path: _stat(path) for path in wanted}
        while not self._sleep(STAT_POLL):
            now = {path: _stat(path) for path in wanted}
            if now != seen:
                seen = now
                self._hint()

    def _run_poll(
        self,
        poller: RemotePoller,
        url: str,
        refnames: list[str],
        poll: float,
        events: PollEvents,
        metrics: PollMetrics | None,
    ) -> None:
        failures = 0
        while not self._stop.value:
            wait = poll
            try:
                differs = poller.differs(refnames)
            except Exception as e:  # a hint source only: report, back off, poll again
                failures += 1
                wait = min(poll * 2 ** (failures - 1), max(poll, POLL_BACKOFF_CAP))
                if metrics is not None:
                    metrics.poll_failures.inc()
                # A store error names the URL already; anything else gets it here.
                text = str(e) if isinstance(e, ReconcilerError) else f"polling {url} failed: {e!r}"
                events.warning(
                    "poll_failed",
                    text,
                    failures=failures,
                    retry_in=f"{wait:.0f}s",
                )
            else:
                if failures:
                    events.info("poll_recovered", f"polling {url} works again", failures=failures)
                if differs or failures:
                    # Back after failures: the daemon may be backing off; wake it.
                    self._hint()
                failures = 0
            # Sleep on the pipe so stop() ends the sleep at once.
            if self._sleep(wait):
                break

    def _sleep(self, seconds: float) -> bool:
        """Sleep up to `seconds` on the stop pipe, so a stop ends it at once
        and an idle poll does not wake in between; True if stopped."""
        fd = self._halt_read_fd
        if not self._stop.value and fd >= 0:
            with contextlib.suppress(OSError, ValueError):  # closed under us: stopped
                select.select([fd], [], [], max(seconds, 0.0))
        return self._stop.value


def _stat_paths(root: Path, files: Sequence[Path]) -> set[str]:
    """What the stat fallback looks at: the files, and the folders on their
    way that do not exist yet (a folder's creation is a change)."""
    paths = {str(f) for f in files}
    for f in files:
        for folder in f.parents:
            if folder == root:
                break
            if not folder.exists():
                paths.add(str(folder))
    return paths


def _stat(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _refname(branch: str) -> str:
    return branch if branch.startswith("refs/") else f"refs/heads/{branch}"
