"""The Git edge: status commits, history queries, branch wake-ups.

1. A status commit into a repository of 100,000 files: ``GitStore.commit``
   (TreeBuilder + compare-and-swap on a bare repository) against ``git add
   && git commit`` in a clone, alternating, same run. Target: under 10 ms and
   at least 10x faster than the git CLI.
2. History for 1,000 rollouts and 10,000 nodes over a few thousand commits:
   the first full walk, then an idle pass (advance on an unchanged tip plus
   every rollout's specCommit and firstSeenCommit: 1,000 x (rollout + 10 of
   its nodes + reconciler.yaml) lookups) and a pass after one new commit.
   Target for the idle pass: well under 10 ms.
3. Reads an idle pass makes: list ``nodes/`` (10,000) and ``rollouts/``.
4. Wake-up latency: ``git push`` into the bare repository until
   ``BranchWatcher.wait`` returns.

    .venv/bin/python bench/gitstore.py
    .venv/bin/python bench/gitstore.py --files 20000 --commits 500 --runs 5   # quick
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import pygit2

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    announce,
    commit_files,
    emit,
    git,
    make_bare,
    median,
    node_text,
    rollout_text,
    row,
    timed,
)

from reconciler.git.history import History
from reconciler.git.store import GitStore
from reconciler.git.watch import BranchWatcher

NODES = 10_000
ROLLOUTS = 1_000


def fleet_files(total: int) -> dict[str, bytes]:
    """10,000 nodes, 1,000 rollouts with status, the rest as status node files."""
    files: dict[str, bytes] = {"reconciler.yaml": b"apiVersion: reconciler/v1\nkind: Settings\n"}
    for i in range(NODES):
        files[f"nodes/n{i:05d}.yaml"] = node_text(
            f"n{i:05d}", f"http://10.0.{i // 250}.{i % 250}:8710", {"group": f"g{i % ROLLOUTS}"}
        )
    for i in range(ROLLOUTS):
        files[f"rollouts/r{i:04d}.yaml"] = rollout_text(
            f"r{i:04d}", selector={"group": f"g{i}"}, batch=2
        )
        files[f"status/r{i:04d}.yaml"] = f"phase: running\nn: {i}\n".encode()
    i = 0
    while len(files) < total:
        files[f"status/r{i % ROLLOUTS:04d}/nodes-{i // ROLLOUTS + 1:04d}.yaml"] = (
            f"- name: n{i:06d}\n  state: succeeded\n".encode()
        )
        i += 1
    return files


def bench_status_commit(tmp: Path, total: int, runs: int) -> None:
    print(f"-- status commit into a repository of {total:,} files, {runs} runs each, alternating")
    files = fleet_files(total)
    bare = tmp / "big.git"
    make_bare(bare, files)
    clone = tmp / "big-clone"
    started = time.perf_counter()
    git("clone", "--quiet", str(bare), str(clone), cwd=tmp)
    print(f"   (clone with checkout of {total:,} files: {time.perf_counter() - started:.1f} s)")
    store = GitStore.open(str(bare))
    ours: list[float] = []
    cli: list[float] = []

    def store_commit(run: int) -> None:
        tip = store.refresh()
        store.commit(
            "main",
            tip,
            {
                "status/r0007.yaml": f"phase: running\nrun: {run}\n".encode(),
                "status/README.md": f"# Rollouts\nrun {run}\n".encode(),
            },
            f"status: r0007 run {run}",
        )

    def cli_commit(run: int) -> None:
        (clone / "status" / "r0007.yaml").write_text(f"phase: running\nrun: {run}\n")
        (clone / "status" / "README.md").write_text(f"# Rollouts\nrun {run}\n")
        git("add", "status/r0007.yaml", "status/README.md", cwd=clone)
        git("commit", "--quiet", "-m", f"status: r0007 run {run}", cwd=clone)

    for run in range(runs):
        # Alternate which goes first, so neither always gets the warm cache.
        pair = [(ours, store_commit), (cli, cli_commit)]
        for results, action in pair if run % 2 == 0 else reversed(pair):
            results.append(timed(lambda a=action, r=run: a(r)) * 1000)  # type: ignore[misc]
    # The same commits back to back, without git's 100,000 stats and index
    # writes in between: what the daemon pays on a machine doing nothing else.
    alone = [timed(partial(store_commit, run)) * 1000 for run in range(runs, 2 * runs)]
    emit(
        [
            row("GitStore.commit, 2 status files, median", median(ours), "ms", 10, "target <"),
            row("git add + git commit in a clone, median", median(cli), "ms"),
            row("GitStore.commit / git CLI", median(ours) / median(cli), "x", 0.1, "target <"),
            row("GitStore.commit back to back (no git CLI between), median", median(alone), "ms"),
        ]
    )
    big = {f"status/r{i:04d}.yaml": f"phase: completed\n{i}\n".encode() for i in range(ROLLOUTS)}
    tip = store.refresh()
    emit(
        [
            row(
                "GitStore.commit, 1,000 status files in one commit",
                timed(lambda: store.commit("main", tip, big, "status: all")) * 1000,
                "ms",
            )
        ]
    )


def build_history(tmp: Path, commits: int, seed: int = 7) -> tuple[Path, list[str]]:
    """A fleet repository with `commits` first-parent commits after the seed:
    a third change a rollout or node (as people do), the rest are status."""
    rng = random.Random(seed)
    files: dict[str, bytes] = {"reconciler.yaml": b"kind: Settings\n"}
    for i in range(NODES):
        files[f"nodes/n{i:05d}.yaml"] = node_text(
            f"n{i:05d}", "http://127.0.0.1:1", {"group": f"g{i % ROLLOUTS}"}
        )
    bare = tmp / "history.git"
    make_bare(bare, files)
    repo = pygit2.Repository(str(bare))
    written = 0
    for c in range(commits):
        kind = rng.random()
        if kind < 0.2 and written < ROLLOUTS:
            change = {
                f"rollouts/r{written:04d}.yaml": rollout_text(
                    f"r{written:04d}", selector={"group": f"g{written}"}, batch=2
                )
            }
            written += 1
        elif kind < 0.33:
            n = rng.randrange(NODES)
            change = {f"nodes/n{n:05d}.yaml": f"kind: Node\nedit: {c}\n".encode()}
        else:
            r = rng.randrange(max(written, 1))
            change = {f"status/r{r:04d}.yaml": f"phase: running\nc: {c}\n".encode()}
        commit_files(repo, change, f"change {c}")
    # Any rollouts not yet written arrive in one commit, so there are 1,000.
    rest = {
        f"rollouts/r{i:04d}.yaml": rollout_text(f"r{i:04d}", selector={"group": f"g{i}"}, batch=2)
        for i in range(written, ROLLOUTS)
    }
    if rest:
        commit_files(repo, rest, "the remaining rollouts")
    rollouts = [f"rollouts/r{i:04d}.yaml" for i in range(ROLLOUTS)]
    return bare, rollouts


def spec_paths(i: int) -> list[str]:
    """A rollout file, the 10 node files its selector matches, reconciler.yaml."""
    return [
        f"rollouts/r{i:04d}.yaml",
        *(f"nodes/n{n:05d}.yaml" for n in range(i, NODES, ROLLOUTS)),
        "reconciler.yaml",
    ]


def bench_history(tmp: Path, commits: int, runs: int) -> None:
    print(f"-- history: {ROLLOUTS:,} rollouts, {NODES:,} nodes, {commits:,} commits")
    started = time.perf_counter()
    bare, _ = build_history(tmp, commits)
    print(f"   (building the history took {time.perf_counter() - started:.1f} s)")
    store = GitStore.open(str(bare))
    read = store.refresh()
    assert read is not None
    tip: str = read
    walks = []
    for _ in range(max(3, runs // 3)):
        history = History(store.repository())
        walks.append(timed(lambda h=history: h.advance(tip)) * 1000)  # type: ignore[misc]
    history = store.history()
    history.advance(tip)
    paths = [spec_paths(i) for i in range(ROLLOUTS)]

    def idle_pass() -> None:
        history.advance(tip)
        for i, group in enumerate(paths):
            history.last_change_of(group)
            history.first_added(f"rollouts/r{i:04d}.yaml")

    idle_pass()
    idle = [timed(idle_pass) * 1000 for _ in range(runs)]
    queries = sum(len(g) for g in paths) + ROLLOUTS

    # One new commit by a person, then the same queries.
    repo = store.repository()
    after_one = []
    for k in range(runs):
        new_tip = commit_files(repo, {f"nodes/n{k:05d}.yaml": f"edit {k}\n".encode()}, f"p{k}")

        def one_new(t: str = new_tip) -> None:
            history.advance(t)
            for i, group in enumerate(paths):
                history.last_change_of(group)
                history.first_added(f"rollouts/r{i:04d}.yaml")

        after_one.append(timed(one_new) * 1000)
    tip = new_tip
    nodes_list = [timed(lambda: store.files(tip, "nodes")) * 1000 for _ in range(runs)]
    rollouts_list = [timed(lambda: store.files(tip, "rollouts")) * 1000 for _ in range(runs)]
    emit(
        [
            row(f"History first full walk, {len(history):,} commits, median", median(walks), "ms"),
            row(
                f"idle pass: advance (no change) + {queries:,} history lookups, median",
                median(idle),
                "ms",
                10,
                "target <",
            ),
            row(
                "pass after 1 new commit: advance + the same lookups, median",
                median(after_one),
                "ms",
            ),
            row(
                "files(tip, 'nodes/'), 10,000 entries, cached by tree id, median",
                median(nodes_list),
                "ms",
            ),
            row("files(tip, 'rollouts/'), 1,000 entries, median", median(rollouts_list), "ms"),
        ]
    )


def bench_wakeup(tmp: Path, runs: int) -> None:
    print(f"-- wake-up latency: git push into a bare repository, {runs} pushes")
    bare = tmp / "watch.git"
    make_bare(bare, {"nodes/a.yaml": b"a\n"})
    work = tmp / "watch-clone"
    git("clone", "--quiet", str(bare), str(work), cwd=tmp)
    store = GitStore.open(str(bare))
    latencies = []
    with BranchWatcher.for_store(store) as watcher:
        for k in range(runs):
            (work / "nodes" / "a.yaml").write_text(f"a {k}\n")
            git("commit", "--quiet", "-am", f"edit {k}", cwd=work)
            git("push", "--quiet", "origin", "HEAD:main", cwd=work)
            pushed = time.perf_counter()
            woke = watcher.wait(5.0)
            latencies.append((time.perf_counter() - pushed) * 1000 if woke else 5000.0)
            while watcher.wait(0.05):
                pass
    emit([row("push returned -> wait() returned, median", median(latencies), "ms")])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--commits", type=int, default=3_000)
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument(
        "--only", choices=("commit", "history", "wakeup"), action="append", default=None
    )
    args = parser.parse_args()
    parts = args.only or ["commit", "history", "wakeup"]
    announce("bench/gitstore.py")
    with tempfile.TemporaryDirectory(prefix="bench-gitstore-") as d:
        tmp = Path(d)
        if "commit" in parts:
            bench_status_commit(tmp, args.files, args.runs)
        if "history" in parts:
            bench_history(tmp, args.commits, args.runs)
        if "wakeup" in parts:
            bench_wakeup(tmp, args.runs)


if __name__ == "__main__":
    main()
