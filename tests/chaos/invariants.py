"""docs/architecture.md's invariants, checked from the outside: on the
committed history of the fleet repository and on what the agents recorded.

- ``read_statuses``: every status file at one commit, parsed the way the
  daemon parses it (``yamlio.load_yaml`` + ``status.status_from_files``).
- ``walk``: the branch's history, oldest first, with each commit's statuses.
- ``check_history``: linear history; the daemon writes only under status/
  and every status file it writes parses; status never goes backwards
  (terminal stays terminal, attempts never decrease, a verdict is never
  rewritten, the start commit never changes); no node of a later batch is
  dispatched in a commit where an earlier batch is not settled.
- ``check_jobs``: from the simulator's stats and journal: no job executed
  twice, no job id with two payloads, every job an agent received is
  recorded in a committed status, and no later batch's job was issued
  before the earlier batch's jobs finished. (That a job was recorded
  *before* it was sent is checked at the crash points: see
  ``unrecorded_jobs``.)

Each check returns the violations it found as sentences (empty: none).
Must not: start processes or change anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pygit2

from reconciler.spec.rollout_status import TERMINAL_PHASES, RolloutStatus, status_from_files
from reconciler.spec.safe_yaml import YamlProblem, load_yaml
from reconciler.spec.times import parse_time

DAEMON_NAME = "reconciler"
SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class Snapshot:
    """The status files at one commit: parsed ones, and those that are not."""

    commit: str
    statuses: Mapping[str, RolloutStatus]
    broken: Mapping[str, str]  # rollout name -> why its file does not parse

    def __getitem__(self, name: str) -> RolloutStatus:
        return self.statuses[name]

    def get(self, name: str) -> RolloutStatus | None:
        return self.statuses.get(name)


_parsed: dict[tuple[str, ...], RolloutStatus | str] = {}  # blob ids -> status or error


def _blob(repo: pygit2.Repository, oid: Any) -> bytes:
    blob = repo[oid]
    assert isinstance(blob, pygit2.Blob)
    return bytes(blob.data)


def read_statuses(repo: pygit2.Repository, commit: str) -> Snapshot:
    tree = repo[commit].peel(pygit2.Tree)
    statuses: dict[str, RolloutStatus] = {}
    broken: dict[str, str] = {}
    if "status" not in tree:
        return Snapshot(commit, statuses, broken)
    folder = repo[tree["status"].id]
    assert isinstance(folder, pygit2.Tree)
    for entry in folder:
        file_name = entry.name or ""
        if entry.type_str != "blob" or not file_name.endswith(".yaml") or file_name == "fleet.yaml":
            continue  # fleet.yaml is the fleet watch's record, not a rollout's
        name = file_name[: -len(".yaml")]
        path = f"status/{file_name}"
        pages = repo[folder[name].id] if name in folder else None
        page_entries = (
            sorted((f"status/{name}/{p.name}", p.id) for p in pages)
            if isinstance(pages, pygit2.Tree)
            else []
        )
        key = (str(entry.id), *(str(oid) for _, oid in page_entries))
        value = _parsed.get(key)
        if value is None:
            value = _parse(repo, name, path, entry.id, page_entries)
            _parsed[key] = value
        if isinstance(value, str):
            broken[name] = value
        else:
            statuses[name] = value
    return Snapshot(commit, statuses, broken)


def _parse(
    repo: pygit2.Repository, name: str, path: str, oid: Any, pages: Sequence[tuple[str, Any]]
) -> RolloutStatus | str:
    try:
        main = load_yaml(path, _blob(repo, oid))
        if not isinstance(main, dict):
            return f"{path}: not a mapping"
        page_data = {p: load_yaml(p, _blob(repo, page_oid)) for p, page_oid in pages}
        status = status_from_files(main, page_data)
    except YamlProblem as exc:
        return str(exc.problem)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{path}: {type(exc).__name__}: {exc}"
    if status.name != name:
        return f"{path}: metadata.name is {status.name!r}"
    return status


@dataclass(frozen=True)
class CommitRecord:
    commit: str
    parents: tuple[str, ...]
    author: str
    message: str
    time: int  # committer time, whole seconds
    paths: tuple[str, ...]  # files changed against the first parent
    snapshot: Snapshot

    @property
    def by_daemon(self) -> bool:
        return self.author == DAEMON_NAME


def _changed(repo: pygit2.Repository, commit: pygit2.Commit) -> tuple[str, ...]:
    if commit.parents:
        diff = commit.parents[0].tree.diff_to_tree(commit.tree)
    else:
        diff = commit.tree.diff_to_tree(swap=True)
    paths = set()
    for delta in diff.deltas:
        paths.add(delta.new_file.path)
        paths.add(delta.old_file.path)
    return tuple(sorted(paths))


def walk(repo: pygit2.Repository, tip: str) -> list[CommitRecord]:
    """Every commit reachable from ``tip``, oldest first (topological)."""
    from pygit2.enums import SortMode

    records: list[CommitRecord] = []
    for commit in repo.walk(tip, SortMode.TOPOLOGICAL | SortMode.REVERSE):
        records.append(
            CommitRecord(
                commit=str(commit.id),
                parents=tuple(str(p) for p in commit.parent_ids),
                author=commit.author.name,
                message=commit.message,
                time=commit.commit_time,
                paths=_changed(repo, commit),
                snapshot=read_statuses(repo, str(commit.id)),
            )
        )
    return records


# -- history -----------------------------------------------------------------


def settled(node: Any, on_failure: str) -> bool:
    """docs/rollouts.md: a node has passed or a person settled it
    (observe: it has a verdict)."""
    if node.state in ("succeeded", "skipped"):
        return True
    return on_failure == "observe" and node.verdict is not None


@dataclass
class HistoryReport:
    violations: list[str] = field(default_factory=list)
    commits: int = 0
    daemon_commits: int = 0
    status_files_checked: int = 0


def check_history(history: Sequence[CommitRecord]) -> HistoryReport:
    report = HistoryReport(commits=len(history))
    v = report.violations
    last: dict[str, RolloutStatus] = {}  # rollout -> status the daemon last wrote
    for record in history:
        short = record.commit[:10]
        if len(record.parents) > 1:
            v.append(f"{short}: a merge commit: history is not linear")
        touched = {
            p.split("/")[1].removesuffix(".yaml")
            for p in record.paths
            if p.startswith("status/") and p.count("/") >= 1
        }
        if not record.by_daemon:
            for name in touched:  # a person edited status: a new baseline
                last.pop(name, None)
            continue
        report.daemon_commits += 1
        outside = [p for p in record.paths if not p.startswith("status/")]
        if outside:
            v.append(f"{short}: the daemon wrote outside status/: {outside}")
        for name in sorted(touched - {"README.md", "README"}):
            if name in record.snapshot.broken:
                v.append(
                    f"{short}: status/{name}.yaml does not parse: {record.snapshot.broken[name]}"
                )
                continue
            new = record.snapshot.statuses.get(name)
            if new is None:
                continue  # removed (not by the daemon, or the check below catches writes)
            report.status_files_checked += 1
            old = last.get(name)
            if old is not None:
                v.extend(f"{short}: {name}: {problem}" for problem in _backwards(old, new))
            v.extend(f"{short}: {name}: {problem}" for problem in _batch_order(old, new))
            last[name] = new
    return report


def _backwards(old: RolloutStatus, new: RolloutStatus) -> list[str]:
    found: list[str] = []
    if old.phase in TERMINAL_PHASES and new.phase != old.phase:
        found.append(f"terminal phase {old.phase} became {new.phase}")
    if old.start_commit is not None and new.start_commit != old.start_commit:
        found.append(f"start commit changed from {old.start_commit} to {new.start_commit}")
    before = {n.name: n for n in old.nodes}
    for node in new.nodes:
        prev = before.get(node.name)
        if prev is None:
            continue
        if node.attempt < prev.attempt:
            found.append(f"{node.name}: attempt went back from {prev.attempt} to {node.attempt}")
        elif (
            node.attempt == prev.attempt
            and prev.verdict is not None
            and node.verdict != prev.verdict
        ):
            found.append(
                f"{node.name}: verdict of attempt {node.attempt} rewritten "
                f"from {prev.verdict} to {node.verdict}"
            )
    return found


def _batch_order(old: RolloutStatus | None, new: RolloutStatus) -> list[str]:
    """Nodes newly dispatched (their attempt went up) in this commit, in a
    batch after one that is not settled in this same commit."""
    if new.frozen is None:
        return []
    on_failure = new.frozen.on_failure
    before = {n.name: n.attempt for n in old.nodes} if old is not None else {}
    found: list[str] = []
    for node in new.nodes:
        if node.attempt <= before.get(node.name, 0) or node.batch <= 1:
            continue
        waiting = [
            f"{m.name}={m.state}"
            for m in new.nodes
            if m.batch < node.batch and not settled(m, on_failure)
        ]
        if waiting:
            found.append(
                f"{node.name} (batch {node.batch}) dispatched as attempt {node.attempt} "
                f"while earlier batches are not settled: {', '.join(waiting)}"
            )
    return found


def lost_commits(repo: pygit2.Repository, tip: str, commits: Iterable[str]) -> list[str]:
    """The commits (ids or unique prefixes) not in the history of ``tip``."""
    reachable = {str(c.id) for c in repo.walk(tip)}
    return [c for c in commits if not any(r.startswith(c) for r in reachable)]


# -- jobs --------------------------------------------------------------------


@dataclass
class JobReport:
    violations: list[str] = field(default_factory=list)
    received: int = 0  # distinct job ids an agent received
    executed_twice: int = 0
    payload_variants: int = 0  # job ids seen with more than one payload


def recorded_jobs(history: Sequence[CommitRecord]) -> dict[str, tuple[int, str]]:
    """Job id -> (time, commit) of the first daemon commit recording it."""
    first: dict[str, tuple[int, str]] = {}
    for record in history:
        if not record.by_daemon:
            continue
        for status in record.snapshot.statuses.values():
            for node in status.nodes:
                for job_id in (node.job_id, node.restore.job_id if node.restore else None):
                    if job_id and job_id not in first:
                        first[job_id] = (record.time, record.commit)
    return first


def unrecorded_jobs(repo: pygit2.Repository, tip: str, received: Iterable[str]) -> list[str]:
    """The job ids in ``received`` that no status in the history of ``tip``
    records. Taken right after a SIGKILL, anything listed was sent before
    the status recording it reached the branch (invariant 1)."""
    recorded = recorded_jobs(walk(repo, tip))
    return sorted(set(received) - set(recorded))


def check_jobs(
    history: Sequence[CommitRecord],
    stats: Mapping[str, Any],
    journal: Sequence[Mapping[str, Any]],
    *,
    clocks_agree: bool = True,
) -> JobReport:
    """``stats`` is ``GET /v1/sim/stats``; ``journal`` the simulator's
    journal. ``clocks_agree``: the simulated nodes' clocks are not skewed,
    so their ``finishedAt`` can be compared with the daemon's ``issuedAt``."""
    report = JobReport(received=len(stats.get("received", {})))
    v = report.violations
    for job_id, count in stats.get("executed", {}).items():
        if count > 1:
            report.executed_twice += 1
            v.append(f"job {job_id} executed {count} times")
    for job_id, count in stats.get("payloadVariants", {}).items():
        if count > 1:
            report.payload_variants += 1
            v.append(f"job {job_id} was sent with {count} different payloads")
    recorded = recorded_jobs(history)
    for job_id in stats.get("received", {}):
        if job_id not in recorded:
            v.append(f"job {job_id} reached an agent but no committed status records it")
    if clocks_agree and history:
        v.extend(_journal_batch_order(history[-1].snapshot, journal))
    return report


def _journal_batch_order(final: Snapshot, journal: Sequence[Mapping[str, Any]]) -> list[str]:
    """No apply job of batch k+1 issued before the jobs that settled batch k
    finished (the simulator's clock and the daemon's are one clock here)."""
    finished: dict[str, datetime] = {}
    first_issued: dict[tuple[str, str], datetime] = {}  # (rollout, node) -> first apply
    for event in journal:
        if event.get("e") == "finish" and event.get("finishedAt"):
            finished[event["jobId"]] = parse_time(event["finishedAt"])
        elif event.get("e") == "accept" and event["payload"]["kind"] == "apply":
            payload = event["payload"]
            key = (payload["rollout"], payload["node"])
            issued = parse_time(payload["issuedAt"])
            first_issued[key] = min(issued, first_issued.get(key, issued))
    found: list[str] = []
    for name, status in final.statuses.items():
        passed = [
            (n, finished[n.job_id])
            for n in status.nodes
            if n.state == "succeeded" and n.job_id in finished
        ]
        for node in status.nodes:
            issued_at = first_issued.get((name, node.name))
            if issued_at is None:
                continue
            for earlier, done in passed:
                # The daemon's clock reads whole seconds: ``issued_at`` is floored.
                if earlier.batch < node.batch and done >= issued_at + SECOND:
                    found.append(
                        f"{name}: {node.name} (batch {node.batch}) was issued a job at "
                        f"{issued_at.isoformat()}, before {earlier.name} (batch "
                        f"{earlier.batch}) finished at {done.isoformat()}"
                    )
    return found


# -- outcomes ----------------------------------------------------------------


def outcome(status: RolloutStatus) -> tuple[Any, ...]:
    """What must be the same after a crash as in an uninterrupted run: the
    phase, the hold, and each node's state, attempt and verdict."""
    return (
        status.phase,
        status.hold.reason if status.hold else None,
        tuple((n.name, n.state, n.attempt, n.verdict) for n in status.nodes),
    )
