"""The agent against hostile or sloppy surroundings: an after-apply command
that leaves a background process holding its output, symbolic links in the
state directory, and a bounded journal and first backups."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from reconciler.node.agent import Agent, AgentConfig
from reconciler.node.state_dir import BackupInfo, JobRecord, StateDir, UnsafePath, write_atomic
from reconciler.protocol.effects import SendJob
from reconciler.protocol.signing import SigningKey
from reconciler.spec.model import Target
from tests.kit.agents import AgentThread
from tests.kit.disks import small_tmpfs
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key

OLD_CONFIG = b"provider: ollama\nmodel: llama3-old\nprofile: default\n"


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return make_key(tmp_path / "keys" / "reconciler").signing


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


def test_a_symlink_planted_where_a_journal_record_goes_is_refused_by_name(
    tmp_path: Path, state: Path
) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    directory = StateDir.open(state)
    try:
        (directory.jobs / "j1.json").symlink_to(victim)
        record = JobRecord(job_id="j1", payload={}, state="accepted", accepted_at="now")
        with pytest.raises(UnsafePath) as refused:
            directory.save_job(record)
        with pytest.raises(UnsafePath):
            directory.delete_job("j1")
    finally:
        directory.close()
    assert refused.value.message == (
        f"{state.absolute() / 'jobs' / 'j1.json'} is a symbolic link (to {victim}); the agent "
        "replaces its files by rename and does not write through links"
    )
    assert refused.value.hint.startswith("make j1.json a regular file")
    assert victim.read_bytes() == b"precious\n"
    assert (state / "jobs" / "j1.json").is_symlink()


@pytest.mark.parametrize("suffix", [".data", ".json"])
def test_a_symlink_planted_where_a_backup_goes_is_refused(
    tmp_path: Path, state: Path, suffix: str
) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    directory = StateDir.open(state)
    info = _backup_info("hermes-1")
    try:
        (directory.backups / f"hermes-1{suffix}").symlink_to(victim)
        with pytest.raises(UnsafePath, match=rf"hermes-1\{suffix} is a symbolic link"):
            directory.save_backup(info, b"old bytes\n")
        with pytest.raises(UnsafePath, match=rf"hermes-1\{suffix} is a symbolic link"):
            directory.delete_backup("hermes-1")
        assert directory.list_backups() == []
    finally:
        directory.close()
    assert victim.read_bytes() == b"precious\n"
    # Nothing was left behind: neither the other file nor a temporary one.
    assert [p.name for p in (state / "backups").iterdir()] == [f"hermes-1{suffix}"]


def _backup_info(backup_id: str, seq: int = 1) -> BackupInfo:
    return BackupInfo(
        backup_id=backup_id,
        runtime="hermes",
        created_at="2026-12-01T09:00:00Z",
        seq=seq,
        job_id="apply-0001",
        rollout="llama",
        provider="ollama",
        model="llama3-old",
        profile="default",
        mode=0o640,
        digest="sha256:" + "0" * 64,
    )


def test_a_state_directory_written_with_plain_paths_reads_the_same(state: Path) -> None:
    # The files as an agent that named them by absolute path left them.
    record = JobRecord(job_id="j1", payload={"rollout": "llama"}, state="failed", accepted_at="t")
    (state / "jobs").mkdir()
    (state / "jobs" / "j1.json").write_text(json.dumps(dataclasses.asdict(record)))
    (state / "backups").mkdir()
    info = _backup_info("hermes-1")
    (state / "backups" / "hermes-1.json").write_text(json.dumps(dataclasses.asdict(info)))
    (state / "backups" / "hermes-1.data").write_bytes(b"old bytes\n")
    (state / "runtimes" / "hermes.yaml").chmod(0o640)

    directory = StateDir.open(state)
    try:
        assert directory.load_jobs() == {"j1": record}
        assert directory.list_backups() == [info]
        assert directory.find_backup("hermes-1") == info
        assert directory.read_backup(info) == b"old bytes\n"
        assert directory.read_config("hermes") == (OLD_CONFIG, 0o640)
        assert directory.read_config("other") is None
        assert directory.config_location("hermes") == str(directory.config_path("hermes"))

        # And what it writes is what a plain-path writer wrote: same names, bytes, modes.
        directory.save_job(record.with_changes(state="succeeded"))
        directory.write_config("hermes", b"model: new\n", 0o600)
        directory.save_backup(_backup_info("hermes-2", seq=2), b"older\n")
    finally:
        directory.close()
    written = json.loads((state / "jobs" / "j1.json").read_bytes())
    # A record without timings (no live switch), signature (no signed stage),
    # evals, standby (no slot switch) or released (no release) is written as
    # earlier agents wrote it.
    plain = {
        k: v
        for k, v in dataclasses.asdict(record).items()
        if k not in ("timings", "signature", "evals", "standby", "released")
    }
    assert written == {**plain, "state": "succeeded"}
    assert (state / "jobs" / "j1.json").stat().st_mode & 0o777 == 0o600
    config = state / "runtimes" / "hermes.yaml"
    assert config.read_bytes() == b"model: new\n" and config.stat().st_mode & 0o777 == 0o600
    assert (state / "backups" / "hermes-2.data").read_bytes() == b"older\n"
    described = json.loads((state / "backups" / "hermes-2.json").read_bytes())
    assert described == dataclasses.asdict(_backup_info("hermes-2", seq=2))
    assert sorted(p.name for p in (state / "backups").iterdir()) == [
        "hermes-1.data",
        "hermes-1.json",
        "hermes-2.data",
        "hermes-2.json",
    ]


def test_errors_in_a_state_folder_name_the_full_path(state: Path) -> None:
    directory = StateDir.open(state)
    try:
        with pytest.raises(FileNotFoundError) as missing:
            directory.read_backup(_backup_info("hermes-9"))
        assert missing.value.filename == str(state.absolute() / "backups" / "hermes-9.data")
        (state / "runtimes" / "hermes.yaml").unlink()
        (state / "runtimes" / "hermes.yaml").mkdir()
        with pytest.raises(IsADirectoryError) as folder:
            directory.read_config("hermes")
        assert folder.value.filename == str(state.absolute() / "runtimes" / "hermes.yaml")
    finally:
        directory.close()


def test_a_state_folder_removed_under_the_agent_fails_its_writes(state: Path) -> None:
    # The folders are opened once: a removed one is not silently recreated
    # and a write to it fails, naming where it went.
    directory = StateDir.open(state)
    try:
        (state / "jobs").rmdir()
        record = JobRecord(job_id="j1", payload={}, state="accepted", accepted_at="t")
        with pytest.raises(FileNotFoundError) as gone:
            directory.save_job(record)
        jobs = str(state.absolute() / "jobs")
        assert str(gone.value.filename).startswith(jobs + "/.j1.json.tmp-")
    finally:
        directory.close()
    assert not (state / "jobs").exists()


def test_a_state_folder_renamed_under_the_agent_keeps_its_files(state: Path) -> None:
    # What the agent read its journal from is where it goes on writing it:
    # nothing is split between the folder it knows and a new one.
    directory = StateDir.open(state)
    try:
        (state / "jobs").rename(state / "jobs-moved")
        (state / "jobs").mkdir()
        record = JobRecord(job_id="j1", payload={}, state="accepted", accepted_at="t")
        directory.save_job(record)
    finally:
        directory.close()
    assert [p.name for p in (state / "jobs-moved").iterdir()] == ["j1.json"]
    assert list((state / "jobs").iterdir()) == []


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


def test_a_job_resent_after_its_record_was_dropped_is_not_run_again(
    state: Path, key: SigningKey
) -> None:
    clock = Clock()
    agent = _agent(state, key, clock)
    try:
        assert _run_job(agent, key, clock, job("apply-0001")) == 202
        clock.now += timedelta(hours=24, minutes=14)
        assert _run_job(agent, key, clock, job("apply-0002", rollout="second")) == 202
        clock.now += timedelta(minutes=2)  # a day past apply-0001's expiry
        assert agent.compact() == 1
    finally:
        agent.close()
        agent.state.close()
    # A restarted agent, and the daemon's resend of the same job (same id,
    # fresh issuedAt) after being down for over a day.
    agent = _agent(state, key, clock)
    try:
        assert _run_job(agent, key, clock, job("apply-0001")) == 409
        assert "apply-0001" not in agent.jobs
        clock.now += timedelta(days=31)
        agent.compact()
        assert "apply-0001" not in agent.state.load_dropped()  # kept 30 days
    finally:
        agent.close()
        agent.state.close()


def _jobs_to_new_models(agent: Agent, key: SigningKey, clock: Clock) -> Callable[..., None]:
    """Runs a job (id, rollout, mode) to its end, each to a model not seen before."""
    models = iter(f"model-{i}" for i in range(100))

    def run(job_id: str, rollout: str, mode: str = "live") -> None:
        target = Target("hermes", "vllm", next(models), "default")
        sent = job(job_id, rollout=rollout, target=target, mode=mode)
        assert _run_job(agent, key, clock, sent) == 202

    return run


def test_first_backups_of_long_finished_rollouts_fall_under_retention(
    state: Path, key: SigningKey
) -> None:
    clock = Clock()
    agent = _agent(state, key, clock, backup_retention=1, keep_first_backups=30 * 86400)
    apply = _jobs_to_new_models(agent, key, clock)
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


def test_a_rollout_whose_newest_record_was_compacted_is_judged_by_what_is_left(
    state: Path, key: SigningKey
) -> None:
    # A rollout's newest acceptance is kept in memory between prunes; when
    # compaction drops that record, the rollout counts from what remains.
    clock = Clock()
    agent = _agent(state, key, clock, backup_retention=1, keep_first_backups=36 * 3600)
    run = _jobs_to_new_models(agent, key, clock)
    try:
        run("old-1", "old")  # rollout "old"'s first backup
        clock.now += timedelta(days=1)
        run("new-1", "new")
        clock.now += timedelta(days=1)
        run("old-2", "old", mode="dry_run")  # "old" active again: no backup, a record
        clock.now += timedelta(minutes=1)
        run("new-2", "new")
        assert "old" in {b.rollout for b in agent.state.list_backups()}

        clock.now += timedelta(days=1, hours=1)
        run("new-3", "new")  # pruned while old-2 is journalled; then compaction drops it
        assert "old" in {b.rollout for b in agent.state.list_backups()}
        assert "old-2" not in agent.jobs

        run("new-4", "new")  # "old" last did anything here 3 days ago
        assert "old" not in {b.rollout for b in agent.state.list_backups()}
    finally:
        agent.close()
        agent.state.close()


# -- a full disk ----------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs, where a state directory runs out of space for real."""
    with small_tmpfs(tmp_path / "disk", "256k") as mount:
        yield mount


def test_a_full_disk_ends_the_job_failed_and_the_agent_carries_on(
    small_disk: Path, key: SigningKey
) -> None:
    state = small_disk / "state"
    (state / "runtimes").mkdir(parents=True)
    (state / "runtimes" / "hermes.yaml").write_bytes(OLD_CONFIG)
    fill = small_disk / "fill"
    # The after-apply command fills the disk: the journal cannot take the
    # job's end, nor the failure recording it.
    command = f"if [ ! -e {small_disk}/full-once ]; then touch {small_disk}/full-once; "
    command += f"head -c 1000000 /dev/zero > {fill}; fi; exit 0"
    agent = AgentThread(state, [key], after_apply=command)
    try:
        agent.post(envelope(job(), key))
        record = agent.wait_finished("apply-0001")
        assert record["state"] == "failed", record
        fill.unlink()
        agent.post(envelope(job("apply-0002", rollout="other"), key))
        second = agent.wait_finished("apply-0002")
    finally:
        agent.close()
    assert second["state"] == "succeeded", second
