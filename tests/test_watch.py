"""The branch watcher: a `git push` into a bare repository wakes a waiting
loop quickly; unrelated writes do not; a remote is polled; stop() ends a
wait at once, from another thread or a signal handler."""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from pathlib import Path

import pytest

import reconciler.git.watch as watch
from reconciler.git.store import GitStore
from reconciler.git.watch import BranchWatcher
from tests.kit.git import clone, commit, commit_and_push, git, make_bare_repo
from tests.kit.git_http import GitHttpServer


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


class _NoMoreWatches:
    """inotify whose watch limit is reached (``fs.inotify.max_user_watches``):
    the edge we do not own, failing as the kernel does."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.closed = False

    def add_watch(self, path: object, mask: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self) -> None:
        self.closed = True


def _no_instances(*args: object, **kwargs: object) -> None:
    raise OSError(errno.EMFILE, "Too many open files")


@pytest.mark.parametrize("failing", [_NoMoreWatches, _no_instances], ids=["watch", "init"])
def test_when_file_events_cannot_be_had_the_ref_files_are_looked_at(
    tmp_path: Path, bare: Path, monkeypatch: pytest.MonkeyPatch, failing: object
) -> None:
    """No inotify watch (the limit reached) or no inotify instance at all:
    the watcher falls back to looking at the ref files' stat, and a push
    still wakes the waiter; an idle repository still does not."""
    monkeypatch.setattr(watch, "INotify", failing)
    work = clone(bare, tmp_path / "work")
    with BranchWatcher.for_store(GitStore.open(str(bare))) as watcher:
        assert watcher.wait(0.3) is False

        commit_and_push(work, {"rollouts/r.yaml": "x\n"}, "add r")

        assert watcher.wait(5.0) is True


def test_pushes_by_the_git_binary_wake_the_waiter_within_milliseconds(
    tmp_path: Path, bare: Path
) -> None:
    """The hint is sent when the ref file is renamed into place, not after a
    quiet period or at the next look: each of five pushes wakes the waiter
    well within the stat fallback's period (about a millisecond on an idle
    machine; the bound is loose for a loaded one)."""
    work = clone(bare, tmp_path / "work")
    latencies = []
    with BranchWatcher.for_store(GitStore.open(str(bare))) as watcher:
        for k in range(5):
            commit(work, {"rollouts/r.yaml": f"{k}\n"}, f"edit {k}")
            git("push", "-q", "origin", "main", cwd=work)
            pushed_at = time.monotonic()
            assert watcher.wait(5.0) is True
            latencies.append(time.monotonic() - pushed_at)
            drain(watcher)
    assert sorted(latencies)[2] < watch.STAT_POLL, latencies


def _switches(thread: threading.Thread) -> int:
    """How many times `thread` gave up the CPU by itself (Linux)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return sum(
        int(line.split()[1]) for line in status.splitlines() if "voluntary_ctxt_switches" in line
    )


def test_an_idle_watch_never_wakes(bare: Path) -> None:
    """The watching thread sleeps until an event or stop(): no timer, so an
    idle daemon costs no CPU (the debounced watch woke every 4 ms: about 125
    times in this half second)."""
    with BranchWatcher.for_store(GitStore.open(str(bare))) as watcher:
        (thread,) = watcher._threads
        time.sleep(0.1)  # settled into its wait
        before = _switches(thread)
        assert watcher.wait(0.5) is False
        assert _switches(thread) - before <= 1


def test_a_remote_poll_sleeps_between_polls_and_stops_at_once(tmp_path: Path, bare: Path) -> None:
    """Between two polls the polling thread sleeps on the stop pipe: it does
    not wake in between (it stepped every 50 ms: about ten times in this
    half second), and a stop ends the sleep at once."""
    store = GitStore.open(f"file://{bare}", cache_dir=tmp_path / "cache")
    watcher = BranchWatcher.for_store(store, poll=30.0)
    (thread,) = watcher._threads
    time.sleep(0.5)  # the first poll done, asleep until the next
    before = _switches(thread)
    assert watcher.wait(0.5) is False
    asleep = _switches(thread) - before
    started = time.monotonic()
    watcher.stop()
    thread.join(5.0)
    stopped_in = time.monotonic() - started
    watcher.close()
    assert asleep <= 1
    assert not thread.is_alive() and stopped_in < 1.0


def test_stop_ends_the_watching_thread_at_once(bare: Path) -> None:
    watcher = BranchWatcher.for_store(GitStore.open(str(bare)))
    (thread,) = watcher._threads
    time.sleep(0.1)
    watcher.stop()
    thread.join(1.0)
    assert not thread.is_alive()
    watcher.close()


def test_a_branch_in_a_folder_created_after_the_watch_started(tmp_path: Path, bare: Path) -> None:
    """``refs/heads/team/`` and ``refs/notes/`` do not exist when the watch
    starts: their parents are watched, and once a folder appears the watch
    moves into it, so the first push of the ref and every later one wake
    the waiter, and a sibling ref in the new folder does not."""
    work = clone(bare, tmp_path / "work")
    with BranchWatcher.local(bare, ["team/rollouts", "refs/notes/commits"]) as watcher:
        git("push", "-q", "origin", "main:team/rollouts", cwd=work)
        assert watcher.wait(5.0) is True
        drain(watcher)

        commit(work, {"rollouts/r.yaml": "x\n"}, "add r")
        git("push", "-q", "origin", "HEAD:team/rollouts", cwd=work)
        assert watcher.wait(5.0) is True  # watched in its new folder now
        drain(watcher)

        hints = watcher.hints
        git("push", "-q", "origin", "HEAD:team/other", cwd=work)
        assert watcher.wait(0.3) is False
        assert watcher.hints == hints

        git("notes", "add", "-m", "approved", "HEAD", cwd=work)
        git("push", "-q", "origin", "refs/notes/commits", cwd=work)
        assert watcher.wait(5.0) is True
        drain(watcher)
        git("notes", "add", "-f", "-m", "approved again", "HEAD", cwd=work)
        git("push", "-q", "origin", "refs/notes/commits", cwd=work)
        assert watcher.wait(5.0) is True


def test_pack_refs_is_a_hint_and_the_watch_survives_its_pruned_folders(
    tmp_path: Path, bare: Path
) -> None:
    """``git pack-refs --all`` moves the refs into ``packed-refs`` and removes
    the loose files and the emptied ``refs/heads/team/``: that is a hint,
    and a later push that recreates the folder is one too."""
    work = clone(bare, tmp_path / "work")
    git("push", "-q", "origin", "main:team/rollouts", cwd=work)
    with BranchWatcher.local(bare, ["main", "team/rollouts"]) as watcher:
        git("pack-refs", "--all", cwd=bare)
        assert not (bare / "refs" / "heads" / "team").exists()
        assert watcher.wait(5.0) is True
        drain(watcher)

        commit(work, {"rollouts/r.yaml": "x\n"}, "add r")
        git("push", "-q", "origin", "HEAD:team/rollouts", cwd=work)
        assert watcher.wait(5.0) is True
        drain(watcher)
        git("push", "-q", "origin", "HEAD:main", cwd=work)
        assert watcher.wait(5.0) is True


def test_a_new_folder_beyond_the_watch_limit_falls_back_to_stat(
    tmp_path: Path, bare: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watch that cannot be added later (the limit reached when the ref's
    folder appears) is not the end of hints: the watcher hints once and
    goes on looking at the ref files."""
    real = watch.INotify
    allowed = {"watches": 2}  # the repository folder and refs/heads

    class Limited(real):  # type: ignore[misc, valid-type]
        def add_watch(self, path: object, mask: int) -> int:
            if allowed["watches"] <= 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            allowed["watches"] -= 1
            return int(super().add_watch(path, mask))

    monkeypatch.setattr(watch, "INotify", Limited)
    work = clone(bare, tmp_path / "work")
    with BranchWatcher.local(bare, ["team/rollouts"]) as watcher:
        git("push", "-q", "origin", "main:team/rollouts", cwd=work)
        assert watcher.wait(5.0) is True
        drain(watcher)

        commit(work, {"rollouts/r.yaml": "x\n"}, "add r")
        git("push", "-q", "origin", "HEAD:team/rollouts", cwd=work)
        assert watcher.wait(5.0) is True
