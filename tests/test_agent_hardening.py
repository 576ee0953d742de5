"""The agent against hostile or sloppy surroundings: an after-apply command
that leaves a background process holding its output, symbolic links in the
state directory, and a bounded journal and first backups."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from agent_helpers import AgentThread, envelope, job, new_key

from reconciler.node.state_dir import StateDir, UnsafePath, write_atomic
from reconciler.protocol.signing import SigningKey

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
