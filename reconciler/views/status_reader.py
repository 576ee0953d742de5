"""The committed status files of a branch, read into ``RolloutStatus``
values: the main file and its node pages, with a cache by blob id so that a
re-read parses only what changed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reconciler.git.branch import Branch
from reconciler.spec.errors import StoreError
from reconciler.spec.paths import SETTINGS_PATH, STATUS_DIR, name_in, status_pages_dir
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


class StatusCache:
    """Statuses already read, by the blob ids of their files: a watch that
    sees a new commit re-reads only the files that changed (a transition on a
    large rollout rewrites its main file and one node page)."""

    def __init__(self) -> None:
        self.statuses: dict[str, tuple[tuple[str, ...], RolloutStatus]] = {}
        self.pages: dict[str, Any] = {}


def read_snapshot(source: Branch, cache: StatusCache | None = None) -> Snapshot:
    tip = source.refresh()
    if tip is None:
        raise StoreError(f"branch {source.branch!r} not found in {source.label}")
    other = status_branch(source, tip)
    commit = tip if other is None else source.tip(other)
    if commit is None:
        return Snapshot(None, {})
    return read_statuses(source, commit, cache)


def read_statuses(source: Branch, commit: str, cache: StatusCache | None = None) -> Snapshot:
    reader = source.reader
    cache = cache or StatusCache()
    statuses: dict[str, RolloutStatus] = {}
    problems: list[str] = []
    kept_statuses: dict[str, tuple[tuple[str, ...], RolloutStatus]] = {}
    kept_pages: dict[str, Any] = {}
    for path, blob in sorted(reader.files(commit, STATUS_DIR).items()):
        if not path.endswith(".yaml"):
            continue
        name = name_in(STATUS_DIR, path)
        try:
            page_blobs = {
                p: b
                for p, b in reader.files(commit, status_pages_dir(name)).items()
                if p.endswith(".yaml")
            }
            key = (blob, *sorted(page_blobs.values()))
            hit = cache.statuses.get(name)
            if hit is not None and hit[0] == key:
                status = hit[1]
            else:
                main = load_yaml(path, reader.blob(blob))
                if not (isinstance(main, dict) and main.get("nodePages")):
                    page_blobs = {}
                pages = {}
                for page_path, page_blob in page_blobs.items():
                    data = cache.pages.get(page_blob)
                    if data is None:
                        data = load_yaml(page_path, reader.blob(page_blob))
                    pages[page_path] = kept_pages[page_blob] = data
                status = status_from_files(main, pages)
            statuses[name] = status
            kept_statuses[name] = (key, status)
        except YamlProblem as exc:
            problems.append(str(exc.problem))
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            problems.append(f"{path}: not a status this version can read ({exc})")
    cache.statuses, cache.pages = kept_statuses, kept_pages
    return Snapshot(commit, statuses, tuple(problems))
