"""The agent against hostile or sloppy surroundings: an after-apply command
that leaves a background process holding its output, symbolic links in the
state directory, and a bounded journal and first backups."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from agent_helpers import AgentThread, envelope, job, new_key

from reconciler.node.agent import Agent, AgentConfig
from reconciler.node.state_dir import StateDir, UnsafePath, write_atomic
from reconciler.protocol.effects import SendJob
from reconciler.protocol.signing import SigningKey
from reconciler.spec.model import Target

OLD_CONFIG = b"provider: ollama\nmodel: llama3-old\nprofile: default\n"


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return new_key(tmp_path / "keys")[0]


@pytest.fixture
def state(tmp_path: Path) -> Path:
    config = tmp_path / "state" / "runtimes" / "hermes.yaml"
    config.parent.mkdir(parents=True)
    config.write_bytes(OLD_CONFIG)
    return tmp_path / "state"


def _kill_recorded(pid_file: Path) -> None:
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)


# -- the after-apply timeout bounds the job -------------------------------------


def test_a_background_process_holding_the_output_does_not_hold_the_job(
    tmp_path: Path, state: Path, key: SigningKey
) -> None:
    pid_file = tmp_path / "sleeper.pid"
    command = f"setsid sleep 60 & echo $! > {pid_file}; echo reloaded; exit 0"
    agent = AgentThread(state, [key], after_apply=command, after_apply_timeout=2.0)
    try:
        started = time.monotonic()
        agent.post(envelope(job(), key))
        record = agent.wait_finished("apply-0001")
        took = time.monotonic() - started
        agent.post(envelope(job("apply-0002", rollout="other"), key))
        second = agent.wait_finished("apply-0002")
    finally:
        agent.close()
        _kill_recorded(pid_file)

    assert took < 5, f"the job took {took:.1f} s with a 2 s after-apply timeout"
    assert record["state"] == "succeeded"  # the command itself exited 0
    assert second["state"] == "succeeded"  # and the next job was not stuck behind it
    assert b"llama3.1-8b" in (state / "runtimes" / "hermes.yaml").read_bytes()


def test_a_command_still_running_at_the_timeout_fails_the_job_in_time(
    tmp_path: Path, state: Path, key: SigningKey
) -> None:
    pid_file = tmp_path / "sleeper.pid"
    command = f"setsid sleep 60 & echo $! > {pid_file}; echo started; sleep 30"
    agent = AgentThread(state, [key], after_apply=command, after_apply_timeout=2.0)
    try:
        started = time.monotonic()
        agent.post(envelope(job(), key))
        record = agent.wait_finished("apply-0001")
        took = time.monotonic() - started
    finally:
        agent.close()
        _kill_recorded(pid_file)

    assert took < 5, f"the job took {took:.1f} s with a 2 s after-apply timeout"
    assert record["state"] == "failed"
    assert record["error"].startswith("after-apply command timed out after 2s")
    assert "started" in record["error"]
    assert (state / "runtimes" / "hermes.yaml").read_bytes() == OLD_CONFIG


# -- symbolic links -------------------------------------------------------------


def test_a_symlinked_runtime_config_fails_the_job_and_stays_a_link(
    tmp_path: Path, state: Path, key: SigningKey
) -> None:
    real = tmp_path / "etc-hermes.yaml"
    real.write_bytes(OLD_CONFIG)
    link = state / "runtimes" / "hermes.yaml"
    link.unlink()
    link.symlink_to(real)
    agent = AgentThread(state, [key])
    try:
        agent.post(envelope(job(), key))
        record = agent.wait_finished("apply-0001")
    finally:
        agent.close()

    assert record["state"] == "failed"
    assert "hermes.yaml is a symbolic link" in record["error"]
    assert "make hermes.yaml a regular file" in record["error"]
    assert link.is_symlink()
    assert real.read_bytes() == OLD_CONFIG
    assert not list((state / "backups").iterdir())  # nothing was written


def test_a_planted_temporary_file_link_is_never_followed(tmp_path: Path, state: Path) -> None:
    # Whatever name an attacker guesses (the old scheme used only the pid),
    # the agent creates its temporary file exclusively and without following.
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    victim.chmod(0o600)
    target = state / "runtimes" / "hermes.yaml"
    planted = target.with_name(f".hermes.yaml.tmp-{os.getpid()}")
    planted.symlink_to(victim)

    write_atomic(target, b"model: new\n", 0o644)

    assert victim.read_bytes() == b"precious\n"
    assert victim.stat().st_mode & 0o777 == 0o600
    assert target.read_bytes() == b"model: new\n" and not target.is_symlink()


def test_a_symlinked_journal_record_is_refused(tmp_path: Path, state: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    directory = StateDir.open(state)
    try:
        (directory.jobs / "j1.json").symlink_to(victim)
        with pytest.raises(UnsafePath, match=r"j1\.json is a symbolic link"):
            write_atomic(directory.jobs / "j1.json", b"{}", 0o600)
    finally:
        directory.close()
    assert victim.read_bytes() == b"precious\n"


# -- bounded state ----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def _agent(state: Path, key: SigningKey, clock: Clock, **config: object) -> Agent:
    settings: dict[str, object] = {
        "node": "node-a",
        "trusted": {key.key_id: key.trusted()},
        "runtimes": frozenset({"hermes"}),
        "allow_live": True,
    }
    settings.update(config)
    return Agent(AgentConfig(**settings), StateDir.open(state), clock=clock)  # type: ignore[arg-type]


def _run_job(agent: Agent, key: SigningKey, clock: Clock, send: SendJob) -> int:
    body = json.dumps(envelope(send, key, issued_at=clock.now)).encode()
    answer = agent.post_job(body, "node-a")
    agent._worker.submit(lambda: None).result(10)  # the job (queued before) has run
    return answer.status


def test_finished_records_are_dropped_a_day_after_their_payload_expired(
    state: Path, key: SigningKey
) -> None:
    clock = Clock()
    agent = _agent(state, key, clock)
    try:
        assert _run_job(agent, key, clock, job("apply-0001")) == 202
        clock.now += timedelta(hours=24, minutes=14)  # expired 23 h 59 min ago: kept
        assert _run_job(agent, key, clock, job("apply-0002", rollout="second")) == 202
        assert (state / "jobs" / "apply-0001.json").exists()

        clock.now += timedelta(minutes=2)  # now more than a day past its expiry
        assert agent.compact() == 1
        assert not (state / "jobs" / "apply-0001.json").exists()
        assert "apply-0001" not in agent.jobs
        assert (state / "jobs" / "apply-0002.json").exists()
        # Replaying the dropped job is still refused: its payload has expired.
        issued = clock.now - timedelta(days=1)
        stale = json.dumps(envelope(job("apply-0001"), key, issued_at=issued)).encode()
        refused = agent.post_job(stale, "node-a")
        assert refused.status == 422 and b'"expired"' in refused.body
    finally:
        agent.close()
        agent.state.close()


def test_first_backups_of_long_finished_rollouts_fall_under_retention(
    state: Path, key: SigningKey
) -> None:
    clock = Clock()
    agent = _agent(state, key, clock, backup_retention=1, keep_first_backups=30 * 86400)
    models = iter(f"model-{i}" for i in range(10))

    def apply(job_id: str, rollout: str) -> None:
        target = Target("hermes", "vllm", next(models), "default")
        assert _run_job(agent, key, clock, job(job_id, rollout=rollout, target=target)) == 202

    try:
        apply("old-1", "old")  # the first backup of rollout "old": pinned
        clock.now += timedelta(days=1)
        apply("new-1", "new")
        apply("new-2", "new")
        kept = {b.rollout for b in agent.state.list_backups()}
        assert kept == {"old", "new"}

        clock.now += timedelta(days=31)  # "old" has had nothing here for 31 days
        apply("new-3", "new")
        rollouts = [b.rollout for b in agent.state.list_backups()]
        assert "old" not in rollouts
        assert rollouts.count("new") == 2  # the newest and "new"'s own first backup
    finally:
        agent.close()
        agent.state.close()
