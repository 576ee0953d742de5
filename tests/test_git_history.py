"""History facts the daemon reads each pass: the newest first-parent commit
that changed a spec file, the commit that first added it, a total order,
incremental advance, and detection of history rewritten backwards. Commits
are made by a person with the `git` binary and by the store itself."""

from __future__ import annotations

import random
from pathlib import Path

import pygit2
import pytest

from reconciler.git.history import History
from reconciler.git.store import GitStore
from tests.kit.git import clone, commit, commit_and_push, git, head, make_bare_repo


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    return make_bare_repo(
        tmp_path,
        {
            "reconciler.yaml": "kind: Settings\n",
            "nodes/a.yaml": "a\n",
            "nodes/b.yaml": "b\n",
        },
    )


@pytest.fixture
def work(tmp_path: Path, bare: Path) -> Path:
    return clone(bare, tmp_path / "work")


def test_status_only_commits_never_count_as_changes(bare: Path, work: Path) -> None:
    store = GitStore.open(str(bare))
    added = commit_and_push(work, {"rollouts/llama.yaml": "v1\n"}, "add llama")
    tip = store.refresh()
    assert tip is not None
    for i in range(3):
        tip = store.commit("main", tip, {"status/llama.yaml": f"{i}\n".encode()}, f"status {i}")

    history = store.history()
    history.advance(tip)

    assert history.last_change("rollouts/llama.yaml") == added
    assert history.first_added("rollouts/llama.yaml") == added
    assert history.last_change("status/llama.yaml") is None
    assert history.last_change("rollouts/other.yaml") is None
    assert list(history.change_commits()) == [
        added,
        git("rev-list", "--max-parents=0", "main", cwd=bare),
    ]


def test_last_change_first_added_and_deletion(bare: Path, work: Path) -> None:
    store = GitStore.open(str(bare))
    root = head(bare, "main")
    added = commit_and_push(work, {"rollouts/llama.yaml": "v1\n"}, "add")
    edited = commit_and_push(work, {"rollouts/llama.yaml": "v2\n"}, "edit")
    settings = commit_and_push(work, {"reconciler.yaml": "kind: Settings\nx: 1\n"}, "settings")
    node_gone = commit_and_push(work, {"nodes/b.yaml": None}, "retire b")
    history = store.history()
    history.advance(node_gone)

    assert history.first_added("rollouts/llama.yaml") == added
    assert history.last_change("rollouts/llama.yaml") == edited
    assert history.first_added("reconciler.yaml") == root
    assert history.last_change("reconciler.yaml") == settings
    assert history.last_change("nodes/a.yaml") == root
    assert history.last_change("nodes/b.yaml") == node_gone  # a deletion is a change
    assert history.first_added("nodes/b.yaml") == root

    # The newest of several paths, e.g. a rollout's specCommit.
    assert history.last_change_of(["rollouts/llama.yaml", "nodes/a.yaml"]) == edited
    assert history.last_change_of(["rollouts/llama.yaml", "reconciler.yaml"]) == settings
    assert history.newest([None, root, added]) == added
    assert history.newest([]) is None
    positions = [history.position(c) for c in (root, added, edited, settings, node_gone)]
    assert positions == [0, 1, 2, 3, 4]

    readded = commit_and_push(work, {"nodes/b.yaml": "b again\n"}, "b is back")
    history.advance(readded)
    assert history.first_added("nodes/b.yaml") == root  # the first addition is kept
    assert history.last_change("nodes/b.yaml") == readded


def test_a_merge_counts_at_the_merge_commit_in_first_parent_order(bare: Path, work: Path) -> None:
    """A rollout written on a topic branch queues at the moment it is merged."""
    store = GitStore.open(str(bare))
    git("checkout", "-q", "-b", "topic", cwd=work)
    on_topic = commit(work, {"rollouts/late.yaml": "x\n"}, "write late")
    git("checkout", "-q", "main", cwd=work)
    early = commit_and_push(work, {"rollouts/early.yaml": "x\n"}, "early", pull=False)
    git("merge", "-q", "--no-ff", "-m", "merge topic", "topic", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    merge = head(work)
    history = store.history()
    history.advance(merge)

    assert history.first_added("rollouts/late.yaml") == merge
    assert history.first_added("rollouts/early.yaml") == early
    assert on_topic not in history
    assert history.position(merge) == history.position(early) + 1


def test_advance_walks_only_new_commits(bare: Path, work: Path) -> None:
    store = GitStore.open(str(bare))
    for i in range(5):
        commit_and_push(work, {f"rollouts/r{i}.yaml": "x\n"}, f"r{i}")
    history = store.history()
    history.advance(store.refresh() or "")
    assert (history.full_walks, history.walked, len(history)) == (1, 6, 6)

    history.advance(store.refresh() or "")  # nothing new: nothing walked
    assert history.walked == 6

    newer = [commit_and_push(work, {f"nodes/n{i}.yaml": "x\n"}, f"n{i}") for i in range(2)]
    tip = store.refresh()
    assert tip == newer[-1]
    history.advance(tip)

    assert (history.full_walks, history.walked, len(history)) == (1, 8, 8)
    assert history.last_change("nodes/n1.yaml") == newer[1]
    assert history.position(newer[1]) == 7
    assert store.history() is history  # one index per store, kept across passes


def test_history_rewritten_backwards_is_detected_and_reindexed(bare: Path, work: Path) -> None:
    store = GitStore.open(str(bare))
    kept = commit_and_push(work, {"rollouts/kept.yaml": "x\n"}, "kept")
    dropped = commit_and_push(work, {"rollouts/dropped.yaml": "x\n"}, "dropped")
    history = store.history()
    history.advance(store.refresh() or "")
    assert history.first_added("rollouts/dropped.yaml") == dropped

    git("push", "-q", "--force", "origin", f"{kept}:main", cwd=work)
    tip = store.refresh()

    assert tip == kept
    assert not store.is_descendant(tip, dropped)  # the caller refuses and reports
    assert store.is_descendant(dropped, kept)
    assert store.is_descendant(kept, kept)
    # If the caller goes on anyway, the index answers for the new line.
    history.advance(tip)
    assert history.first_added("rollouts/dropped.yaml") is None
    assert history.first_added("rollouts/kept.yaml") == kept
    assert dropped not in history
    assert (history.full_walks, history.rewinds) == (1, 1)  # stepped back, no full walk


def test_a_rewritten_line_with_new_commits_is_reindexed(bare: Path, work: Path) -> None:
    store = GitStore.open(str(bare))
    base = head(bare, "main")
    old = commit_and_push(work, {"rollouts/a.yaml": "x\n"}, "a")
    history = store.history()
    history.advance(old)

    git("reset", "-q", "--hard", base, cwd=work)
    replacement = commit(work, {"rollouts/b.yaml": "x\n"}, "b instead")
    git("push", "-q", "--force", "origin", "HEAD:main", cwd=work)
    assert not store.is_descendant(replacement, old)
    history.advance(replacement)

    assert history.last_change("rollouts/a.yaml") is None
    assert history.first_added("rollouts/b.yaml") == replacement
    assert history.position(replacement) == 1
    assert history.full_walks == 1


def test_a_pull_merge_pushed_by_a_person_steps_back_to_the_fork(
    tmp_path: Path, bare: Path, work: Path
) -> None:
    """`git pull` (merge) makes the person's commit the first parent and the
    daemon's status commit the second: first-parent history leaves the old
    tip. The index steps back to the fork and agrees with a fresh walk."""
    store = GitStore.open(str(bare))
    fork = head(bare, "main")
    status = store.commit("main", fork, {"status/r.yaml": b"phase: running\n"}, "status")
    history = store.history()
    history.advance(status)

    mine = commit(work, {"rollouts/r.yaml": "paused: true\n"}, "pause r")  # made before pulling
    git("pull", "-q", "--no-rebase", "--no-edit", "origin", "main", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    merge = store.refresh()
    assert merge is not None and merge != mine
    assert store.is_descendant(merge, status)  # nothing was rewritten

    history.advance(merge)

    assert (history.full_walks, history.rewinds) == (1, 1)
    assert status not in history  # off the first-parent line now
    assert history.last_change("rollouts/r.yaml") == mine
    assert history.first_added("rollouts/r.yaml") == mine
    assert [history.position(c) for c in (fork, mine, merge)] == [0, 1, 2]
    fresh = History(store.repository())
    fresh.advance(merge)
    for path in ("rollouts/r.yaml", "nodes/a.yaml", "nodes/b.yaml", "reconciler.yaml"):
        assert history.last_change(path) == fresh.last_change(path), path
        assert history.first_added(path) == fresh.first_added(path), path
    assert list(history.change_commits()) == list(fresh.change_commits())


def test_incremental_index_agrees_with_a_fresh_walk_through_merges_and_rewrites(
    tmp_path: Path,
) -> None:
    """A seeded random history built straight with pygit2 (fast): after every
    move of the branch, the incrementally advanced index equals a new one."""
    rng = random.Random(1)
    repo = pygit2.init_repository(str(tmp_path / "random.git"), bare=True)
    who = pygit2.Signature("Ada Operator", "ada@example.com", 1_780_000_000, 0)
    paths = (
        [f"rollouts/r{i}.yaml" for i in range(4)]
        + [f"nodes/n{i}.yaml" for i in range(4)]
        + ["reconciler.yaml", "status/r0.yaml"]
    )

    def tree_with(base: pygit2.Commit | None, path: str, data: bytes | None) -> pygit2.Oid:
        files = {}
        if base is not None:
            for p in paths:
                if p in base.tree:
                    blob = repo[base.tree[p].id]
                    assert isinstance(blob, pygit2.Blob)
                    files[p] = blob.data
        if data is None:
            files.pop(path, None)
        else:
            files[path] = data
        index = pygit2.Index()
        for p, content in files.items():
            index.add(pygit2.IndexEntry(p, repo.create_blob(content), pygit2.enums.FileMode.BLOB))
        return index.write_tree(repo)

    def make(parents: list[pygit2.Commit], path: str, data: bytes | None) -> pygit2.Commit:
        tree = tree_with(parents[0] if parents else None, path, data)
        oid = repo.create_commit(None, who, who, "m", tree, [p.id for p in parents])
        made = repo[oid]
        assert isinstance(made, pygit2.Commit)
        return made

    line: list[pygit2.Commit] = [make([], "reconciler.yaml", b"s\n")]
    incremental = History(repo)
    for step in range(60):
        roll = rng.random()
        path = rng.choice(paths)
        data = None if rng.random() < 0.2 else f"{step}\n".encode()
        if roll < 0.15 and len(line) > 3:  # force-push backwards, then maybe on
            line = line[: rng.randrange(1, len(line))]
        elif roll < 0.3:  # a pull-merge: a side commit becomes the first parent
            side = make([line[rng.randrange(len(line))]], path, data)
            line.append(make([side, line[-1]], rng.choice(paths), f"m{step}\n".encode()))
        else:
            line.append(make([line[-1]], path, data))
        tip = str(line[-1].id)
        incremental.advance(tip)
        fresh = History(repo)
        fresh.advance(tip)
        for p in paths:
            assert incremental.last_change(p) == fresh.last_change(p), (step, p)
            assert incremental.first_added(p) == fresh.first_added(p), (step, p)
        assert list(incremental.change_commits()) == list(fresh.change_commits()), step
        assert len(incremental) == len(fresh)
    assert incremental.rewinds > 0 and incremental.full_walks == 1


def test_changed_since_names_the_paths_a_walk_changed_and_none_after_a_rewind(
    bare: Path, work: Path
) -> None:
    store = GitStore.open(str(bare))
    history = store.history()
    history.advance(store.refresh() or "")
    start = history.generation
    commit_and_push(work, {"rollouts/a.yaml": "a\n"}, "add a")
    commit_and_push(work, {"nodes/b.yaml": "b2\n", "status/a.yaml": "s\n"}, "edit b")
    history.advance(store.refresh() or "")
    middle = history.generation

    assert history.changed_since(start) == {"rollouts/a.yaml", "nodes/b.yaml"}
    assert history.changed_since(middle) == frozenset()
    assert history.changed_since(0) is None  # before the first advance: everything

    # A force-push back to before "edit b": the index steps back, so any
    # fact may have changed since any earlier generation.
    git("push", "-q", "-f", "origin", "HEAD~1:main", cwd=work)
    history.advance(store.refresh() or "")
    assert history.changed_since(middle) is None
    assert history.changed_since(history.generation) == frozenset()
