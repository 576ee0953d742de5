"""Wake the daemon when the tracked branch may have changed.

A local repository is watched with watchfiles on its ``refs/`` and
``packed-refs`` (the default watchfiles filter ignores ``.git``, so a filter
of our own picks out exactly the watched branches' ref files); a push into a
bare repository wakes a waiting daemon in about 20 ms. A remote is polled:
every ``poll`` seconds the remote's branch tip is listed (``git ls-remote``,
no fetch) and compared with the mirror's copy, so the daemon's own fetches
stay the only writes to the mirror. A failed poll is an event (``poll_failed``,
counted in ``reconciler_poll_failures``) and the next one waits longer, up
to ``POLL_BACKOFF_CAP``; the first poll that works again is a hint, so a
daemon backing off after a failed pass tries again at once.

Both are hints: events can be missed (FACTS.md), so the caller keeps a
periodic full re-read. ``wait`` is for a synchronous loop; ``stop`` may be
called from a signal handler or another thread: it only sets a flag and
writes a byte to a pipe, never takes a lock.

This module must not read documents or decide anything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from watchfiles._rust_notify import RustNotify

from reconciler.git.store import GitStore, RemotePoller
from reconciler.spec.errors import ReconcilerError

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


# How long the watch waits for quiet after a change before it reports it;
# also how often its loop wakes while idle. FACTS.md: 75-90 ms of latency
# at watchfiles' default 50. At 4 against 10, push to first job 33 against
# 45-48 ms median, for an idle daemon's CPU 0.8 against 0.4 % of a core.
STEP_MS = 4
DEBOUNCE_MS = 200
STAT_POLL = 0.1  # seconds between looks at the ref files when events cannot be had
FOLDER_SETTLE = 0.5  # seconds after a watched folder appears before hinting again
POLL_BACKOFF_CAP = 30.0  # seconds: the longest wait after failed polls (or the poll, if longer)
_WAKE = b"c"
_STOP = b"s"


class _Flag:
    """A lock-free stop flag with the ``is_set`` watchfiles polls each step."""

    def __init__(self) -> None:
        self.value = False

    def is_set(self) -> bool:
        return self.value


class BranchWatcher:
    """Change hints for one repository's branches.

    ``wait(timeout)`` returns True as soon as a hint arrived (hints that
    arrived since the previous ``wait`` count), False on timeout or after
    ``stop()``. Use as a context manager, or call ``close()`` at the end."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        os.set_blocking(self._read_fd, False)
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
        wanted = {str(root / "packed-refs")}
        wanted.update(str(root / _refname(b)) for b in branches)
        # A ref whose folder does not exist yet (``refs/notes/`` before the
        # first approval): the folder's creation is the hint (twice, see
        # ``_run_local``), since the ref file may be written inside before
        # the new folder is watched.
        folders: set[str] = set()
        for b in branches:
            for folder in (root / _refname(b)).parents:
                if folder == root:
                    break
                if not folder.exists():
                    folders.add(str(folder))
        wanted |= folders
        # Registered here, before returning: a push right after start is seen.
        notify = _notify(root)
        if notify is None:
            t = threading.Thread(
                target=self._run_stat_poll, args=(wanted,), name="branch-watch", daemon=True
            )
        else:
            t = threading.Thread(
                target=self._run_local,
                args=(notify, wanted, folders),
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
        fds = (self._read_fd, self._write_fd)
        self._read_fd = self._write_fd = -1
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

    def _run_local(
        self, notify: RustNotify, wanted: set[str], folders: frozenset[str] | set[str] = frozenset()
    ) -> None:
        try:
            while not self._stop.value:
                changes = notify.watch(DEBOUNCE_MS, STEP_MS, 1000, self._stop)
                if changes == "stop":
                    break
                if isinstance(changes, set) and any(path in wanted for _, path in changes):
                    if self._acted_on_all():
                        continue  # the caller's own commit: nothing it has not seen
                    self._hint()
                    if any(path in folders for _, path in changes):
                        # The ref written into a folder just created may
                        # have been missed: hint again once it surely is.
                        self._sleep(FOLDER_SETTLE)
                        self._hint()
        except Exception:  # pragma: no cover - the periodic re-read covers us
            log.exception("watching refs failed; falling back to periodic re-reads")
        finally:
            notify.close()

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
        """Sleep up to `seconds` in short steps; True if stopped meanwhile."""
        deadline = time.monotonic() + seconds
        while not self._stop.value and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(0.05, left))
        return self._stop.value


def _notify(root: Path) -> RustNotify | None:
    """A recursive watch on the Git directory, or None when it cannot be set
    up. Setting it up walks the tree, and a push's temporary object folder
    can vanish mid-walk (FileNotFoundError): that is retried; a watch that
    still cannot be had falls back to looking at the ref files' stat."""
    for attempt in range(5):
        try:
            return RustNotify([str(root)], False, False, 300, True, False)
        except OSError as e:
            log.warning("watching %s failed (%s), attempt %d", root, e, attempt + 1)
            time.sleep(0.02 * (attempt + 1))
    log.warning("watching %s: falling back to looking at the ref files every %ss", root, STAT_POLL)
    return None


def _stat(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _refname(branch: str) -> str:
    return branch if branch.startswith("refs/") else f"refs/heads/{branch}"
