"""``changed_paths``: which files differ between the position a pass read
last and the new one, pinned against ``git diff --name-only`` over random
sequences of commits made with the `git` binary (adds, edits, deletes,
renames, mode changes, nested node pages, a folder removed and re-added)
and rewinds (``reset --hard`` to an older commit and a force-push)."""

from __future__ import annotations

import os
import random
from pathlib import Path

from reconciler.git.history import changed_paths
from reconciler.git.store import GitStore
from tests.kit.git import clone, git, head, make_bare_repo

FOLDERS = ("rollouts", "nodes", "status")
FILES = ("reconciler.yaml",)


def git_names(work: Path, old: str, new: str) -> frozenset[str]:
    """What `git diff` names between two commits, limited as the daemon limits it."""
    out = git("diff", "--no-renames", "--name-only", old, new, "--", *FOLDERS, *FILES, cwd=work)
    # A top-level file under a limited pathspec, and nested files in the folders.
    return frozenset(line for line in out.splitlines() if line)


def random_edit(rng: random.Random, work: Path) -> None:
    present = [
        p.relative_to(work).as_posix()
        for p in work.rglob("*")
        if p.is_file() and ".git" not in p.parts
    ]
    move = rng.choice(["add", "add", "edit", "edit", "delete", "rename", "mode", "page", "drop"])
    if move == "add" or not present:
        folder = rng.choice(["rollouts", "nodes", "status", "docs"])
        path = work / folder / f"f{rng.randrange(40)}.yaml"
        if rng.random() < 0.1:
            path = work / "reconciler.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{rng.random()}\n")
        return
    target = work / rng.choice(present)
    if move == "edit":
        target.write_text(f"{rng.random()}\n")
    elif move == "delete":
        target.unlink()
    elif move == "rename":
        folder = rng.choice(["rollouts", "nodes", "status"])
        (work / folder).mkdir(exist_ok=True)
        target.rename(work / folder / f"moved{rng.randrange(40)}.yaml")
    elif move == "mode":
        os.chmod(target, target.stat().st_mode ^ 0o111)
    elif move == "page":
        page = work / "status" / f"r{rng.randrange(5)}" / f"nodes-000{rng.randrange(1, 4)}.yaml"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(f"{rng.random()}\n")
    elif move == "drop":
        folder = work / rng.choice(FOLDERS)
        if folder.exists():
            git("rm", "-r", "-q", "-f", "--ignore-unmatch", str(folder), cwd=work)


def test_changed_paths_match_git_diff_across_random_histories_with_rewinds(tmp_path: Path) -> None:
    bare = make_bare_repo(
        tmp_path, {"nodes/a.yaml": "a\n", "rollouts/r.yaml": "r\n", "status/r.yaml": "s\n"}
    )
    work = clone(bare, tmp_path / "work")
    git("config", "core.fileMode", "true", cwd=work)
    store = GitStore.open(str(bare))
    rng = random.Random(20)
    position = store.refresh()
    seen = [head(work)]
    checked = rewinds = 0
    for step in range(60):
        if step % 9 == 8 and len(seen) > 3:
            # A force-push back to an older commit, then new work on top of it.
            git("reset", "--hard", "-q", rng.choice(seen[:-1]), cwd=work)
            git("push", "-q", "-f", "origin", "HEAD:main", cwd=work)
            rewinds += 1
        else:
            for _ in range(rng.randrange(1, 4)):
                random_edit(rng, work)
            git("add", "-A", cwd=work)
            git("commit", "-q", "--allow-empty", "-m", f"step {step}", cwd=work)
            git("push", "-q", "-f", "origin", "HEAD:main", cwd=work)
        tip = store.refresh()
        assert tip is not None and position is not None
        assert store.changed_paths(position, tip, FOLDERS, FILES) == git_names(work, position, tip)
        # And from any older position, related or not.
        old = rng.choice(seen)
        assert store.changed_paths(old, tip, FOLDERS, FILES) == git_names(work, old, tip)
        checked += 2
        position = tip
        seen.append(tip)
    assert rewinds >= 5 and checked == 120


def test_a_first_read_is_every_file_and_equal_trees_are_nothing(tmp_path: Path) -> None:
    bare = make_bare_repo(
        tmp_path,
        {
            "reconciler.yaml": "kind: Settings\n",
            "nodes/a.yaml": "a\n",
            "status/big/nodes-0001.yaml": "p\n",
            "docs/x.yaml": "not read\n",
        },
    )
    store = GitStore.open(str(bare))
    tip = store.refresh()
    assert store.changed_paths(None, tip, FOLDERS, FILES) == {
        "reconciler.yaml",
        "nodes/a.yaml",
        "status/big/nodes-0001.yaml",
    }
    assert store.changed_paths(tip, tip, FOLDERS, FILES) == frozenset()
    repo = store.repository()
    tree = repo[tip].tree
    assert changed_paths(repo, tree, None, ("status",)) == {"status/big/nodes-0001.yaml"}
