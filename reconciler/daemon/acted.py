"""The verified commit the daemon last acted on, kept where no push can
change it: the daemon's own state directory (``daemon.state``).

Under verification the daemon never moves back to a verified commit that
does not descend from this one (docs/trust.md). Older versions kept it in
the ref ``refs/reconciler/acted/BRANCH`` of the repository, which anyone
who may push to a local bare repository can delete or move; that ref is
read once, to carry the position over on an upgrade, and never again.
Without a state directory (a ``Daemon`` built by a test) the ref stays
the record, as before.

Must not: judge commits (``git.approval`` does) or keep anything else.
"""

from __future__ import annotations

import re
from typing import Any

from reconciler.daemon.state import DaemonState
from reconciler.git.approval import last_acted, record_acted

ACTED_FILE = "acted-commit"
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


def read_acted(state: DaemonState) -> str | None:
    """The position a daemon keeps in ``state`` (for ``verify``), or None."""
    text = state.read(ACTED_FILE)
    kept = text.strip() if text is not None else ""
    return kept if _COMMIT.fullmatch(kept) else None
