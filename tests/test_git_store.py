"""The Git store on a local bare repository: reading committed trees without
a checkout, writing status in one commit, compare-and-swap of the branch,
refusals, the status branch and signed commits. Commits are made with the
`git` binary as a person would, and the store's commits are read back with
`git log` / `git show`."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pygit2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.git.store import (
    LARGE_BLOB,
    LARGE_TREE,
    GitStore,
    PiecewiseBlobs,
    adler32_combine,
    is_remote_location,
)
from reconciler.git.tree_reader import TreeReader
from reconciler.spec.errors import RefMoved, StoreError
from tests.kit.git import (
    clone,
    commit,
    commit_and_push,
    git,
    git_env,
    head,
    log,
    ls_tree,
    make_bare_repo,
    show,
)

FLEET = {
    "reconciler.yaml": "kind: Settings\n",
    "nodes/gpu-a1.yaml": "kind: Node\nname: gpu-a1\n",
    "nodes/gpu-a2.yaml": "kind: Node\nname: gpu-a2\n",
    "rollouts/llama.yaml": "kind: Rollout\nname: llama\n",
}


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    return make_bare_repo(tmp_path, FLEET)


@pytest.fixture
def store(bare: Path) -> GitStore:
    return GitStore.open(str(bare))


# -- reading ------------------------------------------------------------------


def test_reads_files_and_blobs_at_a_commit_without_a_checkout(
    tmp_path: Path, bare: Path, store: GitStore
) -> None:
    first = store.refresh()
    assert first == head(bare, "main")
    work = clone(bare, tmp_path / "work")
    second = commit_and_push(
        work, {"nodes/gpu-a3.yaml": "kind: Node\nname: gpu-a3\n", "nodes/deep/x.yaml": "x"}, "add"
    )

    assert store.refresh() == second
    nodes = store.files(second, "nodes")
    assert sorted(nodes) == ["nodes/gpu-a1.yaml", "nodes/gpu-a2.yaml", "nodes/gpu-a3.yaml"]
    assert store.blob(nodes["nodes/gpu-a3.yaml"]) == b"kind: Node\nname: gpu-a3\n"
    # The older commit still reads as it was: reads are by commit, not by checkout.
    assert sorted(store.files(first, "nodes")) == ["nodes/gpu-a1.yaml", "nodes/gpu-a2.yaml"]
    assert nodes["nodes/gpu-a1.yaml"] == store.files(first, "nodes")["nodes/gpu-a1.yaml"]
    assert store.files(second, "status") == {}
    settings = store.file_blob(second, "reconciler.yaml")
    assert settings is not None and store.blob(settings) == b"kind: Settings\n"
    assert store.file_blob(second, "missing.yaml") is None
    assert store.file_blob(second, "nodes") is None  # a folder is not a file


def test_subtree_ids_are_equal_exactly_when_nothing_below_changed(
    tmp_path: Path, bare: Path, store: GitStore
) -> None:
    first = store.refresh()
    assert first is not None
    work = clone(bare, tmp_path / "work")
    second = commit_and_push(work, {"nodes/gpu-a1.yaml": "kind: Node\nedited: 1\n"}, "edit")

    assert store.subtree_id(first, "rollouts") == store.subtree_id(second, "rollouts")
    assert store.subtree_id(first, "nodes") != store.subtree_id(second, "nodes")
    assert store.subtree_id(second, "status") is None


def test_commit_metadata_is_readable(store: GitStore) -> None:
    tip = store.refresh()
    assert tip is not None
    assert store.author(tip) == "Ada Operator <ada@example.com>"
    assert store.commit_message(tip) == "Initial fleet\n"
    assert store.signature(tip) is None


# -- writing -----------------------------------------------------------------


def test_one_commit_writes_several_files_and_deletes_one(bare: Path, store: GitStore) -> None:
    tip = store.refresh()
    assert tip is not None
    written = store.commit(
        "main",
        tip,
        {
            "status/llama.yaml": b"phase: running\n",
            "status/llama/nodes-0001.yaml": b"- gpu-a1\n",
            "status/README.md": b"# Rollouts\n",
        },
        "status: llama pending -> running",
    )

    assert head(bare, "main") == written
    assert log(bare, "main") == [written, tip]
    assert git("log", "-1", "--format=%an <%ae>|%cn <%ce>|%s", "main", cwd=bare) == (
        "reconciler <reconciler@localhost>|reconciler <reconciler@localhost>|"
        "status: llama pending -> running"
    )
    assert show(bare, "main", "status/llama.yaml") == "phase: running"
    assert show(bare, "main", "status/llama/nodes-0001.yaml") == "- gpu-a1"
    assert list(store.files(written, "status/llama")) == ["status/llama/nodes-0001.yaml"]
    assert sorted(store.files(written, "status")) == ["status/README.md", "status/llama.yaml"]
    assert ls_tree(bare, "main") == sorted(
        [*FLEET, "status/README.md", "status/llama.yaml", "status/llama/nodes-0001.yaml"]
    )

    deleted = store.commit(
        "main",
        written,
        {"status/llama/nodes-0001.yaml": None, "status/llama.yaml": b"phase: completed\n"},
        "status: llama completed",
    )
    assert git("diff", "--name-status", written, deleted, cwd=bare).splitlines() == [
        "M\tstatus/llama.yaml",
        "D\tstatus/llama/nodes-0001.yaml",
    ]
    # The emptied folder is gone, as git itself never stores empty trees.
    entries = git("ls-tree", "-r", "-t", "--name-only", "main", cwd=bare).splitlines()
    assert "status/llama" not in entries and "status/llama.yaml" in entries
    git("fsck", "--strict", "--no-progress", cwd=bare)


def test_a_large_folder_patched_from_its_kept_entries_is_the_tree_treebuilder_writes(
    bare: Path, store: GitStore
) -> None:
    # A folder of LARGE_TREE entries or more is patched, not rebuilt: over
    # random commits (files added, changed, removed; folders of pages added
    # and emptied; a file replacing a folder of the same name), each tree
    # is the one libgit2's TreeBuilder writes from the parent's, and git
    # reads every commit as valid.
    rng = random.Random(20)
    repo = pygit2.Repository(str(bare))
    names = [f"r{i:04d}" for i in range(LARGE_TREE + 40)]
    tip = store.refresh()
    assert tip is not None
    tip = store.commit("main", tip, {f"status/{n}.yaml": f"{n}\n".encode() for n in names}, "many")
    for round_ in range(40):
        changes: dict[str, bytes | None] = {}
        for _ in range(rng.randint(1, 6)):
            move = rng.random()
            # Folders of pages come and go on a few names, to meet each other.
            few = ["r0001", "r0001-x", "r0001.a", "r0002", "zz", "a"]
            name = rng.choice(few if move >= 0.6 or rng.random() < 0.3 else names)
            if move < 0.4:
                changes[f"status/{name}.yaml"] = f"{round_} {rng.random()}\n".encode()
            elif move < 0.6:
                changes[f"status/{name}.yaml"] = None
            elif move < 0.8:
                changes[f"status/{name}/nodes-{rng.randint(1, 2)}.yaml"] = b"- n1\n"
            elif move < 0.9:
                changes[f"status/{name}/nodes-1.yaml"] = None
                changes[f"status/{name}/nodes-2.yaml"] = None
            else:
                changes[f"status/{name}"] = b"a file where a folder may be\n"
        if rng.random() < 0.3:  # a dashboard large enough to be written by the store itself
            changes["status/README.md"] = f"# Rollouts {round_}\n{'| a row |' * 9000}".encode()
        parent = tip
        tip = store.commit("main", parent, changes, f"round {round_}")
        if tip == parent:
            continue
        assert _built_by_treebuilder(repo, parent, changes) == repo[tip].tree_id, round_
        # A file's blob in a folder the store keeps is looked up in its kept
        # entries: the same answer as libgit2's, for files, folders, absent names.
        fresh = TreeReader(pygit2.Repository(str(bare)), str(bare))
        looked = [*changes, "status/README.md", "status/r0001", "status/zz", "status/no.yaml"]
        for path in [*looked, f"status/{rng.choice(names)}.yaml", "status/r0001/nodes-1.yaml"]:
            assert store.file_blob(tip, path) == fresh.file_blob(tip, path), (round_, path)
    git("fsck", "--strict", "--no-progress", cwd=bare)
    dashboard = git("show", "main:status/README.md", cwd=bare)
    assert dashboard.startswith("# Rollouts") and len(dashboard) > LARGE_BLOB


def test_a_large_blob_given_in_pieces_is_its_content_and_compresses_only_new_pieces(
    bare: Path, store: GitStore
) -> None:
    # The dashboard goes to the store in pieces, most of them the objects
    # of the commit before. Over random commits (pieces kept, changed,
    # added, removed, moved, repeated, empty), each blob has the id of its
    # content, git reads back exactly the content, and git fsck finds every
    # object valid; a piece kept from the last write is not compressed again.
    rng = random.Random(22)
    repo = pygit2.Repository(str(bare))
    pool = [
        f"| row {i} {'x' * rng.randint(0, 300)} |\n".encode() * rng.randint(1, 60)
        for i in range(80)
    ]
    pieces = rng.sample(pool, 40)
    tip = store.refresh()
    assert tip is not None
    for round_ in range(25):
        for _ in range(rng.randint(0, 4)):
            move, at = rng.random(), rng.randrange(len(pieces))
            if move < 0.3:
                pieces[at] = rng.choice(pool) + f"{round_}".encode()
            elif move < 0.5 and len(pieces) > 10:
                del pieces[at]
            elif move < 0.7:
                pieces.insert(at, rng.choice([b"", b"\n", *pool]))
            else:
                pieces.insert(at, pieces.pop())
        head = f"# Rollouts {round_}\n".encode()
        parts = (head, *pieces, b"" if round_ % 2 else b"\n## tail\n")
        data = b"".join(parts)
        assert len(data) >= LARGE_BLOB
        changes: dict[str, bytes | None] = {"status/README.md": data, "status/a.yaml": head}
        tip = store.commit(
            "main", tip, changes, f"round {round_}", pieces={"status/README.md": parts}
        )
        blob_id = store.file_blob(tip, "status/README.md")
        assert blob_id == str(pygit2.hash(data)), round_
        assert store.blob(blob_id) == data
        shown = subprocess.run(
            ["git", "cat-file", "blob", blob_id], cwd=bare, capture_output=True, check=True
        )
        assert shown.stdout == data, round_
    git("fsck", "--strict", "--no-progress", cwd=bare)
    assert repo.head.target == pygit2.Oid(hex=tip)


def test_pieces_kept_from_the_last_write_are_reused_and_pieces_that_lie_are_refused(
    tmp_path: Path, bare: Path, store: GitStore
) -> None:
    blobs = PiecewiseBlobs(tmp_path)
    same = [f"{i} {'y' * 5000}\n".encode() for i in range(20)]
    first = blobs.write([b"head 1\n", *same])
    segments = {piece: blobs._kept[piece][0] for piece in same}
    second = blobs.write([b"head 2\n", *same[1:]])
    assert first != second
    for piece in same[1:]:
        assert blobs._kept[piece][0] is segments[piece]  # not compressed again
    assert same[0] not in blobs._kept  # only the last write's pieces are kept
    tip = store.refresh()
    assert tip is not None
    data = b"x" * LARGE_BLOB
    with pytest.raises(StoreError, match=r"pieces of status/README\.md are not its content"):
        store.commit(
            "main", tip, {"status/README.md": data}, "m", pieces={"status/README.md": [data, b"!"]}
        )
    assert store.refresh() == tip


def test_pieces_of_the_same_length_that_disagree_with_the_content_are_refused(
    bare: Path, store: GitStore
) -> None:
    # The content given for a path is the one source of its blob: pieces
    # the same length as it but with other bytes must not be written in
    # its place, whatever object holds the content.
    tip = store.refresh()
    assert tip is not None
    data = b"a" * LARGE_BLOB + b"tail\n"
    liar = [b"a" * LARGE_BLOB, b"TAIL\n"]
    assert sum(map(len, liar)) == len(data)
    with pytest.raises(StoreError, match=r"pieces of status/README\.md are not its content"):
        store.commit(
            "main", tip, {"status/README.md": data}, "m", pieces={"status/README.md": liar}
        )
    assert store.refresh() == tip
    # Content equal to the pieces, held by another object: written from them.
    honest = [b"a" * LARGE_BLOB, b"tail\n"]
    new = store.commit(
        "main",
        tip,
        {"status/README.md": bytes(bytearray(data))},
        "m",
        pieces={"status/README.md": honest},
    )
    blob_id = store.file_blob(new, "status/README.md")
    assert blob_id == str(pygit2.hash(data))
    shown = subprocess.run(
        ["git", "cat-file", "blob", blob_id], cwd=bare, capture_output=True, check=True
    )
    assert shown.stdout == data
    git("fsck", "--strict", "--no-progress", cwd=bare)


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_adler32_combine_is_the_checksum_of_the_two_together(first: bytes, second: bytes) -> None:
    assert adler32_combine(zlib.adler32(first), zlib.adler32(second), len(second)) == zlib.adler32(
        first + second
    )


def _built_by_treebuilder(
    repo: pygit2.Repository, parent: str, changes: dict[str, bytes | None]
) -> pygit2.Oid:
    """The tree TreeBuilder makes from the parent's with ``changes``."""

    def apply(tree: pygit2.Tree | None, changes: dict[str, bytes | None]) -> pygit2.Oid | None:
        builder = repo.TreeBuilder(tree) if tree is not None else repo.TreeBuilder()
        nested: dict[str, dict[str, bytes | None]] = {}
        for path, data in changes.items():
            head, sep, rest = path.partition("/")
            if sep:
                nested.setdefault(head, {})[rest] = data
            elif data is None:
                if tree is not None and head in tree:
                    builder.remove(head)
            else:
                builder.insert(head, repo.create_blob(data), pygit2.enums.FileMode.BLOB)
        for head, sub in nested.items():
            found = tree[head] if tree is not None and head in tree else None
            subtree = repo[found.id] if found is not None and found.type_str == "tree" else None
            assert subtree is None or isinstance(subtree, pygit2.Tree)
            oid = apply(subtree, sub)
            if oid is None:
                if found is not None:
                    builder.remove(head)
            else:
                builder.insert(head, oid, pygit2.enums.FileMode.TREE)
        return builder.write() if len(builder) else None

    commit = repo[parent]
    assert isinstance(commit, pygit2.Commit)
    built = apply(commit.tree, changes)
    assert built is not None
    return built


def test_a_commit_that_changes_nothing_is_not_made(bare: Path, store: GitStore) -> None:
    tip = store.refresh()
    assert tip is not None
    assert (
        store.commit(
            "main", tip, {"rollouts/llama.yaml": FLEET["rollouts/llama.yaml"].encode()}, "same"
        )
        == tip
    )
    assert log(bare, "main") == [tip]


def test_bad_paths_are_refused(store: GitStore) -> None:
    tip = store.refresh()
    for path in ("/status/x", "status//x", "../x", "status/", ".git/config"):
        with pytest.raises(StoreError):
            store.commit("main", tip, {path: b"x"}, "bad")


def test_branch_moved_between_read_and_commit_raises_and_writes_nothing(
    tmp_path: Path, bare: Path, store: GitStore
) -> None:
    read = store.refresh()
    assert read is not None
    work = clone(bare, tmp_path / "work")
    pushed = commit_and_push(
        work, {"rollouts/llama.yaml": "kind: Rollout\npaused: true\n"}, "pause"
    )

    with pytest.raises(RefMoved):
        store.commit("main", read, {"status/llama.yaml": b"phase: running\n"}, "status")

    assert head(bare, "main") == pushed
    assert log(bare, "main") == [pushed, read]

    # Re-reading and committing on the new tip works.
    again = store.commit("main", store.refresh(), {"status/llama.yaml": b"phase: paused\n"}, "s")
    assert log(bare, "main")[:2] == [again, pushed]


def test_a_held_ref_lock_is_a_clear_error_and_nothing_moves(bare: Path, store: GitStore) -> None:
    read = store.refresh()
    lock = bare / "refs" / "heads" / "main.lock"
    lock.write_text("held by a crashed git\n")
    with pytest.raises(StoreError) as info:
        store.commit("main", read, {"status/x.yaml": b"x\n"}, "status")
    assert not isinstance(info.value, RefMoved)
    assert str(lock) in info.value.hint
    assert head(bare, "main") == read


def test_a_ref_lock_released_meanwhile_is_waited_for(bare: Path, store: GitStore) -> None:
    read = store.refresh()
    lock = bare / "refs" / "heads" / "main.lock"
    lock.write_text("held\n")
    threading.Timer(0.1, lock.unlink).start()
    written = store.commit("main", read, {"status/x.yaml": b"x\n"}, "status")
    assert head(bare, "main") == written


def test_a_person_pushing_while_the_store_commits_loses_nothing(
    tmp_path: Path, bare: Path, store: GitStore
) -> None:
    """Two writers race: every person commit and every store commit survive."""
    work = clone(bare, tmp_path / "work")
    script = f"""
import subprocess, sys
env = {git_env()!r}
def git(*a):
    return subprocess.run(["git", *a], cwd={str(work)!r}, env=env, capture_output=True)
for i in range(8):
    open({str(work / "rollouts")!r} + f"/r{{i}}.yaml", "w").write(f"n: {{i}}\\n")
    git("add", "-A"); git("commit", "-q", "-m", f"person {{i}}")
    while git("push", "-q", "origin", "HEAD:main").returncode != 0:
        git("pull", "-q", "--rebase", "origin", "main")
"""
    person = subprocess.Popen([sys.executable, "-c", script])
    store_commits = 0
    while store_commits < 10:
        tip = store.refresh()
        try:
            store.commit(
                "main",
                tip,
                {"status/count.yaml": f"{store_commits}\n".encode()},
                f"store {store_commits}",
            )
            store_commits += 1
        except RefMoved:
            pass  # the person won this round: re-read and write again
        time.sleep(0.03)  # a daemon commits on change, not in a busy loop
    assert person.wait(timeout=60) == 0

    subjects = git("log", "--format=%s", "main", cwd=bare).splitlines()
    assert sorted(s for s in subjects if s.startswith("person")) == [
        f"person {i}" for i in range(8)
    ]
    assert sorted(s for s in subjects if s.startswith("store")) == sorted(
        f"store {i}" for i in range(10)
    )
    assert show(bare, "main", "status/count.yaml") == "9"


# -- refusals ----------------------------------------------------------------


def test_refuses_a_non_bare_repository_with_the_branch_checked_out(
    tmp_path: Path, bare: Path
) -> None:
    work = clone(bare, tmp_path / "work")
    with pytest.raises(StoreError) as info:
        GitStore.open(str(work))
    assert "checked out" in info.value.message
    assert "bare repository" in info.value.hint and "remote" in info.value.hint


def test_a_working_clone_can_be_read_but_not_written_read_only(tmp_path: Path, bare: Path) -> None:
    work = clone(bare, tmp_path / "work")
    store = GitStore.open(str(work), read_only=True)
    tip = store.refresh()
    assert tip == head(bare, "main")
    with pytest.raises(StoreError, match="read-only"):
        store.commit("main", tip, {"status/x.yaml": b"x\n"}, "status")
    assert head(work) == tip


def test_refuses_a_branch_checked_out_in_a_linked_worktree(tmp_path: Path, bare: Path) -> None:
    git("worktree", "add", "-q", str(tmp_path / "wt"), "main", cwd=bare)
    with pytest.raises(StoreError, match="checked out"):
        GitStore.open(str(bare))


def test_a_non_bare_repository_on_another_branch_is_accepted(tmp_path: Path, bare: Path) -> None:
    work = clone(bare, tmp_path / "work")
    git("checkout", "-q", "-b", "edit", cwd=work)
    store = GitStore.open(str(work))
    assert store.refresh() == head(bare, "main")


def test_refuses_a_missing_branch_naming_the_existing_ones(bare: Path) -> None:
    with pytest.raises(StoreError) as info:
        GitStore.open(str(bare), "production")
    assert "'production' not found" in info.value.message
    assert "main" in info.value.hint


def test_refuses_a_path_that_is_not_a_repository(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(StoreError, match="not a Git repository"):
        GitStore.open(str(plain))
    with pytest.raises(StoreError, match="does not exist"):
        GitStore.open(str(tmp_path / "absent"))


def test_a_subfolder_of_a_repository_is_not_taken_for_it(bare: Path) -> None:
    with pytest.raises(StoreError, match="not a Git repository"):
        GitStore.open(str(bare / "refs"))


def test_remote_locations_are_told_from_paths() -> None:
    for remote in (
        "file:///srv/fleet.git",
        "ssh://git@host/fleet.git",
        "https://forge.example/org/fleet.git",
        "git@github.com:org/fleet.git",
        "host:fleet.git",
    ):
        assert is_remote_location(remote), remote
    for local in ("/srv/fleet.git", "fleet.git", "./a:b", "../fleet"):
        assert not is_remote_location(local), local


# -- status branch -----------------------------------------------------------


def test_status_branch_starts_with_an_orphan_commit_holding_only_status(
    bare: Path, store: GitStore
) -> None:
    main_tip = store.refresh()
    assert store.tip("status") is None

    first = store.commit("status", None, {"status/llama.yaml": b"phase: pending\n"}, "status: init")

    assert store.tip("status") == first
    assert git("rev-list", "--parents", "status", cwd=bare) == first  # no parent
    assert ls_tree(bare, "status") == ["status/llama.yaml"]
    assert head(bare, "main") == main_tip  # the tracked branch is untouched

    second = store.commit("status", first, {"status/llama.yaml": b"phase: running\n"}, "s2")
    assert log(bare, "status") == [second, first]

    # A second orphan commit would lose the first: refused as a lost race.
    with pytest.raises(RefMoved):
        store.commit("status", None, {"status/llama.yaml": b"x\n"}, "again")
    with pytest.raises(RefMoved):
        store.commit("status", first, {"status/llama.yaml": b"x\n"}, "stale")
    assert head(bare, "status") == second


# -- signing -----------------------------------------------------------------


def test_signed_commit_carries_what_the_sign_callable_returned(bare: Path, store: GitStore) -> None:
    tip = store.refresh()
    armored = "-----BEGIN SSH SIGNATURE-----\nU1NIU0lHAAAAAQ==\n-----END SSH SIGNATURE-----\n"
    seen: list[bytes] = []

    def sign(payload: bytes) -> str:
        seen.append(payload)
        return armored

    written = store.commit("main", tip, {"status/a.yaml": b"a\n"}, "signed status", sign=sign)

    raw = git("cat-file", "commit", written, cwd=bare)
    header = raw.split("\n\n", 1)[0]
    assert (
        "gpgsig -----BEGIN SSH SIGNATURE-----\n U1NIU0lHAAAAAQ==\n -----END SSH SIGNATURE-----"
        in header
    )
    sig = store.signature(written)
    assert sig is not None
    assert sig[0].strip() == armored.strip()
    assert sig[1] == seen[0]  # the payload handed to the signer is what git verifies
    assert seen[0].startswith(b"tree ") and seen[0].endswith(b"\n\nsigned status\n")
    assert head(bare, "main") == written
    git("fsck", "--strict", "--no-progress", cwd=bare)


def test_a_failing_signer_moves_nothing(bare: Path, store: GitStore) -> None:
    tip = store.refresh()

    def sign(payload: bytes) -> str:
        raise StoreError("key unreadable")

    with pytest.raises(StoreError, match="key unreadable"):
        store.commit("main", tip, {"status/a.yaml": b"a\n"}, "s", sign=sign)
    assert head(bare, "main") == tip


def test_repository_escape_hatch_is_the_same_repository(bare: Path, store: GitStore) -> None:
    repo = store.repository()
    assert isinstance(repo, pygit2.Repository)
    assert Path(repo.path).resolve() == bare.resolve()


def test_commit_identity_is_configurable(bare: Path) -> None:
    store = GitStore.open(str(bare), name="fleet-bot", email="bot@fleet.example")
    tip = store.refresh()
    written = store.commit("main", tip, {"status/a.yaml": b"a\n"}, "s")
    assert store.author(written) == "fleet-bot <bot@fleet.example>"
    assert git("log", "-1", "--format=%cn <%ce>", cwd=bare) == "fleet-bot <bot@fleet.example>"


def test_git_commit_in_a_clone_reads_back_through_the_store(tmp_path: Path, bare: Path) -> None:
    work = clone(bare, tmp_path / "work")
    local = commit(work, {"rollouts/new.yaml": "x\n"}, "not pushed")
    store = GitStore.open(str(bare))
    # Unpushed commits do not exist for the daemon.
    assert store.refresh() != local
    assert "rollouts/new.yaml" not in store.files(store.refresh() or "", "rollouts")
