"""The one reader of the fleet status (``status/fleet.yaml`` and, for a
large fleet, its node pages ``status/fleet/nodes-NNNN.yaml``), for the
daemon and ``reconciler fleet``: safe YAML, the schema check, pages joined,
cached by blob ids so an unchanged file is not parsed again.
Must not decide anything."""

from __future__ import annotations

from typing import Any

from jsonschema.exceptions import best_match  # type: ignore[import-untyped]

from reconciler.git.branch import Branch
from reconciler.readers.status_reader import ChangeSource, StatusSource, status_branch
from reconciler.spec import schemas
from reconciler.spec.errors import StoreError
from reconciler.spec.fleet_status import FLEET_KIND, FleetStatus, fleet_from_record
from reconciler.spec.paths import FLEET_PAGES_DIR, FLEET_STATUS_PATH, STATUS_DIR, fleet_page_path
from reconciler.spec.safe_yaml import YamlProblem, load_yaml

FLEET_SCHEMA = "fleet-status"


class FleetReader:
    """Reads the fleet status at a commit; remembers the last one read."""

    def __init__(self) -> None:
        self._key: tuple[str, ...] | None = None
        self._value: FleetStatus | None = None

    def read(self, source: StatusSource, commit: str | None) -> FleetStatus | None:
        """The fleet status at ``commit``; None when there is none. ValueError
        naming the file and the problem when it is not a fleet status."""
        if commit is None:
            return None
        blobs = _blobs(source, commit)
        if blobs is None:
            return None
        key, found = blobs
        if key == self._key:
            return self._value
        record = _load(FLEET_STATUS_PATH, source.blob(key[0]))
        wanted = record.get("nodePages") or 0
        paths = [fleet_page_path(n) for n in range(1, wanted + 1)]
        missing = [p for p in paths if p not in found]
        if missing:
            raise ValueError(
                f"{FLEET_STATUS_PATH}: nodePages is {wanted} but {missing[0]} is missing"
            )
        value = fleet_from_record(record, [_load(p, source.blob(found[p])) for p in paths])
        self._key, self._value = key, value
        return value

    def remember(self, source: ChangeSource, commit: str, value: FleetStatus) -> None:
        """Seed the cache with the fleet status just written at ``commit``
        (its files are ``fleet_to_files(value)``), so the next read does not
        parse what was just written: the first pass after a sweep's commit,
        often a new rollout's first, parsed every node's record (values
        round-trip losslessly through the files; tests pin this)."""
        blobs = _blobs(source, commit)
        if blobs is not None:
            self._key, self._value = blobs[0], value


def _blobs(source: StatusSource, commit: str) -> tuple[tuple[str, ...], dict[str, str]] | None:
    """At ``commit``, the fleet status's blobs (the main file's, then its
    pages' by path: what identifies its value) and its pages' by path; None
    when there is no fleet status. A Git source
    looks the one file up instead of listing status/ (thousands of
    rollouts' files); any other lists the folder."""
    if isinstance(source, ChangeSource):
        main = source.file_blob(commit, FLEET_STATUS_PATH)
    else:
        main = source.files(commit, STATUS_DIR).get(FLEET_STATUS_PATH)
    if main is None:
        return None
    pages = source.files(commit, FLEET_PAGES_DIR)
    return (main, *(pages[path] for path in sorted(pages))), pages


def _load(path: str, data: bytes) -> dict[str, Any]:
    try:
        record = load_yaml(path, data)
    except YamlProblem as exc:
        raise ValueError(str(exc.problem)) from None
    if not isinstance(record, dict) or not schemas.fast_check(FLEET_SCHEMA)(record):
        raise ValueError(f"{path}: not a valid {FLEET_KIND}: {_schema_error(record)}")
    return record


def read_fleet_status(path: str, data: bytes) -> FleetStatus:
    """One fleet status file holding every node (a fleet of up to 500)."""
    return fleet_from_record(_load(path, data))


def _schema_error(record: Any) -> str:
    error = best_match(schemas.validator(FLEET_SCHEMA).iter_errors(record))
    if error is None:
        return "does not match the fleet status schema"
    where = ".".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else str(error.message)


def read_branch_fleet(source: Branch) -> tuple[str | None, FleetStatus | None]:
    """The fleet status committed on the branch's status branch (the tracked
    branch, or ``statusBranch``), and the commit read; None before the
    first sweep wrote one."""
    tip = source.refresh()
    if tip is None:
        raise StoreError(f"branch {source.branch!r} not found in {source.label}")
    other = status_branch(source, tip)
    commit = tip if other is None else source.tip(other)
    return commit, FleetReader().read(source.reader, commit)


__all__ = ["FleetReader", "read_branch_fleet", "read_fleet_status"]
