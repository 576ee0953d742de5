"""History facts the daemon reads each pass: the newest first-parent commit
that changed a spec file, the commit that first added it, a total order,
incremental advance, and detection of history rewritten backwards. Commits
are made by a person with the `git` binary and by the store itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from gitutil import clone, commit, commit_and_push, git, head, make_bare_repo

from reconciler.gitstore import GitStore


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
    assert dropped not in history
    assert history.full_walks == 2


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
