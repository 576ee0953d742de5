"""The daemon's own state directory: what must survive a restart and must
not be writable by anyone who can push to the repository.

Git holds every rollout's state; this directory holds only what protects
the daemon from the repository itself (the verified commit it last acted
on, so that a push cannot move it backwards) and what keeps it from
repeating itself to people (delivery ids already posted to a receiver).
Each repository and branch gets its own folder, so one directory can serve
several daemons.

Files are small and written atomically (the agent's durable write): a
crash leaves the old content or the new. Must not: hold anything a pass
decides from besides those records, or anything secret.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from reconciler.node.state_dir import write_atomic
from reconciler.spec.errors import ReconcilerError

STATE_MODE = 0o600
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class StateDirError(ReconcilerError):
    """The state directory cannot be made or written."""


def default_state_root(environ: dict[str, str] | os._Environ[str] | None = None) -> Path:
    """``$XDG_STATE_HOME/reconciler``, else ``~/.local/state/reconciler``."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "reconciler"


class DaemonState:
    """One repository and branch's folder in the state directory."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @classmethod
    def for_branch(cls, root: Path, repo: str, branch: str) -> DaemonState:
        """The folder for ``branch`` of ``repo`` (a path or URL) under ``root``:
        a readable stem and a digest, so two repositories never share one."""
        where = repo if "://" in repo or ":" in repo.split("/")[0] else str(Path(repo).resolve())
        digest = hashlib.sha256(f"{where}\0{branch}".encode()).hexdigest()[:16]
        stem = _UNSAFE.sub("-", Path(where.rstrip("/")).name or "repo")[:40]
        return cls(root / f"{stem}-{_UNSAFE.sub('-', branch)[:40]}-{digest}")

    @classmethod
    def of_daemon(
        cls, root: Path, repo: str, branch: str, upstreams: tuple[str, ...] = ()
    ) -> DaemonState:
        """The folder of the daemon that serves ``repo``, for the commands a
        person runs beside it (``verify``, ``attest``): ``repo``'s own when a
        daemon keeps one (it runs on ``repo``), else that of the first of
        ``upstreams`` (the repositories ``repo`` was cloned from) that has
        one, as when a person checks from a clone of the bare repository the
        daemon serves; ``repo``'s own when none has."""
        own = cls.for_branch(root, repo, branch)
        if own.exists():
            return own
        for upstream in upstreams:
            theirs = cls.for_branch(root, upstream, branch)
            if theirs.exists():
                return theirs
        return own

    def exists(self) -> bool:
        """Has a daemon kept anything here yet?"""
        return self.folder.is_dir()

    def read(self, name: str) -> str | None:
        """The text kept under ``name``, or None when there is none yet."""
        try:
            return (self.folder / name).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateDirError(
                f"cannot read {self.folder / name}: {exc.strerror}",
                "check that the state directory (run --state-dir) is readable by the daemon",
            ) from exc

    def write(self, name: str, text: str) -> None:
        """Keep ``text`` under ``name``, replacing what was there at once."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_atomic(self.folder / name, text.encode("utf-8"), STATE_MODE)
        except OSError as exc:
            raise StateDirError(
                f"cannot write {self.folder / name}: {exc.strerror}",
                "check that the state directory (run --state-dir) is writable by the daemon",
            ) from exc
