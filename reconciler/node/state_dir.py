"""A node agent's state directory: runtime configs, the job journal and the
config backups, all written so that a crash at any instant leaves every file
either as it was or as intended, never torn.

    STATE/runtimes/TYPE.yaml              a runtime's config (provider, model, profile, ...)
    STATE/jobs/JOBID.json                 one journal record per job id ever accepted
    STATE/backups/BACKUPID.data           the exact bytes a job replaced
    STATE/backups/BACKUPID.json           what they were (runtime, mode, job, rollout, ...)
    STATE/agent.lock                      held while an agent runs on this directory

Every write goes to a temporary file in the same directory, is fsynced,
renamed over the target, and the directory is fsynced: rename is atomic, so
readers see the old file or the new one. The temporary file has a fresh
random name and is created with ``O_EXCL|O_NOFOLLOW``, so a file or symlink
planted under that name is never followed, truncated or chmodded; a target
that is a symlink is refused (``UnsafePath``), since a rename would replace
the link, not the file it points to. A backup exists only while both its
``.json`` and its ``.data`` are there, so the two renames need no order
between them and share one directory fsync.

The backups folder is read once per agent run; from then on the agent's own
saves and prunes keep that list, so a job does not reread every backup's
description (twice) to number and prune its own.

Removals (pruned backups, compacted journal records) are not fsynced: one
lost to a crash brings back a file that is deleted again by the next prune
or compaction, and nothing depends on it being gone.

Must not: speak HTTP, verify signatures, or decide which job runs (that is
``agent``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, BinaryIO

from reconciler.spec.errors import ReconcilerError

CONFIG_MODE = 0o644  # for a config the agent creates; an existing file keeps its mode
_TEMP_MARK = ".tmp-"
# Records on one line: ``indent`` makes ``json`` encode in Python, call by
# call (about 800 calls a live apply); without it the C encoder does it.
_JOURNAL_JSON = json.JSONEncoder(ensure_ascii=False)
_BACKUP_JSON = json.JSONEncoder()


def digest(data: bytes | None) -> str | None:
    return None if data is None else "sha256:" + hashlib.sha256(data).hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class UnsafePath(ReconcilerError):
    """A state file the agent would write is a symbolic link."""


def refuse_symlink(path: Path) -> None:
    if path.is_symlink():
        raise UnsafePath(
            f"{path} is a symbolic link (to {os.readlink(path)}); the agent replaces "
            "its files by rename and does not write through links",
            f"make {path.name} a regular file (copy the linked file there), "
            "or point --state-dir at the real directory",
        )


def write_atomic(path: Path, data: bytes, mode: int = CONFIG_MODE) -> None:
    """Replace ``path`` with ``data`` (and ``mode``) so a crash leaves the old or the new file."""
    write_atomic_together(path.parent, [(path.name, data, mode)])


def write_atomic_together(directory: Path, files: Sequence[tuple[str, bytes, int]]) -> None:
    """Replace each named file of ``directory`` as ``write_atomic`` does, with
    one directory fsync for all the renames: for callers to whom the files'
    order after a crash does not matter (each file is old or new on its own)."""
    temps = []
    try:
        for name, data, mode in files:
            path = directory / name
            refuse_symlink(path)
            temps.append((_write_temp(path, data, mode), path))
    except BaseException:
        for temp, _ in temps:
            with contextlib.suppress(OSError):
                os.unlink(temp)
        raise
    for temp, path in temps:
        os.replace(temp, path)
    _fsync_dir(directory)


def _write_temp(path: Path, data: bytes, mode: int) -> Path:
    """A fsynced temporary file beside ``path`` holding ``data``."""
    temp = path.with_name(f".{path.name}{_TEMP_MARK}{os.getpid()}-{secrets.token_hex(6)}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o600)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fchmod(fd, stat.S_IMODE(mode))  # exact mode, whatever the umask
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    os.close(fd)
    return temp


def _fields(record: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, like ``asdict`` without its deep copy
    (of a job's payload): only serialised, never changed."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


def _remove(path: Path) -> None:
    refuse_symlink(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def remove_durably(path: Path) -> None:
    refuse_symlink(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    _fsync_dir(path.parent)


@dataclass(frozen=True)
class JobRecord:
    """What the agent knows about one job id. ``payload`` is the first payload
    accepted under it; ``before``/``after`` are the config digests of a live
    job, written before the config is touched, so a restart can tell which
    one the file holds."""

    job_id: str
    payload: dict[str, Any]
    state: str  # accepted | running | succeeded | failed
    accepted_at: str
    error: str | None = None
    backup_id: str | None = None
    finished_at: str | None = None
    detail: str = ""
    before: str | None = None
    after: str | None = None
    planned_backup: str | None = None

    def public(self) -> dict[str, Any]:
        """The record as ``GET /v1/nodes/{node}/jobs/{jobId}`` shows it."""
        return {
            "jobId": self.job_id,
            "state": self.state,
            "error": self.error,
            "backupId": self.backup_id,
            "finishedAt": self.finished_at,
            "sourceCommit": self.payload.get("sourceCommit"),
            "detail": self.detail,
        }

    def with_changes(self, **changes: Any) -> JobRecord:
        return replace(self, **changes)


@dataclass(frozen=True)
class BackupInfo:
    backup_id: str
    runtime: str
    created_at: str
    seq: int  # creation order on this node
    job_id: str
    rollout: str
    provider: str
    model: str
    profile: str
    mode: int  # the file mode the bytes had
    digest: str

    def public(self) -> dict[str, Any]:
        """The entry as ``GET /v1/nodes/{node}/backups`` shows it."""
        return {
            "backupId": self.backup_id,
            "runtime": self.runtime,
            "createdAt": self.created_at,
            "jobId": self.job_id,
            "rollout": self.rollout,
            "provider": self.provider,
            "model": self.model,
        }


class StateDir:
    """The files of one agent. Open it with ``StateDir.open``; one agent at a time."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runtimes = root / "runtimes"
        self.jobs = root / "jobs"
        self.backups = root / "backups"
        self._lock: BinaryIO | None = None
        # Backup id -> what it is: read from the folder once, then kept by this
        # object's own writes and removals (one agent owns the folder: agent.lock).
        self._backup_index: dict[str, BackupInfo] | None = None

    @classmethod
    def open(cls, root: Path) -> StateDir:
        state = cls(Path(root).absolute())
        try:
            for directory in (state.root, state.runtimes, state.jobs, state.backups):
                directory.mkdir(parents=True, exist_ok=True)
            lock = open(state.root / "agent.lock", "wb")  # noqa: SIM115 - held while running
        except OSError as exc:
            raise ReconcilerError(
                f"cannot use state directory {root}: {exc.strerror}",
                "pass a writable --state-dir",
            ) from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise ReconcilerError(
                f"another agent is running on {root}",
                "stop it first, or give this agent its own --state-dir",
            ) from None
        state._lock = lock
        state._remove_temporaries()
        return state

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None

    def _remove_temporaries(self) -> None:
        # Left by a crash between creating a temporary file and renaming it.
        for directory in (self.runtimes, self.jobs, self.backups):
            for path in directory.iterdir():
                if path.name.startswith(".") and _TEMP_MARK in path.name:
                    path.unlink()

    # -- runtime configs ---------------------------------------------------------

    def config_path(self, runtime: str) -> Path:
        return self.runtimes / f"{runtime}.yaml"

    def read_config(self, runtime: str) -> tuple[bytes, int] | None:
        """The config's bytes and mode, or None when the runtime has no config."""
        path = self.config_path(runtime)
        try:
            with open(path, "rb") as handle:
                return handle.read(), stat.S_IMODE(os.fstat(handle.fileno()).st_mode)
        except FileNotFoundError:
            return None

    def write_config(self, runtime: str, data: bytes | None, mode: int = CONFIG_MODE) -> None:
        """Put ``data`` in place atomically; None removes the config."""
        if data is None:
            remove_durably(self.config_path(runtime))
        else:
            write_atomic(self.config_path(runtime), data, mode)

    def runtime_names(self) -> list[str]:
        return sorted(p.stem for p in self.runtimes.glob("*.yaml") if not p.name.startswith("."))

    # -- the journal -------------------------------------------------------------

    def _job_path(self, job_id: str) -> Path:
        return self.jobs / f"{job_id}.json"

    def save_job(self, record: JobRecord) -> None:
        """Durably: on return the record survives a crash (fsync)."""
        data = _JOURNAL_JSON.encode(_fields(record)).encode("utf-8")
        write_atomic(self._job_path(record.job_id), data, 0o600)

    def delete_job(self, job_id: str) -> None:
        # No fsync: only compaction deletes, and only finished records past their
        # payload's expiry; one a crash brings back is compacted again, and
        # admission refuses its payload as expired meanwhile.
        _remove(self._job_path(job_id))

    def load_jobs(self) -> dict[str, JobRecord]:
        records: dict[str, JobRecord] = {}
        for path in sorted(self.jobs.glob("*.json")):
            if path.name.startswith("."):
                continue
            try:
                record = JobRecord(**json.loads(path.read_bytes()))
            except (ValueError, TypeError) as exc:
                raise ReconcilerError(
                    f"journal record {path} cannot be read: {exc}",
                    "it was not written by this agent version; move it away to start",
                ) from None
            records[record.job_id] = record
        return records

    # -- backups -----------------------------------------------------------------

    def _backup_paths(self, backup_id: str) -> tuple[Path, Path]:
        return self.backups / f"{backup_id}.data", self.backups / f"{backup_id}.json"

    def list_backups(self) -> list[BackupInfo]:
        """Every complete backup, newest first."""
        return sorted(self._backups().values(), key=lambda b: b.seq, reverse=True)

    def _backups(self) -> dict[str, BackupInfo]:
        if self._backup_index is None:
            self._backup_index = {b.backup_id: b for b in self._scan_backups()}
        return self._backup_index

    def _scan_backups(self) -> list[BackupInfo]:
        found = []
        for path in self.backups.glob("*.json"):
            if path.name.startswith(".") or not path.with_suffix(".data").exists():
                continue  # without its bytes a backup does not exist (module docstring)
            try:
                found.append(BackupInfo(**json.loads(path.read_bytes())))
            except (ValueError, TypeError):
                continue  # not ours; never served, never deleted
        return found

    def find_backup(self, backup_id: str) -> BackupInfo | None:
        info = self._backups().get(backup_id)
        if info is not None and not all(p.exists() for p in self._backup_paths(backup_id)):
            # Removed by hand while the agent ran: it is gone for good.
            del self._backups()[backup_id]
            return None
        return info

    def read_backup(self, info: BackupInfo) -> bytes:
        return self._backup_paths(info.backup_id)[0].read_bytes()

    def next_seq(self) -> int:
        return max((b.seq for b in self._backups().values()), default=0) + 1

    def save_backup(self, info: BackupInfo, data: bytes) -> None:
        """Durably: on return both files survive a crash, so the config may be replaced."""
        data_path, info_path = self._backup_paths(info.backup_id)
        description = _BACKUP_JSON.encode(_fields(info)).encode("utf-8")
        # One directory fsync for both: a crash that keeps one rename and loses
        # the other leaves no backup, since one needs both files to be listed.
        write_atomic_together(
            self.backups, [(data_path.name, data, 0o600), (info_path.name, description, 0o600)]
        )
        self._backups()[info.backup_id] = info

    def delete_backup(self, backup_id: str) -> None:
        data_path, info_path = self._backup_paths(backup_id)
        # Not fsynced (module docstring): a prune lost to a crash is done again
        # by the next one. Either file alone is no backup.
        _remove(info_path)
        _remove(data_path)
        self._backups().pop(backup_id, None)


def backups_to_prune(
    backups: Iterable[BackupInfo],
    retention: int,
    pinned: Iterable[str] = (),
    finished_rollouts: Iterable[str] = (),
) -> list[str]:
    """Backup ids to delete: per runtime, everything past the newest
    ``retention``, except pinned ones and the first backup each rollout took
    on this node (the one the daemon restores: its ``firstBackupId``) while
    that rollout is not in ``finished_rollouts``."""
    ordered = sorted(backups, key=lambda b: b.seq)
    keep = set(pinned)
    finished = set(finished_rollouts)
    first_of_rollout: dict[tuple[str, str], str] = {}
    for backup in ordered:
        first_of_rollout.setdefault((backup.runtime, backup.rollout), backup.backup_id)
    keep.update(b for (_, rollout), b in first_of_rollout.items() if rollout not in finished)
    doomed: list[str] = []
    by_runtime: dict[str, list[BackupInfo]] = {}
    for backup in reversed(ordered):  # newest first
        by_runtime.setdefault(backup.runtime, []).append(backup)
    for newest_first in by_runtime.values():
        doomed.extend(b.backup_id for b in newest_first[retention:] if b.backup_id not in keep)
    return doomed
