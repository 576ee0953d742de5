"""The verified commit the daemon last acted on, kept where no push can
change it: the daemon's own state directory (``daemon.state``).

Under verification the daemon never moves back to a verified commit that
does not descend from this one (docs/trust.md). Older versions kept it in
the ref ``refs/reconciler/acted/BRANCH`` of the repository, which anyone
who may push to a local bare repository can delete or move; that ref is
read once, to carry the position over on an upgrade, and never again.
Without a state directory (a ``Daemon`` built by a test) the ref stays
the record, as before.

The status commit it last acted on before it signed its status commits
is kept beside it (``UnsignedStatusPosition``), for the same reason: it
tells the daemon's own unsigned statuses from a later push.

Must not: judge commits (``git.approval`` does) or keep anything else.
"""

from __future__ import annotations

import re
from typing import Any

from reconciler.daemon.state import DaemonState
from reconciler.git.approval import last_acted, record_acted

ACTED_FILE = "acted-commit"
UNSIGNED_STATUS_FILE = "unsigned-status-commit"
_COMMIT = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


class ActedPosition:
    """Reads and records the last acted-on verified commit of one branch."""

    def __init__(self, repo: Any, branch: str, state: DaemonState | None) -> None:
        self.repo = repo
        self.branch = branch
        self.state = state
        self._known: str | None = None
        self._loaded = False

    def get(self) -> str | None:
        """The commit last acted on (None: none yet, as on a first start)."""
        if not self._loaded:
            self._known = self._load()
            self._loaded = True
        return self._known

    def record(self, commit: str) -> None:
        """Keep ``commit`` as the one last acted on (only when it moved)."""
        if self.get() == commit:
            return
        if self.state is None:
            record_acted(self.repo, self.branch, commit)
        else:
            self.state.write(ACTED_FILE, commit + "\n")
        self._known = commit

    def _load(self) -> str | None:
        if self.state is None:
            return last_acted(self.repo, self.branch)
        text = self.state.read(ACTED_FILE)
        if text is not None:
            kept = text.strip()
            return kept if _COMMIT.fullmatch(kept) else None
        # An upgrade: the old ref, trusted this once, moves into the state.
        old = last_acted(self.repo, self.branch)
        if old is not None:
            self.state.write(ACTED_FILE, old + "\n")
        return old


class UnsignedStatusPosition:
    """The status commit the daemon last acted on while it took statuses as
    committed (no signed status commits checked): what it read there, and
    what it wrote on top, are its own. Turning ``--sign-commits`` on later
    adopts the status files as they are at that commit instead of holding
    every status the daemon wrote unsigned (``git.status_writes``); anything
    pushed after it still needs a daemon signature. Without a state
    directory nothing is kept."""

    def __init__(self, state: DaemonState | None, *, recording: bool = True) -> None:
        self.state = state
        self.recording = recording  # false while statuses must carry a daemon signature
        self._known: str | None = None
        self._loaded = False

    def get(self) -> str | None:
        if not self._loaded:
            self._known = read_unsigned_status(self.state) if self.state is not None else None
            self._loaded = True
        return self._known

    def record(self, commit: str) -> None:
        """Keep ``commit`` (only when it moved, and only while recording)."""
        if self.state is None or not self.recording or self.get() == commit:
            return
        self.state.write(UNSIGNED_STATUS_FILE, commit + "\n")
        self._known = commit


def read_unsigned_status(state: DaemonState) -> str | None:
    """The status commit a daemon acted on last before it signed its status
    commits, as kept in ``state`` (for the reader, ``verify`` and
    ``attest``), or None."""
    text = state.read(UNSIGNED_STATUS_FILE)
    kept = text.strip() if text is not None else ""
    return kept if _COMMIT.fullmatch(kept) else None


def read_acted(state: DaemonState) -> str | None:
    """The position a daemon keeps in ``state`` (for ``verify``), or None."""
    text = state.read(ACTED_FILE)
    kept = text.strip() if text is not None else ""
    return kept if _COMMIT.fullmatch(kept) else None
