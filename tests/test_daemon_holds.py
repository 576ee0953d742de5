"""How often the loop passes: a hold that only a person can lift needs no
faster passes than an idle fleet (docs/architecture.md, the loop's wait), and a
wake-up ends a failed pass's backoff."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.daemon.agent_client import AgentClient
from reconciler.daemon.logs import EventLog
from reconciler.daemon.loop import Daemon
from reconciler.git.store import GitStore
from reconciler.git.watch import BranchWatcher
from reconciler.protocol.signing import load_private_key
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.git import git, make_bare_repo
from tests.kit.keys import make_key


@pytest.fixture
def kit(tmp_path: Path) -> Iterator[FleetKit]:
    made = FleetKit.create(tmp_path, {"web-1": {"role": "web"}, "web-2": {"role": "web"}})
    yield made
    made.close()


def test_a_pause_after_batch_hold_is_not_active_and_a_resume_is(kit: FleetKit) -> None:
    kit.push(
        {
            "rollouts/web.yaml": rollout_yaml(
                "web", selector={"role": "web"}, batchSize=1, pauseAfter=[1]
            )
        }
    )
    daemon = kit.daemon()
    first = daemon.run_pass()
    assert first.active  # batch 1 is in flight: the interval applies

    statuses = kit.run_until(daemon, lambda s: s["web"]["phase"] == "paused")
    assert statuses["web"]["hold"]["reason"] == "pause_after_batch"
    held = daemon.run_pass()
    assert not held.active and held.wakeup is None

    kit.push(
        {
            "rollouts/web.yaml": rollout_yaml(
                "web", selector={"role": "web"}, batchSize=1, pauseAfter=[1], resume="'1'"
            )
        }
    )
    assert daemon.run_pass().active  # resumed: batch 2 goes out


class _Lines(io.StringIO):
    """A log stream the test reads while the daemon's thread writes it."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            return super().write(text)

    def events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [json.loads(line) for line in self.getvalue().splitlines()]


def test_a_hint_during_a_backoff_ends_it(tmp_path: Path) -> None:
    """A pass that fails backs off 1, 2, 4 s...; a wake-up meanwhile (the
    branch moved, or a poll of the remote works again) starts the next pass
    at once, with the backoff back at its start."""
    bare = make_bare_repo(tmp_path, {"nodes/a.yaml": "a\n"})
    key_path = make_key(tmp_path / "keys" / "reconciler").private
    store = GitStore.open(str(bare), "main")
    tip = git("rev-parse", "main", cwd=bare)
    git("update-ref", "-d", "refs/heads/main", cwd=bare)  # every pass now fails
    stream = _Lines()
    daemon = Daemon(
        store,
        AgentClient(load_private_key(key_path)),
        log=EventLog("json", stream=stream),
    )

    def failures() -> list[str]:
        return [e["message"] for e in stream.events() if e["event"] == "pass_failed"]

    with BranchWatcher.local(Path(store.repository().path), ["main", "other"]) as watcher:
        serving = threading.Thread(target=daemon.serve, args=(watcher,), kwargs={"interval": 1})
        serving.start()
        try:
            deadline = time.monotonic() + 20
            while len(failures()) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert [m.rsplit(" ", 1)[-1] for m in failures()] == ["1s", "2s", "4s"]
            woken = time.monotonic()
            git("update-ref", "refs/heads/other", tip, cwd=bare)
            while len(failures()) < 4 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert time.monotonic() - woken < 2.0  # not the 4 s left of the backoff
            assert failures()[3].endswith("retrying in 1s")
        finally:
            daemon.stop()
            serving.join(10)
            daemon.client.close()
