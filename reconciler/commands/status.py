"""``reconciler status [NAME] [--repo PATH_OR_URL] [--branch main] [--watch]
[--format text|json]``: rollouts at a glance from the committed status files;
with NAME, every node.

Status is read from the branch's committed tree, never a working tree: from
a bare repository or a remote (through ``GitStore``), or from a working
clone. In a clone whose ``origin`` is where the daemon pushes, the origin is
read, since the clone's own branch is only as fresh as its last pull. With
``statusBranch`` in ``reconciler.yaml`` the status comes from that branch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pygit2

from reconciler import statusview
from reconciler.commands import add_remote_arguments
from reconciler.errors import StoreError
from reconciler.gitstore import GitStore, discover_repository, is_remote_location
from reconciler.status import RolloutStatus, status_from_files
from reconciler.watch import BranchWatcher
from reconciler.yamlio import YamlProblem, load_yaml

HELP = "show rollouts from the committed status files; with NAME, every node"

LOCAL_POLL = 0.5  # seconds between reads of a local ref while watching
REMOTE_POLL = 2.0  # seconds between listings of a remote's refs while watching
REMOTE_REFETCH = 30.0  # a full fetch at least this often, in case a hint was missed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", nargs="?", help="one rollout in full")
    parser.add_argument(
        "--repo",
        metavar="PATH_OR_URL",
        default=".",
        help="a bare repository, a working clone or a remote URL (default: .)",
    )
    parser.add_argument("--branch", default="main", help="the branch the daemon tracks")
    parser.add_argument("--watch", action="store_true", help="redraw as status commits arrive")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    add_remote_arguments(parser)


# --- reading a branch -----------------------------------------------------------


class RepoReader:
    """The few reads ``status`` needs, on a repository GitStore will not
    open for the daemon (a working clone with the branch checked out).
    Reading committed objects is safe there; only moving the branch is not."""

    def __init__(self, repo: pygit2.Repository, location: str) -> None:
        self._repo = repo
        self.location = location
        self.is_remote = False

    def repository(self) -> pygit2.Repository:
        return self._repo

    def tip(self, branch: str) -> str | None:
        ref = self._repo.references.get(f"refs/heads/{branch}")
        return None if ref is None else str(ref.resolve().target)

    def files(self, commit: str, folder: str) -> dict[str, str]:
        try:
            sub = self._repo[commit].peel(pygit2.Tree)[folder]
        except KeyError:
            return {}
        if not isinstance(sub, pygit2.Tree):
            return {}
        return {f"{folder}/{e.name}": str(e.id) for e in sub if e.type_str == "blob"}

    def file_blob(self, commit: str, path: str) -> str | None:
        try:
            entry = self._repo[commit].peel(pygit2.Tree)[path]
        except KeyError:
            return None
        return str(entry.id) if entry.type_str == "blob" else None

    def blob(self, blob_id: str) -> bytes:
        obj = self._repo[blob_id]
        assert isinstance(obj, pygit2.Blob)
        return bytes(obj.data)


@dataclass
class Branch:
    """One branch of a fleet repository, read-only."""

    reader: GitStore | RepoReader
    branch: str
    label: str  # where it is read from, for headers and messages

    @property
    def is_remote(self) -> bool:
        return self.reader.is_remote

    def refresh(self) -> str | None:
        """The branch tip (fetching first from a remote)."""
        if isinstance(self.reader, GitStore):
            self.reader.refresh()
        return self.reader.tip(self.branch)

    def tip(self, branch: str) -> str | None:
        return self.reader.tip(branch)

    def read(self, commit: str, path: str) -> bytes | None:
        blob = self.reader.file_blob(commit, path)
        return None if blob is None else self.reader.blob(blob)

    def watcher(self, branches: list[str]) -> BranchWatcher:
        if isinstance(self.reader, GitStore):
            return BranchWatcher.for_store(self.reader, branches, poll=REMOTE_POLL)
        return BranchWatcher.local(Path(self.reader.repository().path), branches)


def open_branch(
    location: str,
    branch: str,
    *,
    ssh_key: Path | None = None,
    known_hosts: Path | None = None,
) -> Branch:
    """The branch at ``location``: a remote URL, a bare repository, or a
    working clone, whose ``origin`` is read instead when it has one (the
    daemon pushes status there; the clone's branch is as old as its last pull).
    A remote is reached with `ssh_key` and its host key checked against
    `known_hosts` (default ``~/.ssh/known_hosts``)."""
    if is_remote_location(location):
        store = GitStore.open(location, branch, ssh_key=ssh_key, known_hosts=known_hosts)
        return Branch(store, branch, location)
    repo = _discover(location)
    origin = None if repo.is_bare else _origin_url(repo)
    if origin is None:
        return _local(repo, branch, location)
    if is_remote_location(origin):
        store = GitStore.open(origin, branch, ssh_key=ssh_key, known_hosts=known_hosts)
        return Branch(store, branch, f"{origin} (origin of {location})")
    target = Path(repo.workdir) / origin  # a relative origin is relative to the clone
    return _local(_discover(str(target)), branch, f"{origin} (origin of {location})")


def _discover(location: str) -> pygit2.Repository:
    return discover_repository(
        location,
        "pass --repo with a fleet repository: a clone, a bare repository or a URL",
    )


def _local(repo: pygit2.Repository, branch: str, label: str) -> Branch:
    """A bare repository through GitStore, as the daemon reads it; a
    non-bare one directly (GitStore refuses a checked-out branch, which
    matters for writing only)."""
    if repo.is_bare:
        return Branch(GitStore.open(str(repo.path), branch), branch, label)
    return Branch(RepoReader(repo, label), branch, label)


def _origin_url(repo: pygit2.Repository) -> str | None:
    try:
        url = repo.remotes["origin"].url
    except KeyError:
        return None
    return str(url) if url else None


@dataclass(frozen=True)
class Snapshot:
    """The statuses at one commit, and the files that could not be read."""

    commit: str | None  # the commit status was read at (None: no status branch yet)
    statuses: dict[str, RolloutStatus]
    problems: tuple[str, ...] = ()


def status_branch(source: Branch, tip: str) -> str | None:
    """``spec.statusBranch`` of ``reconciler.yaml`` at ``tip``, if set."""
    data = source.read(tip, "reconciler.yaml")
    if data is None:
        return None
    try:
        settings = load_yaml("reconciler.yaml", data)
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
    for path, blob in sorted(reader.files(commit, "status").items()):
        if not path.endswith(".yaml"):
            continue
        name = path.removeprefix("status/").removesuffix(".yaml")
        try:
            page_blobs = {
                p: b
                for p, b in reader.files(commit, f"status/{name}").items()
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


# --- rendering --------------------------------------------------------------


def use_colour(stream: object) -> bool:
    return (
        bool(getattr(stream, "isatty", lambda: False)())
        and "NO_COLOR" not in os.environ
        and os.environ.get("TERM") != "dumb"
    )


def render(snapshot: Snapshot, name: str | None, fmt: str, colour: bool) -> tuple[str, bool]:
    """The text to show, and whether NAME was found."""
    now = datetime.now(UTC)
    if name is not None:
        status = snapshot.statuses.get(name)
        if status is None:
            known = ", ".join(sorted(snapshot.statuses)) or "none"
            return f"no status for {name!r} yet (rollouts with a status: {known})\n", False
        if fmt == "json":
            return statusview.render_json([status], one=True), True
        return statusview.render_detail(status, now, colour=colour), True
    if fmt == "json":
        return statusview.render_json(snapshot.statuses.values()), True
    return statusview.render_table(snapshot.statuses, now, colour=colour), True


def run(args: argparse.Namespace) -> int:
    source = open_branch(args.repo, args.branch, ssh_key=args.ssh_key, known_hosts=args.known_hosts)
    if args.watch:
        return watch(source, args.name, args.format)
    snapshot = read_snapshot(source)
    text, found = render(snapshot, args.name, args.format, use_colour(sys.stdout))
    sys.stdout.write(text)
    for problem in snapshot.problems:
        print(f"warning: {problem}", file=sys.stderr)
    return 0 if found else 1


def watch(source: Branch, name: str | None, fmt: str) -> int:
    """Redraw whenever a new status commit arrives; on a terminal also when
    the text changes as ages grow. Ends with Ctrl-C."""
    tty = sys.stdout.isatty()
    colour = use_colour(sys.stdout)
    tip = source.refresh()
    other = status_branch(source, tip) if tip else None
    branches = [source.branch, other] if other else [source.branch]
    snapshot: Snapshot | None = None
    cache = StatusCache()
    shown: tuple[str | None, str] | None = None
    last_read = -REMOTE_REFETCH
    hinted = True
    with contextlib.closing(source.watcher(branches)) as watcher:
        try:
            while True:
                now = time.monotonic()
                # A local ref is cheap to read every time; a remote is fetched
                # on a hint from the watcher, or now and then in case one was missed.
                if hinted or not source.is_remote or now - last_read >= REMOTE_REFETCH:
                    try:
                        snapshot = read_snapshot(source, cache)
                    except StoreError as exc:
                        print(f"warning: {exc}", file=sys.stderr)
                    last_read = now
                if snapshot is not None:
                    text, _ = render(snapshot, name, fmt, colour)
                    if shown is None or snapshot.commit != shown[0] or (tty and text != shown[1]):
                        _draw(text, source, snapshot, tty)
                        shown = (snapshot.commit, text)
                hinted = watcher.wait(REMOTE_POLL if source.is_remote else LOCAL_POLL)
        except KeyboardInterrupt:
            return 0


def _draw(text: str, source: Branch, snapshot: Snapshot, tty: bool) -> None:
    commit = snapshot.commit[:10] if snapshot.commit else "no status yet"
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    footer = f"{source.branch} @ {commit} · read {stamp}Z · Ctrl-C to stop"
    where = statusview.clip(f"from {source.label}", statusview.WIDTH - 1)
    if tty:
        sys.stdout.write("\x1b[H\x1b[2J" + text + "\n" + footer + "\n" + where + "\n")
    else:
        sys.stdout.write(f"--- {footer}\n{text}")
    sys.stdout.flush()
