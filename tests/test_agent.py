"""The node agent on a real port: what it refuses (and that a refusal writes
nothing), replay protection, live apply with backups and after-apply
rollback, restores, retention, and restarts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from reconciler.node.state_dir import BackupInfo, JobRecord, StateDir, backups_to_prune, digest
from reconciler.protocol.signing import SigningKey, canonical_json
from reconciler.spec.model import Target
from tests.kit.agents import AgentThread, start_process
from tests.kit.http import request as http
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.waiting import wait_for

OLD_CONFIG = b"# hermes, set by hand\nprovider: ollama\nmodel: llama3-old\nprofile: default\n"


def snapshot(state: Path) -> dict[str, Any]:
    """Every file under the state directory with its bytes and mode."""
    return {
        str(p.relative_to(state)): (p.read_bytes(), p.stat().st_mode & 0o777)
        for p in sorted(state.rglob("*"))
        if p.is_file() and p.name != "agent.lock"
    }


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return make_key(tmp_path / "keys" / "reconciler").signing


@pytest.fixture
def state(tmp_path: Path) -> Path:
    config = tmp_path / "state" / "runtimes" / "hermes.yaml"
    config.parent.mkdir(parents=True)
    config.write_bytes(OLD_CONFIG)
    config.chmod(0o640)
    return tmp_path / "state"


@pytest.fixture
def agent(state: Path, key: SigningKey) -> Iterator[AgentThread]:
    served = AgentThread(state, [key])
    yield served
    served.close()


# -- refusals ------------------------------------------------------------------


def test_refusals_come_in_order_with_their_codes_and_write_nothing(
    tmp_path: Path, state: Path, key: SigningKey
) -> None:
    stranger = make_key(tmp_path / "stranger" / "reconciler").signing
    dry_only = AgentThread(state, [key], allow_live=False)
    now = datetime.now(UTC)
    good = envelope(job(), key)
    tampered = json.loads(json.dumps(good))
    tampered["payload"]["target"]["model"] = "llama3-evil"
    cases: list[tuple[str, Any, str, str | None]] = [
        ("not JSON", b"{nope", "invalid_job", None),
        ("not an envelope", {"job": "apply-0001"}, "invalid_job", None),
        ("no signature", {"payload": good["payload"], "keyId": key.key_id}, "invalid_job", None),
        ("unknown key", envelope(job(), stranger), "untrusted_key", None),
        ("tampered", tampered, "bad_signature", None),
        ("another node", envelope(job(node="node-b"), key), "wrong_node", None),
        ("another node's URL", good, "wrong_node", "node-b"),
        ("16 minutes old", envelope(job(), key, now - timedelta(minutes=16)), "expired", None),
        (
            "3 minutes ahead",
            envelope(job(), key, now + timedelta(minutes=3)),
            "not_yet_valid",
            None,
        ),
        (
            "unmanaged runtime",
            envelope(job(target=Target("other", "a", "b", "c")), key),
            "unsupported_runtime",
            None,
        ),
    ]
    before = snapshot(state)
    try:
        for name, body, code, node in cases:
            status, answer = dry_only.post(body, node=node)
            assert 400 <= status < 500, name
            assert answer["error"] == code, (name, answer)
            assert answer["message"], name
        status, answer = dry_only.post(good)
        assert (status, answer["error"]) == (403, "live_not_allowed")
        assert "--allow-live-apply" in answer["message"]
        assert snapshot(state) == before
        assert dry_only.get("jobs/apply-0001")[0] == 404
    finally:
        dry_only.close()


def test_one_minute_of_clock_skew_is_tolerated(agent: AgentThread, key: SigningKey) -> None:
    ahead = envelope(job(mode="dry_run"), key, datetime.now(UTC) + timedelta(minutes=1))

    assert agent.post(ahead)[0] == 202


def test_a_job_id_with_another_payload_is_a_conflict(
    agent: AgentThread, key: SigningKey, state: Path
) -> None:
    assert agent.post(envelope(job(), key))[0] == 202
    agent.wait_finished("apply-0001")
    before = snapshot(state)

    status, answer = agent.post(envelope(job(target=Target("hermes", "x", "y")), key))

    assert (status, answer["error"]) == (409, "job_conflict")
    assert "target" in answer["message"]
    assert snapshot(state) == before


def test_every_changed_byte_of_a_posted_payload_is_refused(
    agent: AgentThread, key: SigningKey, state: Path
) -> None:
    body = canonical_json(envelope(job(), key))
    start = body.index(b'"payload":') + len(b'"payload":')
    end = body.index(b',"signature"')
    before = snapshot(state)
    codes = set()

    for position in range(start, end):
        changed = bytearray(body)
        changed[position] ^= 0x01  # another ASCII character
        status, answer = agent.post(bytes(changed))
        assert 400 <= status < 500, (position, chr(body[position]), answer)
        codes.add(answer["error"])

    assert codes <= {"invalid_job", "bad_signature"}
    assert snapshot(state) == before


# -- replay and at-most-once ---------------------------------------------------------


def counting_command(tmp_path: Path, exit_code: int = 0) -> str:
    log = tmp_path / "after-apply.log"
    return (
        f'echo "$RECONCILER_JOB_ID $RECONCILER_MODEL $RECONCILER_MODE" >> {log}; exit {exit_code}'
    )


def runs(tmp_path: Path) -> list[str]:
    log = tmp_path / "after-apply.log"
    return log.read_text().splitlines() if log.exists() else []


def test_the_same_envelope_twice_runs_once(tmp_path: Path, state: Path, key: SigningKey) -> None:
    agent = AgentThread(state, [key], after_apply=counting_command(tmp_path))
    try:
        env = envelope(job(), key)
        first_status, first = agent.post(env)
        agent.wait_finished("apply-0001")

        second_status, second = agent.post(env)
        resent_status, resent = agent.post(envelope(job(), key))  # fresh signature and times

        assert first_status == 202 and first["state"] in ("accepted", "running")
        assert second_status == 200 and second["state"] == "succeeded"
        assert resent_status == 200 and resent == second
        assert runs(tmp_path) == ["apply-0001 llama3.1-8b live"]
    finally:
        agent.close()


# -- apply, dry run, backups --------------------------------------------------------------


def test_dry_run_reports_the_change_and_writes_nothing(
    agent: AgentThread, key: SigningKey, state: Path
) -> None:
    config_before = snapshot(state)["runtimes/hermes.yaml"]

    agent.post(envelope(job(mode="dry_run"), key))
    record = agent.wait_finished("apply-0001")

    assert record["state"] == "succeeded"
    assert record["backupId"] is None
    assert record["detail"] == (
        "would change provider ollama -> vllm, model llama3-old -> llama3.1-8b"
    )
    assert snapshot(state)["runtimes/hermes.yaml"] == config_before
    assert agent.get("backups") == (200, [])


def test_live_apply_writes_the_config_keeps_a_backup_and_the_heartbeat_shows_it(
    agent: AgentThread, key: SigningKey, state: Path
) -> None:
    agent.post(envelope(job(), key))
    record = agent.wait_finished("apply-0001")

    assert record["state"] == "succeeded" and record["error"] is None
    assert record["sourceCommit"] == job().source_commit
    assert record["finishedAt"].endswith("Z")
    config = state / "runtimes" / "hermes.yaml"
    assert config.read_text() == "provider: vllm\nmodel: llama3.1-8b\nprofile: default\n"
    assert config.stat().st_mode & 0o777 == 0o640  # the file keeps its mode
    status, backups = agent.get("backups")
    assert status == 200
    assert backups == [
        {
            "backupId": record["backupId"],
            "runtime": "hermes",
            "createdAt": backups[0]["createdAt"],
            "jobId": "apply-0001",
            "rollout": "llama",
            "provider": "ollama",
            "model": "llama3-old",
        }
    ]
    status, beat = agent.get("heartbeat")
    assert beat["node"] == "node-a" and beat["agentVersion"]
    assert [(r["type"], r["provider"], r["model"], r["profile"]) for r in beat["runtimes"]] == [
        ("hermes", "vllm", "llama3.1-8b", "default")
    ]
    assert beat["runtimes"][0]["configDigest"].startswith("sha256:")
    assert beat["time"] >= record["finishedAt"]


def test_the_heartbeat_reads_the_config_file_each_time(agent: AgentThread, state: Path) -> None:
    (state / "runtimes" / "hermes.yaml").write_text("provider: a\nmodel: b\nprofile: c\n")

    beat = agent.get("heartbeat")[1]

    assert beat["runtimes"][0]["model"] == "b"


def test_the_heartbeat_follows_each_change_of_the_config_bytes(
    agent: AgentThread, state: Path
) -> None:
    # What a config holds is kept between reads only while its bytes stay the same.
    config = state / "runtimes" / "hermes.yaml"
    seen = []
    for text in ["model: b\n", "model: [b\n", "model: b\n", "model: c\n", "model: c\n"]:
        config.write_text(text)
        (runtime,) = agent.get("heartbeat")[1]["runtimes"]
        seen.append((runtime["model"], "error" in runtime))
    assert seen == [("b", False), ("", True), ("b", False), ("c", False), ("c", False)]


def test_a_node_without_a_config_gets_one_and_has_no_backup(
    tmp_path: Path, key: SigningKey
) -> None:
    agent = AgentThread(tmp_path / "empty", [key])
    try:
        assert agent.get("heartbeat")[1]["runtimes"] == []
        agent.post(envelope(job(), key))
        record = agent.wait_finished("apply-0001")

        assert record["state"] == "succeeded" and record["backupId"] is None
        assert agent.get("backups")[1] == []
        assert agent.get("heartbeat")[1]["runtimes"][0]["model"] == "llama3.1-8b"
    finally:
        agent.close()


def test_an_apply_already_in_place_changes_nothing(agent: AgentThread, key: SigningKey) -> None:
    agent.post(envelope(job(), key))
    agent.wait_finished("apply-0001")

    agent.post(envelope(job("apply-0002", attempt=2), key))
    record = agent.wait_finished("apply-0002")

    assert record["state"] == "succeeded" and record["backupId"] is None
    assert "already in place" in record["detail"]
    assert len(agent.get("backups")[1]) == 1


def test_other_keys_of_the_config_are_kept(
    agent: AgentThread, key: SigningKey, state: Path
) -> None:
    (state / "runtimes" / "hermes.yaml").write_text(
        "provider: ollama\nmodel: m\nprofile: default\ngpuLayers: 33\n"
    )

    agent.post(envelope(job(), key))
    agent.wait_finished("apply-0001")

    assert "gpuLayers: 33" in (state / "runtimes" / "hermes.yaml").read_text()


def test_a_config_that_is_not_a_mapping_fails_the_job_untouched(
    agent: AgentThread, key: SigningKey, state: Path
) -> None:
    (state / "runtimes" / "hermes.yaml").write_text("- just\n- a list\n")
    before = snapshot(state)

    agent.post(envelope(job(), key))
    record = agent.wait_finished("apply-0001")

    assert record["state"] == "failed" and "not a YAML mapping" in record["error"]
    after = snapshot(state)
    assert {k: v for k, v in after.items() if not k.startswith("jobs/")} == before


# -- after-apply ----------------------------------------------------------------------


def test_a_failing_after_apply_restores_the_old_bytes_and_mode(
    tmp_path: Path, state: Path, key: SigningKey
) -> None:
    command = "echo reloading hermes; echo 'model not found' >&2; exit 3"
    agent = AgentThread(state, [key], after_apply=command)
    try:
        agent.post(envelope(job(), key))
        record = agent.wait_finished("apply-0001")
    finally:
        agent.close()

    config = state / "runtimes" / "hermes.yaml"
    assert config.read_bytes() == OLD_CONFIG
    assert config.stat().st_mode & 0o777 == 0o640
    assert record["state"] == "failed"
    assert record["error"].startswith("after-apply command failed (exit status 3)")
    assert "previous config restored" in record["error"]
    assert "model not found" in record["error"]
    assert record["detail"] == "reloading hermes\nmodel not found\n"


def test_after_apply_sees_the_job_in_its_environment(
    tmp_path: Path, state: Path, key: SigningKey
) -> None:
    out = tmp_path / "env.txt"
    agent = AgentThread(state, [key], after_apply=f"env | grep ^RECONCILER_ | sort > {out}")
    try:
        agent.post(envelope(job(), key))
        agent.wait_finished("apply-0001")
    finally:
        agent.close()

    env = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert env["RECONCILER_JOB_ID"] == "apply-0001"
    assert env["RECONCILER_NODE"] == "node-a"
    assert env["RECONCILER_ROLLOUT"] == "llama"
    assert env["RECONCILER_RUNTIME"] == "hermes"
    assert env["RECONCILER_PROVIDER"] == "vllm"
    assert env["RECONCILER_MODEL"] == "llama3.1-8b"
    assert env["RECONCILER_PROFILE"] == "default"
    assert env["RECONCILER_MODE"] == "live"
    assert env["RECONCILER_ATTEMPT"] == "1"
    assert env["RECONCILER_CONFIG"] == str(state.absolute() / "runtimes" / "hermes.yaml")


def test_a_hanging_after_apply_times_out_and_restores(
    tmp_path: Path, state: Path, key: SigningKey
) -> None:
    agent = AgentThread(state, [key], after_apply="echo started; sleep 30", after_apply_timeout=0.5)
    try:
        started = time.monotonic()
        agent.post(envelope(job(), key))
        record = agent.wait_finished("apply-0001")
    finally:
        agent.close()

    assert time.monotonic() - started < 10
    assert record["state"] == "failed"
    assert record["error"].startswith("after-apply command timed out after 0.5s")
    assert "started" in record["error"]
    assert (state / "runtimes" / "hermes.yaml").read_bytes() == OLD_CONFIG


def test_a_failing_after_apply_on_a_new_config_removes_it(tmp_path: Path, key: SigningKey) -> None:
    agent = AgentThread(tmp_path / "fresh", [key], after_apply="exit 1")
    try:
        agent.post(envelope(job(), key))
        record = agent.wait_finished("apply-0001")
    finally:
        agent.close()

    assert record["state"] == "failed"
    assert not (tmp_path / "fresh" / "runtimes" / "hermes.yaml").exists()


# -- restore -------------------------------------------------------------------------


def test_a_restore_puts_the_named_backup_back(
    agent: AgentThread, key: SigningKey, state: Path
) -> None:
    agent.post(envelope(job(), key))
    backup_id = agent.wait_finished("apply-0001")["backupId"]

    agent.post(envelope(job("restore-0001", kind="restore", backup_id=backup_id), key))
    record = agent.wait_finished("restore-0001")

    assert record["state"] == "succeeded"
    config = state / "runtimes" / "hermes.yaml"
    assert config.read_bytes() == OLD_CONFIG
    assert config.stat().st_mode & 0o777 == 0o640
    # the restore itself is undoable: it backed up what it replaced
    assert record["backupId"] != backup_id
    assert [b["jobId"] for b in agent.get("backups")[1]] == ["restore-0001", "apply-0001"]


def test_a_restores_after_apply_sees_the_restored_model_not_the_one_rolled_back_from(
    tmp_path: Path, state: Path, key: SigningKey
) -> None:
    out = tmp_path / "env.txt"
    hook = f'echo "$RECONCILER_KIND $RECONCILER_PROVIDER $RECONCILER_MODEL $RECONCILER_PROFILE" >> {out}'
    agent = AgentThread(state, [key], after_apply=hook)
    try:
        agent.post(envelope(job(), key))
        backup_id = agent.wait_finished("apply-0001")["backupId"]
        agent.post(envelope(job("restore-0001", kind="restore", backup_id=backup_id), key))
        assert agent.wait_finished("restore-0001")["state"] == "succeeded"
    finally:
        agent.close()

    assert out.read_text().splitlines() == [
        "apply vllm llama3.1-8b default",
        "restore ollama llama3-old default",
    ]


def test_a_restore_of_an_unknown_backup_fails(agent: AgentThread, key: SigningKey) -> None:
    agent.post(envelope(job("restore-0001", kind="restore", backup_id="hermes-nope"), key))

    record = agent.wait_finished("restore-0001")

    assert record["state"] == "failed" and "hermes-nope" in record["error"]


def test_a_restore_whose_after_apply_fails_keeps_the_current_config(
    tmp_path: Path, state: Path, key: SigningKey
) -> None:
    flag = tmp_path / "fail-next"
    agent = AgentThread(state, [key], after_apply=f"test ! -e {flag}")
    try:
        agent.post(envelope(job(), key))
        backup_id = agent.wait_finished("apply-0001")["backupId"]
        applied = (state / "runtimes" / "hermes.yaml").read_bytes()
        flag.touch()

        agent.post(envelope(job("restore-0001", kind="restore", backup_id=backup_id), key))
        record = agent.wait_finished("restore-0001")
    finally:
        agent.close()

    assert record["state"] == "failed"
    assert (state / "runtimes" / "hermes.yaml").read_bytes() == applied


# -- retention ----------------------------------------------------------------------


def info(backup_id: str, seq: int, rollout: str, runtime: str = "hermes") -> BackupInfo:
    return BackupInfo(backup_id, runtime, "t", seq, f"job-{seq}", rollout, "p", "m", "d", 0o644, "")


def test_retention_keeps_the_newest_and_the_first_backup_of_each_rollout() -> None:
    backups = [
        info("a1", 1, "a"),
        info("a2", 2, "a"),
        info("b1", 3, "b"),
        info("b2", 4, "b"),
        info("c1", 5, "c"),
        info("x1", 6, "a", runtime="other"),
    ]

    doomed = backups_to_prune(backups, retention=2)

    assert sorted(doomed) == ["a2"]  # a1, b1 pinned; b2, c1 newest; other runtime apart
    assert backups_to_prune(backups, retention=2, pinned={"a2"}) == []


def test_the_agent_prunes_backups_past_its_retention(state: Path, key: SigningKey) -> None:
    agent = AgentThread(state, [key], backup_retention=2)
    try:
        for n in range(1, 6):
            target = Target("hermes", "vllm", f"model-{n}")
            agent.post(envelope(job(f"apply-{n:04d}", attempt=n, target=target), key))
            agent.wait_finished(f"apply-{n:04d}")
        backups = agent.get("backups")[1]
    finally:
        agent.close()

    assert [b["jobId"] for b in backups] == ["apply-0005", "apply-0004", "apply-0001"]
    assert [b["model"] for b in backups] == ["model-4", "model-3", "llama3-old"]


def test_the_backup_list_kept_in_memory_is_what_the_folder_holds(
    state: Path, key: SigningKey
) -> None:
    # The agent reads its backups folder once; after applies, restores and
    # prunes its list must equal a fresh read of the folder, in order.
    agent = AgentThread(state, [key], backup_retention=2)
    try:
        for n in range(1, 8):
            target = Target("hermes", "vllm", f"model-{n}")
            rollout = f"rollout-{n % 3}"
            agent.post(envelope(job(f"apply-{n:04d}", rollout=rollout, target=target), key))
            backup_id = agent.wait_finished(f"apply-{n:04d}")["backupId"]
            kept = agent.get("backups")[1]
            assert kept == [b.public() for b in StateDir(state).list_backups()]
        agent.post(envelope(job("restore-0001", kind="restore", backup_id=backup_id), key))
        assert agent.wait_finished("restore-0001")["state"] == "succeeded"
        kept = agent.get("backups")[1]
    finally:
        agent.close()

    assert kept == [b.public() for b in StateDir(state).list_backups()]
    assert kept[0]["jobId"] == "restore-0001"


def test_a_backup_removed_by_hand_while_the_agent_runs_is_not_restored(
    agent: AgentThread, key: SigningKey, state: Path
) -> None:
    agent.post(envelope(job(), key))
    backup_id = agent.wait_finished("apply-0001")["backupId"]
    (state / "backups" / f"{backup_id}.data").unlink()

    agent.post(envelope(job("restore-0001", kind="restore", backup_id=backup_id), key))
    record = agent.wait_finished("restore-0001")

    assert record["state"] == "failed"
    assert f"backup {backup_id} of runtime hermes is not on this node" in record["error"]


# -- protocol details -------------------------------------------------------------------


def test_unknown_jobs_nodes_and_paths_answer_404(agent: AgentThread) -> None:
    assert agent.get("jobs/apply-9999") == (
        404,
        {"error": "unknown_job", "message": "no job apply-9999 on this node"},
    )
    assert agent.get("heartbeat", node="node-b")[1]["error"] == "unknown_node"
    assert http(agent.url, "GET", "/v2/whatever")[0] == 404


def test_a_second_agent_on_the_same_state_directory_is_refused(
    agent: AgentThread, state: Path
) -> None:
    from reconciler.spec.errors import ReconcilerError

    with pytest.raises(ReconcilerError, match="another agent is running"):
        StateDir.open(state)


# -- restarts ----------------------------------------------------------------------------


def test_a_job_accepted_but_never_started_is_failed_on_restart(
    tmp_path: Path, state: Path, key: SigningKey
) -> None:
    directory = StateDir.open(state)
    payload = envelope(job(), key)["payload"]
    directory.save_job(JobRecord("apply-0001", payload, "accepted", "2026-12-01T09:00:00Z"))
    directory.close()

    agent = AgentThread(state, [key])
    try:
        record = agent.get("jobs/apply-0001")[1]
        status, again = agent.post(envelope(job(), key))
    finally:
        agent.close()

    assert record["state"] == "failed"
    assert record["error"] == "agent restarted before the job ran; nothing was changed"
    assert status == 200 and again == record
    assert (state / "runtimes" / "hermes.yaml").read_bytes() == OLD_CONFIG


def agent_args(state: Path, public: Path, command: str, port: int = 0) -> list[str]:
    return [
        "agent",
        "--node",
        "node-a",
        "--state-dir",
        str(state),
        "--trust-key",
        str(public),
        "--runtime",
        "hermes",
        "--listen",
        f"127.0.0.1:{port}",
        "--allow-live-apply",
        "--after-apply",
        command,
    ]


def test_killed_mid_apply_the_job_is_reported_and_never_run_again(
    tmp_path: Path, state: Path
) -> None:
    made = make_key(tmp_path / "daemon-key" / "reconciler")
    key, public = made.signing, made.public
    marker = tmp_path / "after-apply.pids"
    # The after-apply command records its pid, then takes its time.
    command = f"echo $$ >> {marker}; exec sleep 30"
    process, url = start_process(agent_args(state, public, command), tmp_path / "agent1.log")
    sleeper = None
    try:
        env = envelope(job(), key)
        assert http(url, "POST", "/v1/nodes/node-a/jobs", env)[0] == 202
        wait_for(lambda: marker.exists() and marker.read_text().strip(), what="after-apply start")
        sleeper = int(marker.read_text().split()[0])
        assert http(url, "GET", "/v1/nodes/node-a/jobs/apply-0001")[1]["state"] == "running"

        process.send_signal(signal.SIGKILL)
        process.wait()
        config = (state / "runtimes" / "hermes.yaml").read_bytes()
        new = b"provider: vllm\nmodel: llama3.1-8b\nprofile: default\n"
        assert config in (OLD_CONFIG, new)  # never torn

        process, url = start_process(agent_args(state, public, command), tmp_path / "agent2.log")
        status, record = http(url, "GET", "/v1/nodes/node-a/jobs/apply-0001")
        left = "new" if config == new else "old"
        assert status == 200 and record["state"] == "failed"
        assert record["error"] == f"agent restarted during apply; config left as {left}"
        assert record["backupId"]  # the old config is kept, so it can be restored

        status, again = http(url, "POST", "/v1/nodes/node-a/jobs", envelope(job(), key))
        time.sleep(0.3)
        assert status == 200 and again["state"] == "failed"
        assert len(marker.read_text().split()) == 1  # executed once, ever
        assert (state / "runtimes" / "hermes.yaml").read_bytes() == config
    finally:
        process.kill()
        process.wait()
        if sleeper:
            with contextlib.suppress(ProcessLookupError):
                os.kill(sleeper, signal.SIGKILL)


NEW_CONFIG = b"provider: vllm\nmodel: llama3.1-8b\nprofile: default\n"


def crashed_while_running(state: Path, key: SigningKey, backup: str, config: bytes | None) -> None:
    """The state directory as a power loss can leave it while a live apply ran:
    the journal says "accepted" ("running" is not journalled); ``backup`` is
    "both", "json-only" (one of its two renames lost) or "none"."""
    directory = StateDir.open(state)
    payload = envelope(job(), key)["payload"]
    directory.save_job(JobRecord("apply-0001", payload, "accepted", "2026-12-01T09:00:00Z"))
    if backup != "none":
        info = BackupInfo(
            "hermes-20261201T090000Z-0001", "hermes", "2026-12-01T09:00:00Z", 1,
            "apply-0001", "llama", "ollama", "llama3-old", "default", 0o644, digest(OLD_CONFIG) or "",
        )  # fmt: skip
        directory.save_backup(info, OLD_CONFIG)
        if backup == "json-only":
            (state / "backups" / f"{info.backup_id}.data").unlink()
    config_path = state / "runtimes" / "hermes.yaml"
    if config is None:
        config_path.unlink()
    else:
        config_path.write_bytes(config)
    directory.close()


@pytest.mark.parametrize(
    ("backup", "config", "error", "backup_id"),
    [
        ("both", NEW_CONFIG, "agent restarted during apply; config left as new", True),
        ("both", OLD_CONFIG, "agent restarted during apply; config left as old", True),
        ("both", b"model: other\n", "agent restarted during apply; config left as "
         "neither old nor new (changed by something else)", True),
        ("json-only", OLD_CONFIG, "agent restarted before the job ran; nothing was changed", False),
        ("none", OLD_CONFIG, "agent restarted before the job ran; nothing was changed", False),
        ("none", None, "agent restarted before the job ran; nothing was changed", False),
        # No backup and the job's config in place: there was none, the job created it.
        ("none", NEW_CONFIG, "agent restarted during apply; config left as new", False),
    ],
)  # fmt: skip
def test_a_job_journalled_accepted_is_recovered_from_its_backup(
    state: Path, key: SigningKey, backup: str, config: bytes | None, error: str, backup_id: bool
) -> None:
    crashed_while_running(state, key, backup, config)

    agent = AgentThread(state, [key])
    try:
        record = agent.get("jobs/apply-0001")[1]
        listed = agent.get("backups")[1]
    finally:
        agent.close()

    assert record["state"] == "failed" and record["error"] == error
    assert record["backupId"] == ("hermes-20261201T090000Z-0001" if backup_id else None)
    assert len(listed) == (1 if backup == "both" else 0)  # a .json alone is no backup


def test_a_crash_before_the_config_was_written_reports_it_left_old(
    state: Path, key: SigningKey
) -> None:
    # What the journal holds when an agent dies between "running" and the rename.
    directory = StateDir.open(state)
    payload = envelope(job(), key)["payload"]
    directory.save_job(
        JobRecord(
            "apply-0001",
            payload,
            "running",
            "2026-12-01T09:00:00Z",
            before=digest(OLD_CONFIG),
            after=digest(b"provider: vllm\n"),
            planned_backup="hermes-never-written",
        )
    )
    directory.close()

    agent = AgentThread(state, [key])
    try:
        record = agent.get("jobs/apply-0001")[1]
    finally:
        agent.close()

    assert record["state"] == "failed"
    assert record["error"] == "agent restarted during apply; config left as old"
    assert record["backupId"] is None  # the backup was never completed
