"""Notifications end to end (docs/operating.md): the daemon, the simulated
fleet as a real process on 127.0.0.1, a real bare repository, and a real
HTTP receiver (tests/kit/webhook.py)."""

from __future__ import annotations

import hashlib
import hmac
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.daemon.loop import Daemon
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.notifications import Backoff, Notifier
from reconciler.git.watch import BranchWatcher
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit
from tests.kit.git import git
from tests.kit.webhook import Receiver as Hook

pytestmark = pytest.mark.slow

WEB = {"web-1": {"role": "web"}, "web-2": {"role": "web"}}
FAST = Backoff(first=0.05, cap=0.2, give_up=60.0)


def settings(*receivers: str) -> str:
    return "apiVersion: reconciler/v1\nkind: Settings\nspec:\n  notifications:\n" + "".join(
        f"    - {r}\n" for r in receivers
    )


@pytest.fixture
def hook() -> Iterator[Hook]:
    with Hook() as hook:
        yield hook


def make_kit(tmp_path: Path, behaviour: str, *receivers: str) -> FleetKit:
    return FleetKit.create(
        tmp_path, WEB, behaviour=behaviour, files={"reconciler.yaml": settings(*receivers)}
    )


def daemon_with(kit: FleetKit, env: dict[str, str]) -> tuple[Daemon, Notifier]:
    notifier = Notifier([], metrics=Metrics(), backoff=FAST, timeout=2.0)
    return kit.daemon(notifier=notifier, environ=env), notifier


FAIL_WEB_1 = 'default: succeed\nnodes:\n  web-1: {action: fail, error: "disk full"}\n'


def test_a_failing_node_opens_a_hold_and_exactly_one_hold_event_arrives(
    tmp_path: Path, hook: Hook
) -> None:
    kit = make_kit(tmp_path, FAIL_WEB_1, "{name: ops, urlEnv: HOOK}")
    daemon, notifier = daemon_with(kit, {"HOOK": hook.url})
    try:
        kit.push({"rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"}, batchSize=2)})
        kit.run_until(daemon, lambda s: s.get("web", {}).get("phase") == "paused")
        for _ in range(5):  # more passes: web-2's verdict, nothing new to say
            daemon.run_pass()
            time.sleep(0.05)
        assert notifier.drain(10)
    finally:
        notifier.close()
        kit.close()

    assert [event for event, _ in hook.events()] == ["hold"]
    body = hook.requests[0].json()
    assert body["rollout"] == "web" and body["hold"]["reason"] == "health_failed"
    assert body["nodes"] == ["web-1"] and "disk full" in body["message"]
    assert git("cat-file", "-t", body["commit"], cwd=kit.bare).strip() == "commit"


def test_completion_sends_completed_signed_with_the_shared_secret(
    tmp_path: Path, hook: Hook
) -> None:
    kit = make_kit(
        tmp_path, "default: succeed\n", "{name: ops, urlEnv: HOOK, secretEnv: HOOK_SECRET}"
    )
    daemon, notifier = daemon_with(kit, {"HOOK": hook.url, "HOOK_SECRET": "shared-s3cret"})
    try:
        kit.push({"rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"}, batchSize=2)})
        kit.run_until(daemon, lambda s: s.get("web", {}).get("phase") == "completed")
        (request,) = hook.wait_for(1)
        assert notifier.drain(10)
        # Another daemon starting within the hour delivers the ending again,
        # with the same id.
        other, other_notifier = daemon_with(kit, {"HOOK": hook.url, "HOOK_SECRET": "x"})
        try:
            other.run_pass()
            _, again = hook.wait_for(2)
            assert other_notifier.drain(10)
        finally:
            other_notifier.close()
    finally:
        notifier.close()
        kit.close()

    assert request.event == "completed" and request.json()["phase"] == "completed"
    signature = hmac.new(b"shared-s3cret", request.body, hashlib.sha256).hexdigest()
    assert request.headers["x-reconciler-signature"] == f"sha256={signature}"
    assert (again.event, again.delivery) == ("completed", request.delivery)
    assert len(hook.requests) == 2


def test_a_receiver_that_answers_500_three_times_gets_the_event_on_the_fourth_try(
    tmp_path: Path, hook: Hook
) -> None:
    kit = make_kit(tmp_path, "default: succeed\n", "{name: ops, urlEnv: HOOK}")
    daemon, notifier = daemon_with(kit, {"HOOK": hook.url})
    hook.fail_next(3)
    try:
        kit.push({"rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"}, batchSize=2)})
        kit.run_until(daemon, lambda s: s.get("web", {}).get("phase") == "completed")
        got = hook.wait_for(4)
        assert notifier.drain(10)
    finally:
        notifier.close()
        kit.close()

    assert [r.answered for r in got] == [500, 500, 500, 200]
    assert len({r.delivery for r in got}) == 1 and {r.event for r in got} == {"completed"}


def test_the_rollouts_glob_filter_sends_only_matching_rollouts(tmp_path: Path, hook: Hook) -> None:
    with Hook() as other:
        kit = make_kit(
            tmp_path,
            "default: succeed\n",
            "{name: web-team, urlEnv: HOOK_WEB, rollouts: ['web-*']}",
            "{name: everyone, urlEnv: HOOK_ALL}",
        )
        daemon, notifier = daemon_with(kit, {"HOOK_WEB": hook.url, "HOOK_ALL": other.url})
        try:
            kit.push(
                {
                    "rollouts/web-a.yaml": rollout_yaml("web-a", nodeIds=["web-1"]),
                    "rollouts/db-a.yaml": rollout_yaml("db-a", nodeIds=["web-2"]),
                }
            )
            kit.run_until(
                daemon,
                lambda s: all(s.get(n, {}).get("phase") == "completed" for n in ("web-a", "db-a")),
            )
            other.wait_for(2)
            assert notifier.drain(10)
        finally:
            notifier.close()
            kit.close()
        everyone = sorted(r.json()["rollout"] for r in other.requests)

    assert [r.json()["rollout"] for r in hook.requests] == ["web-a"]
    assert everyone == ["db-a", "web-a"]


def _daemon_process(
    kit: FleetKit, env: dict[str, str], state_dir: Path | None = None
) -> subprocess.Popen[str]:
    where = ["--state-dir", str(state_dir)] if state_dir is not None else []
    return subprocess.Popen(
        [sys.executable, "-m", "reconciler", "run", "--repo", str(kit.bare),
         "--key", str(kit.key_path), "--interval", "0.1s", *where],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def test_a_restart_that_lost_its_state_delivers_the_open_hold_again_with_the_same_id(
    tmp_path: Path, hook: Hook
) -> None:
    kit = make_kit(tmp_path, FAIL_WEB_1, "{name: ops, urlEnv: HOOK}")
    env = {"HOOK": hook.url}
    try:
        kit.push({"rollouts/web.yaml": rollout_yaml("web", selector={"role": "web"}, batchSize=2)})
        first = _daemon_process(kit, env, tmp_path / "state-first")
        try:
            (delivered,) = hook.wait_for(1, timeout=30)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(10)
        assert kit.statuses()["web"]["phase"] == "paused"

        second = _daemon_process(kit, env, tmp_path / "state-lost")
        try:
            again = hook.wait_for(2, timeout=30)
            time.sleep(1.5)  # passes go on; nothing else may arrive
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(15) == 0
    finally:
        kit.close()

    assert [(r.event, r.delivery) for r in hook.requests] == [
        ("hold", delivered.delivery),
        ("hold", delivered.delivery),
    ]
    assert again[1].json()["hold"] == delivered.json()["hold"]


def _recorded(state_dir: Path, delivery: str) -> bool:
    return any(
        delivery in f.read_text().split() for f in state_dir.glob("*/delivered-*") if f.is_file()
    )


def test_a_restarted_daemon_never_posts_an_id_the_receiver_accepted_before(
    tmp_path: Path, hook: Hook
) -> None:
    kit = make_kit(tmp_path, FAIL_WEB_1, "{name: ops, urlEnv: HOOK, format: slack}")
    env = {"HOOK": hook.url}
    state_dir = tmp_path / "state"
    try:
        kit.push({"rollouts/web.yaml": rollout_yaml("web", nodeIds=["web-1"])})
        kit.push({"rollouts/done.yaml": rollout_yaml("done", nodeIds=["web-2"])})
        first = _daemon_process(kit, env, state_dir)
        try:
            delivered = hook.wait_for(2, timeout=60)
            deadline = time.monotonic() + 30
            while not all(_recorded(state_dir, r.delivery) for r in delivered):
                assert time.monotonic() < deadline, "the delivered ids were never recorded"
                time.sleep(0.05)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(10)

        for _ in range(2):  # a clean stop and a restart, twice
            again = _daemon_process(kit, env, state_dir)
            try:
                time.sleep(3)  # passes go on; nothing may arrive
            finally:
                again.send_signal(signal.SIGTERM)
                assert again.wait(15) == 0
    finally:
        kit.close()

    assert sorted(r.event for r in hook.requests) == ["completed", "hold"]
    assert len({r.delivery for r in hook.requests}) == 2


@pytest.mark.parametrize(
    ("receivers", "env", "expected"),
    [
        ("{name: ops-chat, urlEnv: HOOK_MISSING}", {}, "HOOK_MISSING"),
        ("{name: ops-chat, urlEnv: HOOK}", {"HOOK": "file:///tmp/x"}, "http(s)"),
        ("{name: ops-chat, urlEnv: HOOK, events: [hold, holdd]}", {"HOOK": "http://x"}, "holdd"),
        (
            "{name: ops-chat, urlEnv: HOOK}\n    - {name: ops-chat, urlEnv: HOOK}",
            {"HOOK": "http://127.0.0.1:9/"},
            "named twice",
        ),
    ],
)
def test_receivers_that_cannot_be_used_stop_the_start_naming_the_receiver(
    tmp_path: Path, receivers: str, env: dict[str, str], expected: str
) -> None:
    kit = make_kit(tmp_path, "default: succeed\n", receivers)
    try:
        kit.push({"rollouts/web.yaml": rollout_yaml("web", nodeIds=["web-1"])})
        tip = git("rev-parse", "main", cwd=kit.bare)
        proc = subprocess.run(
            [sys.executable, "-m", "reconciler", "run", "--repo", str(kit.bare),
             "--key", str(kit.key_path), "--once"],
            env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        received = kit.fleet.stats()["received"]
    finally:
        kit.close()

    assert proc.returncode == 1, proc.stderr
    assert "ops-chat" in proc.stderr and expected in proc.stderr
    assert git("rev-parse", "main", cwd=kit.bare) == tip  # nothing committed
    assert received == {}  # nothing sent


def test_a_node_the_fleet_watch_finds_offline_is_one_node_offline_event(
    tmp_path: Path, hook: Hook
) -> None:
    kit = FleetKit.create(
        tmp_path,
        WEB,
        behaviour="default: succeed\nnodes:\n  web-2: unreachable\n",
        files={
            "reconciler.yaml": settings("{name: ops, urlEnv: HOOK, events: [node_offline]}")
            + "  offlineAfter: 1s\n  fleetCheck: {interval: 1s}\n"
        },
    )
    daemon, notifier = daemon_with(kit, {"HOOK": hook.url})
    watcher = BranchWatcher.local(kit.bare, ["main"])
    thread = threading.Thread(target=daemon.serve, args=(watcher,), kwargs={"interval": 0.2})
    thread.start()
    try:
        hook.wait_for(1, timeout=30)
        time.sleep(3)  # later sweeps: the same state, nothing new
        assert notifier.drain(10)
    finally:
        daemon.stop()
        thread.join(30)
        watcher.close()
        notifier.close()
        kit.close()

    (request,) = hook.requests
    assert request.event == "node_offline" and request.json()["nodes"] == ["web-2"]
