"""The branch watcher: a `git push` into a bare repository wakes a waiting
loop quickly; unrelated writes do not; a remote is polled; stop() ends a
wait at once, from another thread or a signal handler."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from gitutil import GitHttpServer, clone, commit, commit_and_push, git, make_bare_repo

from reconciler.git.store import GitStore
from reconciler.git.watch import BranchWatcher


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    return make_bare_repo(tmp_path, {"nodes/a.yaml": "a\n"})


def drain(watcher: BranchWatcher) -> None:
    while watcher.wait(0.05):
        pass


def test_a_git_push_into_a_bare_repository_wakes_the_waiter(tmp_path: Path, bare: Path) -> None:
    work = clone(bare, tmp_path / "work")
    store = GitStore.open(str(bare))
    with BranchWatcher.for_store(store) as watcher:
        assert watcher.wait(0.1) is False  # nothing happened

        commit(work, {"rollouts/r.yaml": "x\n"}, "add r")
        git("push", "-q", "origin", "main", cwd=work)
        pushed_at = time.monotonic()

        assert watcher.wait(5.0) is True
        latency = time.monotonic() - pushed_at
        assert latency < 2.0, latency  # ~20 ms on an idle machine; generous for CI
        drain(watcher)
        assert watcher.wait(0.1) is False  # one push, one wake-up


def test_the_stores_own_commit_and_a_packed_ref_update_are_seen(tmp_path: Path, bare: Path) -> None:
    store = GitStore.open(str(bare))
    with BranchWatcher.for_store(store) as watcher:
        store.commit("main", store.refresh(), {"status/x.yaml": b"x\n"}, "status")
        assert watcher.wait(5.0)
        drain(watcher)

        git("pack-refs", "--all", cwd=bare)
        assert watcher.wait(5.0)


def test_a_commit_the_caller_acted_on_is_no_hint_and_a_push_after_it_is(
    tmp_path: Path, bare: Path
) -> None:
    """The daemon's own status commit (``acted_on`` as soon as it is made)
    wakes nobody; the plain behaviour, without ``acted_on``, is the test
    above. Anything that leaves the branch elsewhere still wakes."""
    work = clone(bare, tmp_path / "work")
    store = GitStore.open(str(bare))
    with BranchWatcher.for_store(store) as watcher:
        own = store.commit("main", store.refresh(), {"status/x.yaml": b"x\n"}, "status")
        watcher.acted_on("main", own)
        assert watcher.wait(0.5) is False
        assert watcher.hints == 0

        git("pull", "-q", "origin", "main", cwd=work)
        commit(work, {"rollouts/r.yaml": "x\n"}, "add r")
        git("push", "-q", "origin", "main", cwd=work)
        assert watcher.wait(5.0) is True  # the branch is no longer where it was acted on

        drain(watcher)
        acted = store.refresh()
        watcher.acted_on("main", "0" * 40)  # acted on something else: a change is a hint
        store.commit("main", acted, {"status/y.yaml": b"y\n"}, "status")
        assert watcher.wait(5.0) is True


def test_other_branches_and_object_writes_do_not_wake(tmp_path: Path, bare: Path) -> None:
    work = clone(bare, tmp_path / "work")
    store = GitStore.open(str(bare))
    with BranchWatcher.for_store(store) as watcher:
        git("checkout", "-q", "-b", "topic", cwd=work)
        commit(work, {"rollouts/r.yaml": "x\n"}, "on topic")
        git("push", "-q", "origin", "topic", cwd=work)
        store.commit("status", None, {"status/x.yaml": b"x\n"}, "status branch")

        assert watcher.wait(0.5) is False
        assert watcher.hints == 0


def test_watching_several_branches(tmp_path: Path, bare: Path) -> None:
    store = GitStore.open(str(bare))
    with BranchWatcher.for_store(store, ["main", "status"]) as watcher:
        store.commit("status", None, {"status/x.yaml": b"x\n"}, "status branch")
        assert watcher.wait(5.0)


def test_stop_from_another_thread_ends_a_wait_at_once(bare: Path) -> None:
    store = GitStore.open(str(bare))
    watcher = BranchWatcher.for_store(store)
    threading.Timer(0.1, watcher.stop).start()
    started = time.monotonic()

    assert watcher.wait(30.0) is False
    assert time.monotonic() - started < 5.0
    assert watcher.stopped
    assert watcher.wait(30.0) is False  # stays stopped: no blocking
    watcher.close()
    watcher.stop()  # a late signal after close is harmless
    assert watcher.wait(1.0) is False


def test_stop_from_a_signal_handler(bare: Path) -> None:
    store = GitStore.open(str(bare))
    watcher = BranchWatcher.for_store(store)
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: watcher.stop())
    try:
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        started = time.monotonic()
        assert watcher.wait(30.0) is False
        assert time.monotonic() - started < 5.0
    finally:
        signal.signal(signal.SIGUSR1, previous)
        watcher.close()


def test_a_remote_is_polled_and_a_fetch_settles_it(tmp_path: Path, bare: Path) -> None:
    store = GitStore.open(f"file://{bare}", cache_dir=tmp_path / "cache")
    work = clone(bare, tmp_path / "work")
    with BranchWatcher.for_store(store, poll=0.05) as watcher:
        assert watcher.wait(0.3) is False  # the mirror is up to date

        commit_and_push(work, {"rollouts/r.yaml": "x\n"}, "add r")
        assert watcher.wait(5.0) is True

        store.refresh()  # the daemon fetches: remote and mirror agree again
        time.sleep(0.2)
        drain(watcher)
        assert watcher.wait(0.3) is False


def test_a_remote_over_http_is_polled(tmp_path: Path, bare: Path) -> None:
    with GitHttpServer(tmp_path) as server:
        store = GitStore.open(server.url_for(bare), cache_dir=tmp_path / "cache")
        work = clone(bare, tmp_path / "work")
        with BranchWatcher.for_store(store, poll=0.05) as watcher:
            commit_and_push(work, {"rollouts/r.yaml": "x\n"}, "add r")
            assert watcher.wait(5.0) is True


def test_when_file_events_cannot_be_had_the_ref_files_are_looked_at(
    tmp_path: Path, bare: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # watchfiles' setup walks the Git directory and can fail when a push's
    # temporary folder vanishes mid-walk; the watcher must not die of it.
    import reconciler.git.watch as watch

    def vanished(*args: object) -> None:
        raise FileNotFoundError(2, "No such file or directory (os error 2)")

    monkeypatch.setattr(watch, "RustNotify", vanished)
    work = clone(bare, tmp_path / "work")
    with BranchWatcher.for_store(GitStore.open(str(bare))) as watcher:
        assert watcher.wait(0.3) is False

        commit_and_push(work, {"rollouts/r.yaml": "x\n"}, "add r")

        assert watcher.wait(5.0) is True
