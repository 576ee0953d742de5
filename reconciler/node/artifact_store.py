"""The agent's content-addressed store of model artifacts::

    STATE/artifacts/sha256/HEX            a file whose size and SHA-256 were checked
    STATE/artifacts/sha256/HEX.partial    a download under way, kept to be resumed
    STATE/artifacts/uses.json             HEX -> runtime -> when it was last wanted

A file is only ever named ``HEX`` by a rename of its ``.partial`` once its
size and digest matched, and the folder is fsynced after, so a crash leaves
a checked file or a partial one, never a torn file under its digest. A
mismatch deletes the partial file. ``uses.json`` orders the files for
retention; a file it does not name is the oldest there is.

Must not: fetch anything (``artifact_download`` does, into a ``Partial``),
or decide which files are kept (``artifact_retention`` does).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from reconciler.node.state_dir import write_atomic

HEX = re.compile(r"[0-9a-f]{64}")
PARTIAL = ".partial"
_READ_CHUNK = 1024 * 1024
FILE_MODE = 0o444  # a checked file is never written again


def config_entries(state_root: Path, artifacts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A runtime config's ``artifacts: {NAME: {path, sha256}}`` for the
    store under ``state_root``."""
    folder = state_root.absolute() / "artifacts" / "sha256"
    return {
        a["name"]: {"path": str(folder / a["sha256"]), "sha256": a["sha256"]} for a in artifacts
    }


class StageFailed(Exception):
    """A stage job fails with ``code: message`` (``digest_mismatch``,
    ``insufficient_space``, ``download_failed``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def text(self) -> str:
        return f"{self.code}: {self.message}"


def free_bytes(folder: Path) -> int:
    """Bytes an unprivileged writer may still put on ``folder``'s filesystem."""
    stats = os.statvfs(folder)
    return stats.f_bavail * stats.f_frsize


class Partial:
    """A download into ``HEX.partial``: the bytes held so far and their
    running SHA-256. Opening it reads what an earlier run left, so a
    resumed download is hashed as a whole."""

    def __init__(self, store: ArtifactStore, sha256: str) -> None:
        self.store = store
        self.sha256 = sha256
        self.path = store.folder / (sha256 + PARTIAL)
        self._hash = hashlib.sha256()
        self._file: BinaryIO = open(self.path, "a+b")  # noqa: SIM115 (closed by close)
        self._file.seek(0)
        while chunk := self._file.read(_READ_CHUNK):
            self._hash.update(chunk)
        self.size = self._file.tell()
        self.received = 0  # bytes appended by this run, for the download counter

    def append(self, data: bytes) -> None:
        try:
            self._file.write(data)
        except OSError as exc:
            raise _disk_failure(exc) from None
        self._hash.update(data)
        self.size += len(data)
        self.received += len(data)

    def restart(self) -> None:
        """Drop what is held: the server sent the whole file again."""
        self._file.seek(0)
        self._file.truncate()
        self._hash = hashlib.sha256()
        self.size = 0

    def close(self) -> None:
        """Stop writing; an empty partial file is not kept."""
        if self._file.closed:
            return
        self._file.close()
        if self.size == 0:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def finish(self, size: int) -> None:
        """Move the file under its digest once its size and SHA-256 match;
        else delete it and fail with ``digest_mismatch``."""
        got = self._hash.hexdigest()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        if self.size != size or got != self.sha256:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            raise StageFailed(
                "digest_mismatch",
                f"expected {size} bytes with sha256 {self.sha256}, "
                f"got {self.size} bytes with sha256 {got}; the file was deleted",
            )
        os.chmod(self.path, FILE_MODE)
        os.replace(self.path, self.store.path(self.sha256))
        self.store.sync()


class ArtifactStore:
    """One agent's ``STATE/artifacts``. Written from the job thread only;
    ``holds`` may be asked from any thread."""

    def __init__(self, root: Path) -> None:
        self.root = root / "artifacts"
        self.folder = self.root / "sha256"
        self.folder.mkdir(parents=True, exist_ok=True)
        self._uses_file = self.root / "uses.json"
        self.uses = _load_uses(self._uses_file)

    def path(self, sha256: str) -> Path:
        return self.folder / sha256

    def config_entries(self, artifacts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        return config_entries(self.root.parent, artifacts)

    def size(self, sha256: str) -> int:
        """The checked file's size; OSError when it is not held."""
        return os.stat(self.path(sha256)).st_size

    def holds(self, sha256: str, size: int) -> bool:
        """Is the checked file there with that size?"""
        try:
            return os.stat(self.path(sha256)).st_size == size
        except OSError:
            return False

    def partial_size(self, sha256: str) -> int:
        try:
            return os.stat(self.folder / (sha256 + PARTIAL)).st_size
        except OSError:
            return 0

    def check_space(self, artifacts: Iterable[Mapping[str, Any]]) -> None:
        """``insufficient_space`` unless the bytes still to fetch for the
        artifacts not held fit in the free space."""
        needed = sum(
            max(0, int(a["size"]) - self.partial_size(a["sha256"]))
            for a in artifacts
            if not self.holds(a["sha256"], int(a["size"]))
        )
        free = free_bytes(self.folder)
        if needed > free:
            raise StageFailed("insufficient_space", f"needed {needed} bytes, free {free} bytes")

    def partial(self, sha256: str) -> Partial:
        try:
            return Partial(self, sha256)
        except OSError as exc:
            raise _disk_failure(exc) from None

    def sync(self) -> None:
        """Make the folder's renames durable."""
        fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def held(self) -> set[str]:
        """Digests with a file here, checked or partial."""
        names = set()
        for entry in os.listdir(self.folder):
            name = entry.removesuffix(PARTIAL)
            if HEX.fullmatch(name):
                names.add(name)
        return names

    def bytes_held(self) -> int:
        """The size of every file held here, checked or partial (read now)."""
        total = 0
        for entry in os.scandir(self.folder):
            if HEX.fullmatch(entry.name.removesuffix(PARTIAL)):
                with contextlib.suppress(OSError):  # deleted since listed
                    total += entry.stat().st_size
        return total

    def note_use(self, sha256s: Iterable[str], runtime: str) -> None:
        """``sha256s`` were wanted by a job of ``runtime`` now (newest use last)."""
        moment = 1 + max((s for by in self.uses.values() for s in by.values()), default=0)
        for sha256 in sha256s:
            self.uses.setdefault(sha256, {})[runtime] = moment
        self._save_uses()

    def delete(self, sha256s: Iterable[str]) -> None:
        for sha256 in sha256s:
            for path in (self.path(sha256), self.folder / (sha256 + PARTIAL)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            self.uses.pop(sha256, None)
        self._save_uses()

    def _save_uses(self) -> None:
        data = json.dumps(self.uses, sort_keys=True).encode()
        write_atomic(self._uses_file, data)


def _load_uses(path: Path) -> dict[str, dict[str, int]]:
    try:
        value = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except ValueError:
        return {}  # unreadable order: every file counts as the oldest, none is lost unpinned
    if not isinstance(value, dict):
        return {}
    return {
        str(h): {str(r): int(s) for r, s in by.items() if isinstance(s, int)}
        for h, by in value.items()
        if isinstance(by, dict)
    }


def _disk_failure(exc: OSError) -> StageFailed:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StageFailed("insufficient_space", f"the disk filled up: {exc.strerror}")
    return StageFailed("download_failed", f"cannot write the artifact: {exc}")
