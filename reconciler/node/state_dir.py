"""A node agent's state directory: runtime configs, the job journal and the
config backups, all written so that a crash at any instant leaves every file
either as it was or as intended, never torn.

    STATE/runtimes/TYPE.yaml              a runtime's config (provider, model, profile, ...)
    STATE/runtimes/TYPE.SLOT.yaml         with slots (warm standby): slot a's or b's config
    STATE/slots/TYPE.json                 with slots: which slot serves, which is kept warm
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

Each of the three folders is opened once, when the agent opens the state
directory, and its files are named relative to that descriptor (``dir_fd``),
which is also what its renames are fsynced through: a live apply walks no
long absolute path and opens no directory. The folder the agent writes is
therefore the one it opened, the one its journal and backup list were read
from: a folder renamed away while it runs keeps receiving its files (nothing
is split between two folders), and one removed makes every write fail with
"No such file or directory", as a path lookup would. Errors name the full
path, as they did when files were named by path.

Removals (pruned backups, compacted journal records) are not fsynced: one
lost to a crash brings back a file that is deleted again by the next prune
or compaction, and nothing depends on it being gone.

Must not: speak HTTP, verify signatures, or decide which job runs (that is
``agent``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import stat
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO

from reconciler.node.agent_config import SLOT_NAMES
from reconciler.protocol.job_view import JobPayload, read_job
from reconciler.spec.errors import ReconcilerError

CONFIG_MODE = 0o644  # for a config the agent creates; an existing file keeps its mode
_TEMP_MARK = ".tmp-"
# Records on one line: ``indent`` makes ``json`` encode in Python, call by
# call (about 800 calls a live apply); without it the C encoder does it.
_JOURNAL_JSON = json.JSONEncoder(ensure_ascii=False)
_BACKUP_JSON = json.JSONEncoder()


def digest(data: bytes | None) -> str | None:
    return None if data is None else "sha256:" + hashlib.sha256(data).hexdigest()


class UnsafePath(ReconcilerError):
    """A state file the agent would write is a symbolic link."""


# What ``Path.is_symlink`` and ``Path.exists`` take for "no such file" (pathlib's
# ``_IGNORED_ERRNOS``): these answer False, any other error is raised.
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)


def _refuse_symlink(shown: str, name: str, dir_fd: int) -> None:
    """``UnsafePath`` when ``name`` in the folder ``dir_fd`` (the file
    ``shown``, by its full path) is a symbolic link."""
    try:
        mode = os.lstat(name, dir_fd=dir_fd).st_mode
    except OSError as exc:
        if exc.errno in _ABSENT:
            return
        raise
    if stat.S_ISLNK(mode):
        raise UnsafePath(
            f"{shown} is a symbolic link (to {os.readlink(name, dir_fd=dir_fd)}); the agent "
            "replaces its files by rename and does not write through links",
            f"make {name} a regular file (copy the linked file there), "
            "or point --state-dir at the real directory",
        )


def write_atomic(path: Path, data: bytes, mode: int = CONFIG_MODE) -> None:
    """Replace ``path`` with ``data`` (and ``mode``) so a crash leaves the old or the new file."""
    folder = _Folder(path.parent)
    try:
        folder.write(path.name, data, mode)
    finally:
        folder.close()


_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _fields(record: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, like ``asdict`` without its deep copy
    (of a job's payload): only serialised, never changed."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


class _Folder:
    """One directory of the state, opened once (module docstring): its files
    are named relative to its descriptor, and renames in it are fsynced
    through that descriptor. Opened on first use; closed by ``close``, or
    when the object is collected."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._prefix = os.path.join(path, "")  # str(path / name) is prefix + name
        self._fd: int | None = None
        self._closer: weakref.finalize | None = None

    def fd(self) -> int:
        if self._fd is None:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._fd = fd
            self._closer = weakref.finalize(self, os.close, fd)
        return self._fd

    def close(self) -> None:
        if self._closer is not None:
            self._closer()
        self._fd = self._closer = None

    def shown(self, name: str) -> str:
        return self._prefix + name

    def _named(self, exc: OSError) -> None:
        """Make ``exc`` name the full path, as when files were named by path."""
        if isinstance(exc.filename, str) and not os.path.isabs(exc.filename):
            exc.filename = self._prefix + exc.filename
        if isinstance(exc.filename2, str) and not os.path.isabs(exc.filename2):
            exc.filename2 = self._prefix + exc.filename2

    def refuse_symlink(self, name: str) -> None:
        try:
            _refuse_symlink(self._prefix + name, name, self.fd())
        except OSError as exc:
            self._named(exc)
            raise

    def exists(self, name: str) -> bool:
        """``Path.exists``: follows links; False for a name that cannot be there."""
        try:
            os.stat(name, dir_fd=self.fd())
        except OSError as exc:
            if exc.errno in _ABSENT:
                return False
            raise
        return True

    def read(self, name: str) -> tuple[bytes, int] | None:
        """The file's bytes and mode (following links, as ``open`` does), or
        None when there is no such file."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.fd())
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._named(exc)
            raise
        try:
            status = os.fstat(fd)
            if stat.S_ISDIR(status.st_mode):  # what ``open`` says of a folder
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), name)
            chunks = []
            while chunk := os.read(fd, max(status.st_size, 0) + 1):
                chunks.append(chunk)
        except OSError as exc:
            self._named(exc)
            raise
        finally:
            os.close(fd)
        return b"".join(chunks), stat.S_IMODE(status.st_mode)

    def write(self, name: str, data: bytes, mode: int) -> None:
        self.write_together([(name, data, mode)])

    def write_together(self, files: Sequence[tuple[str, bytes, int]]) -> None:
        """Replace each named file as ``write_atomic`` does, with one folder
        fsync for all the renames: for callers to whom the files' order after
        a crash does not matter (each file is old or new on its own)."""
        fd = self.fd()
        temps = []
        try:
            for name, data, mode in files:
                _refuse_symlink(self._prefix + name, name, fd)
                temps.append((self._write_temp(name, data, mode), name))
        except BaseException as exc:
            for temp, _ in temps:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=fd)
            if isinstance(exc, OSError):
                self._named(exc)
            raise
        try:
            for temp, name in temps:
                os.replace(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
            os.fsync(fd)
        except OSError as exc:
            self._named(exc)
            raise

    def _write_temp(self, name: str, data: bytes, mode: int) -> str:
        """A fsynced temporary file beside ``name`` holding ``data``."""
        temp = f".{name}{_TEMP_MARK}{os.getpid()}-{secrets.token_hex(6)}"
        fd = os.open(temp, _TEMP_FLAGS, 0o600, dir_fd=self.fd())
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
                os.unlink(temp, dir_fd=self.fd())
            raise
        os.close(fd)
        return temp

    def remove(self, name: str, *, durably: bool = False) -> None:
        fd = self.fd()
        try:
            _refuse_symlink(self._prefix + name, name, fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)
            if durably:
                os.fsync(fd)
        except OSError as exc:
            self._named(exc)
            raise


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
    timings: dict[str, str | None] | None = None  # live applies with artifacts, drain or warm-up
    signature: dict[str, str] | None = None  # a signed stage's {signer, sha256}, once verified
    evals: list[dict[str, Any]] | None = None  # live applies with evals: each one's cases
    standby: dict[str, Any] | None = None  # switches between slots: {slot, serving[, warm]}
    released: dict[str, Any] | None = None  # release jobs: {slot, stopped}

    def public(self) -> dict[str, Any]:
        """The record as ``GET /v1/nodes/{node}/jobs/{jobId}`` shows it."""
        shown = {
            "jobId": self.job_id,
            "state": self.state,
            "error": self.error,
            "backupId": self.backup_id,
            "finishedAt": self.finished_at,
            "sourceCommit": self.payload.get("sourceCommit"),
            "detail": self.detail,
        }
        if self.timings is not None:
            shown["timings"] = self.timings
        if self.signature is not None:
            shown["signature"] = self.signature
        if self.evals is not None:
            shown["evals"] = self.evals
        if self.standby is not None:
            shown["standby"] = self.standby
        if self.released is not None:
            shown["released"] = self.released
        return shown

    @classmethod
    def admitted(cls, job: JobPayload, accepted_at: str) -> JobRecord:
        """A job just admitted, its payload parsed once at admission."""
        record = cls(job.job_id, job.signed, "accepted", accepted_at)
        record.__dict__["job"] = job
        return record

    @cached_property
    def job(self) -> JobPayload:
        """The payload, typed (``read_job``): parsed once per record, at
        admission or when the journal is read back, and kept by ``with_changes``.
        Not a field: the record on disk holds the payload as it was signed."""
        return read_job(self.payload)

    def with_changes(self, **changes: Any) -> JobRecord:
        changed = replace(self, **changes)
        if "job" in self.__dict__ and "payload" not in changes:
            changed.__dict__["job"] = self.__dict__["job"]
        return changed


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


# In the journal folder (not a *.json record): ids of jobs compacted away.
DROPPED_FILE = ".dropped-jobs"


class StateDir:
    """The files of one agent. Open it with ``StateDir.open``; one agent at a time."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runtimes = root / "runtimes"
        self.jobs = root / "jobs"
        self.backups = root / "backups"
        self.slots = root / "slots"  # made on first use: only agents with slots have it
        self._runtimes, self._jobs, self._backups_folder = (
            _Folder(self.runtimes),
            _Folder(self.jobs),
            _Folder(self.backups),
        )
        self._slots = _Folder(self.slots)
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
        try:
            for folder in state._folders():
                folder.fd()  # from now on, the folders the agent works in (module docstring)
        except OSError as exc:
            state.close()
            raise ReconcilerError(
                f"cannot use state directory {root}: {exc.strerror}",
                "pass a writable --state-dir",
            ) from None
        return state

    def _folders(self) -> tuple[_Folder, ...]:
        return self._runtimes, self._jobs, self._backups_folder

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None
        for folder in self._folders():
            folder.close()
        self._slots.close()

    def _remove_temporaries(self) -> None:
        # Left by a crash between creating a temporary file and renaming it.
        for directory in (self.runtimes, self.jobs, self.backups):
            for path in directory.iterdir():
                if path.name.startswith(".") and _TEMP_MARK in path.name:
                    path.unlink()

    # -- runtime configs ---------------------------------------------------------

    def config_path(self, runtime: str) -> Path:
        return self.runtimes / f"{runtime}.yaml"

    def config_location(self, runtime: str) -> str:
        """``str(config_path(runtime))``, without building a ``Path``."""
        return self._runtimes.shown(f"{runtime}.yaml")

    def refuse_config_symlink(self, runtime: str) -> None:
        """``UnsafePath`` when the runtime's config is a symbolic link."""
        self._runtimes.refuse_symlink(f"{runtime}.yaml")

    def read_config(self, runtime: str) -> tuple[bytes, int] | None:
        """The config's bytes and mode, or None when the runtime has no config."""
        return self._runtimes.read(f"{runtime}.yaml")

    def write_config(self, runtime: str, data: bytes | None, mode: int = CONFIG_MODE) -> None:
        """Put ``data`` in place atomically; None removes the config."""
        if data is None:
            self._runtimes.remove(f"{runtime}.yaml", durably=True)
        else:
            self._runtimes.write(f"{runtime}.yaml", data, mode)

    def runtime_names(self, slotted: bool = False) -> list[str]:
        """The runtimes that have a config file; ``slotted``: not counting
        the slot configs (``TYPE.a.yaml`` beside ``TYPE.yaml``)."""
        names = {p.stem for p in self.runtimes.glob("*.yaml") if not p.name.startswith(".")}
        if slotted:
            names -= {f"{n}.{slot}" for n in names for slot in SLOT_NAMES}
        return sorted(names)

    # -- slots (warm standby) ----------------------------------------------------

    def slot_config_location(self, runtime: str, slot: str) -> str:
        return self._runtimes.shown(f"{runtime}.{slot}.yaml")

    def read_slot_config(self, runtime: str, slot: str) -> tuple[bytes, int] | None:
        return self._runtimes.read(f"{runtime}.{slot}.yaml")

    def write_slot_config(self, runtime: str, slot: str, data: bytes, mode: int) -> None:
        self._runtimes.write(f"{runtime}.{slot}.yaml", data, mode)

    def read_slots(self, runtime: str) -> dict[str, Any] | None:
        """The runtime's slot record (``slots``), or None when none was written."""
        if not self.slots.is_dir():
            return None
        found = self._slots.read(f"{runtime}.json")
        if found is None:
            return None
        try:
            record = json.loads(found[0])
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            raise ReconcilerError(
                f"{self._slots.shown(runtime + '.json')} cannot be read: {exc}",
                "it was not written by this agent version; stop both slots, move it away "
                "and start the agent again",
            ) from None
        return record

    def write_slots(self, runtime: str, record: Mapping[str, Any]) -> None:
        """Durably: on return the record survives a crash."""
        self.slots.mkdir(exist_ok=True)
        data = json.dumps(dict(record), sort_keys=True).encode("utf-8")
        self._slots.write(f"{runtime}.json", data, 0o600)

    # -- the journal -------------------------------------------------------------

    def save_job(self, record: JobRecord) -> None:
        """Durably: on return the record survives a crash (fsync)."""
        fields = _fields(record)
        # Records without them read as before.
        for key in ("timings", "signature", "evals", "standby", "released"):
            if fields[key] is None:
                del fields[key]
        data = _JOURNAL_JSON.encode(fields).encode("utf-8")
        self._jobs.write(f"{record.job_id}.json", data, 0o600)

    def delete_job(self, job_id: str) -> None:
        # No fsync: only compaction deletes, and only finished records past their
        # payload's expiry; one a crash brings back is compacted again, and
        # admission refuses its payload as expired meanwhile.
        self._jobs.remove(f"{job_id}.json")

    def save_dropped(self, dropped: Mapping[str, str]) -> None:
        """Durably: the ids of jobs whose records compaction dropped, with
        when each was dropped (RFC 3339), so that none runs again."""
        data = json.dumps(dict(sorted(dropped.items()))).encode("utf-8")
        self._jobs.write(DROPPED_FILE, data, 0o600)

    def load_dropped(self) -> dict[str, str]:
        found = self._jobs.read(DROPPED_FILE)
        if found is None:
            return {}
        try:
            data = json.loads(found[0])
            return {str(k): str(v) for k, v in data.items()}
        except (ValueError, AttributeError) as exc:
            raise ReconcilerError(
                f"{self.jobs / DROPPED_FILE} cannot be read: {exc}",
                "it was not written by this agent version; move it away to start",
            ) from None

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

    @staticmethod
    def _backup_names(backup_id: str) -> tuple[str, str]:
        return f"{backup_id}.data", f"{backup_id}.json"

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
        folder = self._backups_folder
        if info is not None and not all(map(folder.exists, self._backup_names(backup_id))):
            # Removed by hand while the agent ran: it is gone for good.
            del self._backups()[backup_id]
            return None
        return info

    def read_backup(self, info: BackupInfo) -> bytes:
        name = self._backup_names(info.backup_id)[0]
        found = self._backups_folder.read(name)
        if found is None:  # as ``Path.read_bytes`` says it
            raise FileNotFoundError(
                errno.ENOENT, os.strerror(errno.ENOENT), self._backups_folder.shown(name)
            )
        return found[0]

    def next_seq(self) -> int:
        return max((b.seq for b in self._backups().values()), default=0) + 1

    def save_backup(self, info: BackupInfo, data: bytes) -> None:
        """Durably: on return both files survive a crash, so the config may be replaced."""
        data_name, info_name = self._backup_names(info.backup_id)
        description = _BACKUP_JSON.encode(_fields(info)).encode("utf-8")
        # One directory fsync for both: a crash that keeps one rename and loses
        # the other leaves no backup, since one needs both files to be listed.
        self._backups_folder.write_together(
            [(data_name, data, 0o600), (info_name, description, 0o600)]
        )
        self._backups()[info.backup_id] = info

    def delete_backup(self, backup_id: str) -> None:
        data_name, info_name = self._backup_names(backup_id)
        # Not fsynced (module docstring): a prune lost to a crash is done again
        # by the next one. Either file alone is no backup.
        self._backups_folder.remove(info_name)
        self._backups_folder.remove(data_name)
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
