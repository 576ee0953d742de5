"""The agent's model directories, where a runtime finds a target's files
under the paths the rollout gave them::

    STATE/models/MODELID/PATH        hard links into STATE/artifacts/sha256/
    STATE/models/MODELID.json        the sorted [path, sha256] pairs; MODELID
                                     is the SHA-256 of exactly these bytes
    STATE/models/.building-MODELID   a directory being laid out
    STATE/models/MODELID.verified    who vouched for it: the signer whose key
                                     verified the target's signature over it,
                                     and that signature's SHA-256

A directory is built under ``.building-`` and renamed into place whole, so
a crash leaves either no ``MODELID`` or a complete one; the pairs file is
written first, so every directory has one. A file is linked, or copied
where the filesystem refuses links; a link shares the checked file, so the
space is freed when both are gone.

Must not: fetch or delete artifacts (``artifact_store``), or decide which
directories are kept (``artifact_retention``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from reconciler.node.artifact_store import FILE_MODE, ArtifactStore
from reconciler.node.runtime_config import JobFailed
from reconciler.node.state_dir import write_atomic
from reconciler.protocol.model_ids import layout_pairs, manifest_bytes, model_id

BUILDING = ".building-"
MANIFEST = ".json"
VERIFIED = ".verified"
_ID = re.compile(r"[0-9a-f]{64}")
# Errors of a filesystem that cannot hard-link here: copy instead.
_NO_LINKS = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP})


def location(state_root: Path, artifacts: Iterable[Mapping[str, Any]]) -> Path:
    """The absolute model directory of payload ``artifacts`` under ``state_root``."""
    return state_root.absolute() / "models" / model_id(layout_pairs(artifacts))


class ModelDirs:
    """One agent's ``STATE/models``, written from the job thread only."""

    def __init__(self, root: Path, store: ArtifactStore) -> None:
        self.root = root
        self.folder = root / "models"
        self.folder.mkdir(exist_ok=True)
        self.store = store
        for entry in os.listdir(self.folder):
            if entry.startswith(BUILDING):  # left by a crash while laying out
                shutil.rmtree(self.folder / entry, ignore_errors=True)

    def location(self, artifacts: Iterable[Mapping[str, Any]]) -> Path:
        return location(self.root, artifacts)

    def lay_out(self, artifacts: Iterable[Mapping[str, Any]]) -> Path:
        """The model directory of ``artifacts`` (all held), laid out unless
        it is there complete already; ``JobFailed`` when it cannot be."""
        pairs = layout_pairs(artifacts)
        ident = model_id(pairs)
        final = self.folder / ident
        try:
            if not self._complete(final, pairs):
                self._build(ident, pairs)
        except OSError as exc:
            raise JobFailed(
                f"model_dir_failed: cannot lay out {final.absolute()}: {exc}; nothing was changed"
            ) from None
        return final.absolute()

    def _complete(self, final: Path, pairs: list[list[str]]) -> bool:
        """Is every file there with its size, and nothing else?"""
        if not final.is_dir():
            return False
        found = {
            str(Path(top, name).relative_to(final))
            for top, _dirs, names in os.walk(final)
            for name in names
        }
        if found != {path for path, _ in pairs}:
            return False
        for path, sha256 in pairs:
            there = os.lstat(final / path)
            if not stat.S_ISREG(there.st_mode) or there.st_size != self.store.size(sha256):
                return False
        return (self.folder / (final.name + MANIFEST)).exists()

    def _build(self, ident: str, pairs: list[list[str]]) -> None:
        write_atomic(self.folder / (ident + MANIFEST), manifest_bytes(pairs), FILE_MODE)
        building = self.folder / (BUILDING + ident)
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir()
        for path, sha256 in pairs:
            place = building / path
            if not place.resolve().is_relative_to(building.resolve()):
                raise OSError(f"the path {path!r} leaves the model directory")
            place.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(self.store.path(sha256), place)
        for folder, _dirs, _names in os.walk(building):
            _sync(Path(folder))
        final = self.folder / ident
        with contextlib.suppress(FileNotFoundError):  # a rebuilt directory is verified anew
            (self.folder / (ident + VERIFIED)).unlink()
        if final.exists():  # incomplete: set aside, then removed
            stale = self.folder / (BUILDING + ident + ".stale")
            os.rename(final, stale)
            shutil.rmtree(stale, ignore_errors=True)
        os.rename(building, final)
        _sync(self.folder)

    def mark_verified(self, model_dir: Path, signer: str, signature_sha256: str) -> None:
        """Durably: ``model_dir``'s files verified against that signature."""
        mark = {"signer": signer, "sha256": signature_sha256}
        write_atomic(
            self.folder / (model_dir.name + VERIFIED),
            json.dumps(mark, sort_keys=True).encode(),
            FILE_MODE,
        )

    def verified(self, model_dir: Path, signature_sha256: str) -> str | None:
        """The signer that vouched for ``model_dir`` with that signature, or None."""
        try:
            mark = json.loads((self.folder / (model_dir.name + VERIFIED)).read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(mark, dict) or mark.get("sha256") != signature_sha256:
            return None
        signer = mark.get("signer")
        return signer if isinstance(signer, str) else None

    def held(self) -> dict[str, set[str]]:
        """MODELID -> the digests of its files, for every pairs file here."""
        found: dict[str, set[str]] = {}
        for entry in os.listdir(self.folder):
            ident = entry.removesuffix(MANIFEST)
            if entry == ident or not _ID.fullmatch(ident):
                continue
            try:
                pairs = json.loads((self.folder / entry).read_bytes())
                found[ident] = {str(sha256) for _path, sha256 in pairs}
            except (OSError, ValueError, TypeError):
                found[ident] = set()  # unreadable: holds nothing retention knows of
        return found

    def delete(self, idents: Iterable[str]) -> None:
        """Remove each directory, then its pairs file."""
        for ident in idents:
            with contextlib.suppress(FileNotFoundError):  # first: no mark outlives its files
                (self.folder / (ident + VERIFIED)).unlink()
            shutil.rmtree(self.folder / ident, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                (self.folder / (ident + MANIFEST)).unlink()


def _link_or_copy(source: Path, place: Path) -> None:
    try:
        os.link(source, place)
    except OSError as exc:
        if exc.errno not in _NO_LINKS:
            raise
        shutil.copyfile(source, place)
        os.chmod(place, FILE_MODE)


def _sync(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
