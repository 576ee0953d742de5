"""The Git store on a remote: a bare mirror in a cache directory, fetch on
refresh, a fast-forward push with a lease on what was read. Served over
file:// and over smart HTTP (git http-backend on 127.0.0.1), where a server
refusal shows only in the push report."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from pygit2.enums import CredentialType

from reconciler.git.store import TOKEN_ENV, GitStore, _Callbacks
from reconciler.spec.errors import RefMoved, StoreError
from tests.kit.git import (
    clone,
    commit_and_push,
    git,
    head,
    install_hook,
    log,
    ls_tree,
    make_bare_repo,
    show,
)
from tests.kit.git_http import GitHttpServer


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    return make_bare_repo(tmp_path, {"rollouts/llama.yaml": "v1\n", "nodes/a.yaml": "a\n"})


def open_remote(url: str, tmp_path: Path, branch: str = "main") -> GitStore:
    return GitStore.open(url, branch, cache_dir=tmp_path / "cache")


def test_file_url_is_mirrored_fetched_and_pushed(tmp_path: Path, bare: Path) -> None:
    store = open_remote(f"file://{bare}", tmp_path)
    assert store.is_remote
    mirrors = list((tmp_path / "cache").iterdir())
    assert len(mirrors) == 1 and mirrors[0].name.endswith(".git")

    work = clone(bare, tmp_path / "work")
    pushed = commit_and_push(work, {"rollouts/llama.yaml": "v2\n"}, "edit llama")
    tip = store.refresh()
    assert tip == pushed
    assert store.blob(store.files(tip, "rollouts")["rollouts/llama.yaml"]) == b"v2\n"

    written = store.commit("main", tip, {"status/llama.yaml": b"phase: running\n"}, "status")

    assert head(bare, "main") == written
    assert log(bare, "main")[:2] == [written, pushed]
    assert show(bare, "main", "status/llama.yaml") == "phase: running"
    assert store.tip("main") == written  # the mirror follows its own push
    assert git("for-each-ref", "--format=%(refname)", cwd=bare).splitlines() == [
        "refs/heads/main"
    ]  # nothing left on the remote either
    assert git("for-each-ref", "--format=%(refname)", cwd=mirrors[0]).splitlines() == [
        "refs/heads/main"
    ]  # no helper ref left behind


def test_a_push_racing_a_person_raises_refmoved_and_changes_nothing(
    tmp_path: Path, bare: Path
) -> None:
    store = open_remote(f"file://{bare}", tmp_path)
    read = store.refresh()
    assert read is not None
    work = clone(bare, tmp_path / "work")
    theirs = commit_and_push(work, {"rollouts/llama.yaml": "paused\n"}, "pause")

    with pytest.raises(RefMoved):
        store.commit("main", read, {"status/llama.yaml": b"phase: running\n"}, "status")

    assert head(bare, "main") == theirs
    assert git("for-each-ref", "--format=%(refname)", cwd=bare) == "refs/heads/main"
    assert store.tip("main") == read  # the mirror is not moved by a failed push
    again = store.commit("main", store.refresh(), {"status/llama.yaml": b"paused\n"}, "s")
    assert log(bare, "main")[:2] == [again, theirs]


def test_history_force_pushed_backwards_is_fetched_as_it_is(tmp_path: Path, bare: Path) -> None:
    store = open_remote(f"file://{bare}", tmp_path)
    base = store.refresh()
    assert base is not None
    work = clone(bare, tmp_path / "work")
    newer = commit_and_push(work, {"nodes/b.yaml": "b\n"}, "b")
    assert store.refresh() == newer

    git("push", "-q", "--force", "origin", f"{base}:main", cwd=work)

    assert store.refresh() == base
    assert not store.is_descendant(base, newer)


def test_status_branch_on_a_remote_starts_as_an_orphan(tmp_path: Path, bare: Path) -> None:
    store = open_remote(f"file://{bare}", tmp_path)
    first = store.commit("reconciler-status", None, {"status/llama.yaml": b"x\n"}, "init")

    assert head(bare, "reconciler-status") == first
    assert ls_tree(bare, "reconciler-status") == ["status/llama.yaml"]
    assert git("rev-list", "--parents", "reconciler-status", cwd=bare) == first
    with pytest.raises(RefMoved):
        store.commit("reconciler-status", None, {"status/llama.yaml": b"y\n"}, "again")
    second = store.commit("reconciler-status", first, {"status/llama.yaml": b"y\n"}, "next")
    assert log(bare, "reconciler-status") == [second, first]


def test_a_branch_deleted_on_the_remote_reads_as_absent(tmp_path: Path, bare: Path) -> None:
    store = open_remote(f"file://{bare}", tmp_path)
    store.commit("scratch", None, {"status/x": b"x"}, "x")
    git("branch", "-D", "scratch", cwd=bare)
    store.refresh()
    assert store.tip("scratch") is None


def test_remote_refusals(tmp_path: Path, bare: Path) -> None:
    with pytest.raises(StoreError, match="'prod' not found") as info:
        open_remote(f"file://{bare}", tmp_path, branch="prod")
    assert "main" in info.value.hint
    with pytest.raises(StoreError, match="cannot fetch"):
        open_remote(f"file://{tmp_path / 'nothing.git'}", tmp_path)


def test_a_mirror_is_reused_across_opens(tmp_path: Path, bare: Path) -> None:
    first = open_remote(f"file://{bare}", tmp_path)
    second = open_remote(f"file://{bare}", tmp_path)
    assert Path(first.repository().path) == Path(second.repository().path)
    assert second.refresh() == head(bare, "main")


# -- smart HTTP: a real protocol --------------------------------------------


def test_https_token_is_sent_through_callbacks_and_never_written(
    tmp_path: Path, bare: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "tok-4c1d2f"
    with GitHttpServer(tmp_path, token=token) as server:
        url = server.url_for(bare)
        monkeypatch.delenv(TOKEN_ENV, raising=False)
        with pytest.raises(StoreError) as info:
            open_remote(url, tmp_path)
        assert TOKEN_ENV in info.value.hint

        monkeypatch.setenv(TOKEN_ENV, token)
        store = open_remote(url, tmp_path)
        tip = store.refresh()
        written = store.commit("main", tip, {"status/a.yaml": b"a\n"}, "status over http")

        assert head(bare, "main") == written
        assert any(ok for _, _, ok in server.requests)
    for path in (tmp_path / "cache").rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path


def test_a_push_refused_by_a_server_hook_is_an_error_not_a_race(tmp_path: Path, bare: Path) -> None:
    with GitHttpServer(tmp_path) as server:
        store = open_remote(server.url_for(bare), tmp_path)
        tip = store.refresh()
        install_hook(bare, "pre-receive", 'echo "status writes are frozen" >&2; exit 1')

        with pytest.raises(StoreError) as info:
            store.commit("main", tip, {"status/a.yaml": b"a\n"}, "status")

        assert not isinstance(info.value, RefMoved)
        assert "hook declined" in info.value.message
        assert head(bare, "main") == tip
        assert store.tip("main") == tip


def test_a_push_race_over_http_raises_refmoved(tmp_path: Path, bare: Path) -> None:
    with GitHttpServer(tmp_path) as server:
        store = open_remote(server.url_for(bare), tmp_path)
        read = store.refresh()
        work = clone(bare, tmp_path / "work")
        theirs = commit_and_push(work, {"nodes/z.yaml": "z\n"}, "z")

        with pytest.raises(RefMoved):
            store.commit("main", read, {"status/a.yaml": b"a\n"}, "status")
        assert head(bare, "main") == theirs


def test_an_unreachable_remote_is_a_store_error(tmp_path: Path) -> None:
    with GitHttpServer(tmp_path) as server:
        url = f"{server.url}/fleet.git"
    with pytest.raises(StoreError, match="cannot fetch"):
        open_remote(url, tmp_path)


def test_ssh_credentials_come_from_the_key_file(tmp_path: Path) -> None:
    """No SSH server here: check what libgit2 is handed when it asks."""
    key = tmp_path / "id_ed25519"
    key.write_text("not read until libssh2 connects\n")
    (tmp_path / "id_ed25519.pub").write_text("ssh-ed25519 AAAA test\n")
    creds = _Callbacks(key).credentials("ssh://host/x.git", "deploy", CredentialType.SSH_KEY)
    assert creds.credential_tuple == ("deploy", str(key) + ".pub", str(key), "")
    agent = _Callbacks(None).credentials("ssh://host/x.git", None, CredentialType.SSH_KEY)
    assert agent.credential_tuple[0] == "git"


def test_a_refusal_while_the_branch_moved_meanwhile_is_a_race(tmp_path: Path, bare: Path) -> None:
    """Whatever a server says, if the branch moved after we listed it, re-read."""
    with GitHttpServer(tmp_path) as server:
        store = open_remote(server.url_for(bare), tmp_path)
        read = store.refresh()
        work = clone(bare, tmp_path / "work")
        theirs = commit_and_push(work, {"nodes/z.yaml": "z\n"}, "z")
        git("update-ref", "refs/heads/main", read or "", cwd=bare)  # back, for now
        # The hook lands their commit during our push, then refuses ours.
        install_hook(
            bare,
            "pre-receive",
            "unset GIT_QUARANTINE_PATH GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES\n"
            f"git update-ref refs/heads/main {theirs}\n"
            'echo "cannot lock ref" >&2; exit 1',
        )

        with pytest.raises(RefMoved):
            store.commit("main", read, {"status/a.yaml": b"a\n"}, "status")
        assert head(bare, "main") == theirs


@pytest.mark.parametrize("transport", ["file", "http"])
def test_two_daemons_sharing_a_mirror_never_push_each_others_commits(
    tmp_path: Path, bare: Path, transport: str
) -> None:
    """Every commit a writer was told it landed is on the remote, with that
    writer's content; losers re-read. (Two stores, one cache directory.)"""
    if transport == "http":
        server = GitHttpServer(tmp_path)
        url = server.url_for(bare)
    else:
        url = f"file://{bare}"
    landed: dict[str, list[str]] = {"a": [], "b": []}
    failures: list[BaseException] = []

    def writer(name: str) -> None:
        try:
            write(name)
        except BaseException as e:  # reported by the main thread
            failures.append(e)

    def write(name: str) -> None:
        store = open_remote(url, tmp_path)  # both at once: one mirror is made
        while len(landed[name]) < 6:
            try:
                tip = store.refresh()
                landed[name].append(
                    store.commit(
                        "main",
                        tip,
                        {f"status/{name}.yaml": f"{name} {len(landed[name])}\n".encode()},
                        f"{name} writes",
                    )
                )
            except StoreError:
                pass  # RefMoved, or the other writer holds a ref lock: re-read

    threads = [threading.Thread(target=writer, args=(n,)) for n in landed]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failures == []
    assert [len(c) for c in landed.values()] == [6, 6]

    if transport == "http":
        server.close()
    on_remote = set(log(bare, "main"))
    for name, commits in landed.items():
        for n, commit_id in enumerate(commits):
            assert commit_id in on_remote, (name, n)
            assert show(bare, commit_id, f"status/{name}.yaml") == f"{name} {n}"
