"""Status files read into ``RolloutStatus`` values: ``StatusReader`` is the
one reader (schema check, node pages, cache by blob id); the functions
below read a branch's committed status for the commands."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from jsonschema.exceptions import best_match  # type: ignore[import-untyped]

from reconciler.git.branch import Branch
from reconciler.spec import schemas
from reconciler.spec.errors import StoreError
from reconciler.spec.paths import (
    FLEET_STATUS_PATH,
    NAME_RE,
    SETTINGS_PATH,
    STATUS_DIR,
    name_in,
    shown_path,
    status_pages_dir,
    status_path,
)
from reconciler.spec.rollout_status import RolloutStatus, status_from_files
from reconciler.spec.safe_yaml import YamlProblem, load_yaml


@dataclass(frozen=True)
class Snapshot:
    """The statuses at one commit, and the files that could not be read."""

    commit: str | None  # the commit status was read at (None: no status branch yet)
    statuses: dict[str, RolloutStatus]
    problems: tuple[str, ...] = ()


def status_branch(source: Branch, tip: str) -> str | None:
    """``spec.statusBranch`` of ``reconciler.yaml`` at ``tip``, if set."""
    data = source.read(tip, SETTINGS_PATH)
    if data is None:
        return None
    try:
        settings = load_yaml(SETTINGS_PATH, data)
    except YamlProblem:
        return None  # the daemon reports it; status stays on the tracked branch
    spec = settings.get("spec") if isinstance(settings, dict) else None
    value = spec.get("statusBranch") if isinstance(spec, dict) else None
    return value if isinstance(value, str) and value else None


STATUS_SCHEMA = "rollout-status"


class StatusSource(Protocol):
    """Where status files are read from: a Git store, a read-only branch
    reader, or a working tree (``blob`` ids are then paths)."""

    def files(self, commit: str, folder: str) -> dict[str, str]: ...

    def blob(self, blob_id: str) -> bytes: ...


@runtime_checkable
class ChangeSource(StatusSource, Protocol):
    """A Git source that can name a file's blob directly (the daemon's store)."""

    def file_blob(self, commit: str, path: str) -> str | None: ...


class StatusReader:
    """The one reader of status files (``status/NAME.yaml`` and its node
    pages), for the daemon, ``status``, ``plan``, the intent verbs and the
    demo: YAML parsed safely, each file checked against the status schema
    (a hand edit that is not a status must never be stepped from), pages
    joined, and a cache by blob id, so that a re-read parses only what
    changed (a transition on a large rollout rewrites its main file and one
    node page). The cache keeps only what the last read saw.

    ``check_schema=False`` reads what a status file holds without the schema
    check, for views that show a person whatever is there (a status written
    by an older or newer daemon); only the daemon steps from what it reads."""

    def __init__(self, *, check_schema: bool = True) -> None:
        self.check_schema = check_schema
        self.data: dict[str, Any] = {}  # blob id -> checked plain data
        self.values: dict[tuple[str, ...], RolloutStatus] = {}  # blob ids -> value
        # What the last read found, for ``read_changed``: the commit, each
        # name's blob ids (or its reason when unreadable) and the results.
        self.at: str | None = None
        self._keys: dict[str, tuple[str, ...]] = {}
        self._statuses: dict[str, RolloutStatus] = {}
        self._broken: dict[str, str] = {}
        # The rollouts ``read_changed`` read again (None after a full read).
        self.changed_names: frozenset[str] | None = None
        # Files under status/ that no rollout can own (a name that is not a
        # valid rollout name, or not UTF-8), at the last read: shown path ->
        # why it is ignored. Each is a problem of that path alone.
        self.ignored: dict[str, str] = {}

    def read(
        self, source: StatusSource, commit: str | None
    ) -> tuple[dict[str, RolloutStatus], dict[str, str]]:
        """Statuses by rollout name at ``commit``, and the names whose files
        cannot be read, with why (``path: reason``)."""
        self.changed_names = None
        if commit is None:
            self.at = None
            return {}, {}
        statuses: dict[str, RolloutStatus] = {}
        broken: dict[str, str] = {}
        keys: dict[str, tuple[str, ...]] = {}
        self.ignored = {}
        for path, blob_id in source.files(commit, STATUS_DIR).items():
            if not path.endswith(".yaml") or path == FLEET_STATUS_PATH:
                continue  # the fleet watch's record is not a rollout's
            if name_in(STATUS_DIR, path) is None:
                self.ignored[shown_path(path)] = _IGNORED
                continue
            self._read_one(source, commit, path, blob_id, statuses, broken, keys)
        # Forget what the branch no longer holds: a long-running daemon must
        # not keep every version of every status file it ever read.
        live_blobs = {b for key in keys.values() for b in key}
        live_keys = set(keys.values())
        for blob_id in [b for b in self.data if b not in live_blobs]:
            del self.data[blob_id]
        for key in [k for k in self.values if k not in live_keys]:
            del self.values[key]
        self._remember_read(commit, statuses, broken, keys)
        return statuses, broken

    def read_changed(
        self, source: ChangeSource, commit: str | None, changed: Iterable[str]
    ) -> tuple[dict[str, RolloutStatus], dict[str, str]]:
        """The same answer as ``read(source, commit)``, given ``changed``:
        every path under ``status/`` that differs between ``self.at`` (the
        commit the last read was at) and ``commit``. Only the rollouts
        those paths belong to are read again; the rest are the values the
        last read returned, the same objects."""
        if commit is None or self.at is None:
            return self.read(source, commit)
        changed = list(changed)
        self.changed_names = frozenset(_names_of(changed))
        for path in changed:
            if _is_main_file(path) and name_in(STATUS_DIR, path) is None:
                if source.file_blob(commit, path) is None:
                    self.ignored.pop(shown_path(path), None)
                else:
                    self.ignored[shown_path(path)] = _IGNORED
        # The last read's mappings, brought up to date in place: one copy
        # of thousands of statuses is handed out, not three made.
        statuses = self._statuses
        broken = self._broken
        keys = self._keys
        for name in sorted(self.changed_names):
            old = keys.pop(name, None)
            statuses.pop(name, None)
            broken.pop(name, None)
            path = status_path(name)
            blob_id = source.file_blob(commit, path)
            if blob_id is not None:
                self._read_one(source, commit, path, blob_id, statuses, broken, keys)
            new = keys.get(name)
            if old is not None and old != new:
                # What only this rollout's old files used is forgotten, as a full read would.
                for blob in set(old) - set(new or ()):
                    self.data.pop(blob, None)
                self.values.pop(old, None)
        self.at = commit
        # copy(), not dict(): a dict that had names removed and added again
        # is copied entry by entry by dict() (0.17 ms at 5,000), whole by copy().
        return statuses.copy(), broken.copy()

    def _read_one(
        self,
        source: StatusSource,
        commit: str,
        path: str,
        blob_id: str,
        statuses: dict[str, RolloutStatus],
        broken: dict[str, str],
        keys: dict[str, tuple[str, ...]],
    ) -> None:
        """Read ``status/NAME.yaml`` (and its pages) into ``statuses`` or ``broken``."""
        name = name_in(STATUS_DIR, path)
        if name is None:
            return  # no rollout's (``ignored``)
        try:
            main = self._load(source, path, blob_id)
            pages: dict[str, Any] = {}
            page_blobs: list[str] = []
            if main.get("nodePages"):
                for page_path, page_blob in sorted(
                    source.files(commit, status_pages_dir(name)).items()
                ):
                    pages[page_path] = self._load(source, page_path, page_blob)
                    page_blobs.append(page_blob)
            key = (blob_id, *page_blobs)
            keys[name] = key
            value = self.values.get(key)
            if value is None:
                value = status_from_files(main, pages)
                if value.name != name:
                    raise ValueError(f"metadata.name is {value.name!r}, not {name!r}")
                self.values[key] = value
            statuses[name] = value
        except (YamlProblem, ValueError, KeyError, TypeError, AttributeError) as exc:
            reason = str(exc.problem) if isinstance(exc, YamlProblem) else f"{path}: {exc}"
            broken[name] = reason
            keys.setdefault(name, (blob_id,))

    def _remember_read(
        self,
        commit: str,
        statuses: dict[str, RolloutStatus],
        broken: dict[str, str],
        keys: dict[str, tuple[str, ...]],
    ) -> None:
        self.at = commit
        self._statuses = dict(statuses)
        self._broken = dict(broken)
        self._keys = keys

    def remember(
        self,
        source: ChangeSource,
        commit: str,
        written: Mapping[str, Any],
        statuses: Mapping[str, RolloutStatus],
    ) -> None:
        """Seed the cache with status files just written at ``commit``
        (``written``: path -> plain data), so the next read does not parse,
        check and rebuild them (values round-trip losslessly through files)."""
        for name, value in statuses.items():
            path = status_path(name)
            blob_id = source.file_blob(commit, path) if path in written else None
            if blob_id is None or path not in written:
                continue
            pages = (
                source.files(commit, status_pages_dir(name))
                if written[path].get("nodePages")
                else {}
            )
            page_blobs = [page_blob for _, page_blob in sorted(pages.items())]
            if any(p not in written and b not in self.data for p, b in pages.items()):
                continue  # a file we never read: the next read reads this status itself
            for page_path, page_blob in pages.items():
                if page_path in written:
                    self.data[page_blob] = written[page_path]
            self.data[blob_id] = written[path]
            self.values[(blob_id, *page_blobs)] = value

    def _load(self, source: StatusSource, path: str, blob_id: str) -> Any:
        data = self.data.get(blob_id)
        if data is None:
            data = load_yaml(path, source.blob(blob_id))
            if not isinstance(data, dict):
                raise ValueError("not a mapping")
            if self.check_schema and not schemas.fast_check(STATUS_SCHEMA)(data):
                # It parses but is not a status (a hand edit): the engine must
                # never step from it, or it raises and the daemon exits.
                raise ValueError(f"not a valid status: {_schema_error(data)}")
            self.data[blob_id] = data
        return data


_IGNORED = (
    "not a rollout's status file: its name is not a valid rollout name (or not UTF-8); "
    "the daemon ignores it"
)


def _is_main_file(path: str) -> bool:
    """``status/SOMETHING.yaml``, directly in the folder, but the fleet's record."""
    head, sep, rest = path.partition("/")
    return (
        head == STATUS_DIR
        and bool(sep)
        and "/" not in rest
        and rest.endswith(".yaml")
        and path != FLEET_STATUS_PATH
    )


def _names_of(changed: Iterable[str]) -> set[str]:
    """The rollouts whose status files are among ``changed`` paths:
    ``status/NAME.yaml`` and anything under ``status/NAME/`` (its pages);
    the fleet watch's files and the dashboard are no rollout's."""
    names: set[str] = set()
    prefix = STATUS_DIR + "/"
    for path in changed:
        if not path.startswith(prefix) or path == FLEET_STATUS_PATH:
            continue
        rest = path[len(prefix) :]
        head, sep, _ = rest.partition("/")
        name = head if sep else rest[: -len(".yaml")] if rest.endswith(".yaml") else ""
        if NAME_RE.fullmatch(name):
            names.add(name)
    names.discard(FLEET_STATUS_PATH[len(prefix) : -len(".yaml")])
    return names


def StatusCache() -> StatusReader:
    """The reader a view keeps from read to read (``status --watch``)."""
    return StatusReader(check_schema=False)


def _schema_error(data: Any) -> str:
    error = best_match(schemas.validator(STATUS_SCHEMA).iter_errors(data))
    if error is None:
        return "does not match the status schema"
    where = ".".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else str(error.message)


def read_snapshot(source: Branch, cache: StatusReader | None = None) -> Snapshot:
    tip = source.refresh()
    if tip is None:
        raise StoreError(f"branch {source.branch!r} not found in {source.label}")
    other = status_branch(source, tip)
    commit = tip if other is None else source.tip(other)
    if commit is None:
        return Snapshot(None, {})
    return read_statuses(source, commit, cache)


def read_statuses(source: Branch, commit: str, cache: StatusReader | None = None) -> Snapshot:
    """The statuses at ``commit``, and a problem line for each status that
    cannot be read."""
    reader = cache or StatusCache()
    statuses, broken = reader.read(source.reader, commit)
    return Snapshot(commit, statuses, tuple(broken[name] for name in sorted(broken)))
