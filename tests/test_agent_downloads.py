"""A stage job's download against servers that misbehave: it ends in
bounded time whatever the server does, asks again after a refused
connection or a 5xx, never follows a redirect into the node's own network,
and never delays an apply or a restore on the same node.

Real nginx where it can produce the case (a slow body with ``limit_rate``,
a redirect, a mirror that comes up late, a forward proxy for a public
name); a stand-in server (``tests.kit.hostile_http``) only for what nginx
never answers: a ``Content-Range`` that starts elsewhere than asked, a 416
for a range that exists, 503s that pass, a body that drips one byte at a
time (nginx's ``limit_rate`` counts its headers, so it sends nothing at all
for minutes instead).
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.node.artifact_download import Deadline, Downloader, DownloadSettings
from reconciler.node.artifact_store import ArtifactStore, StageFailed
from reconciler.node.download_fence import Fence
from reconciler.protocol.signing import SigningKey
from reconciler.spec.artifacts import Artifact
from tests.kit.agents import AgentThread
from tests.kit.hostile_http import (
    HostileServer,
    cut_200,
    drip,
    range_416,
    unavailable,
    whole,
    wrong_range,
)
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.nginx import NginxServer
from tests.kit.waiting import wait_for

OLD_CONFIG = b"provider: vllm\nmodel: llama3-old\nprofile: default\n"
DATA = hashlib.sha256(b"weights").digest() * 4096  # 128 KiB


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return make_key(tmp_path / "keys" / "reconciler").signing


@pytest.fixture
def state(tmp_path: Path) -> Path:
    config = tmp_path / "state" / "runtimes" / "hermes.yaml"
    config.parent.mkdir(parents=True)
    config.write_bytes(OLD_CONFIG)
    return tmp_path / "state"


@pytest.fixture
def files(tmp_path: Path) -> Path:
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "model.gguf").write_bytes(DATA)
    return folder


def _artifact(url: str, data: bytes = DATA) -> Artifact:
    return Artifact("weights", url, hashlib.sha256(data).hexdigest(), len(data))


def _stage(agent: AgentThread, key: SigningKey, url: str, **changes: object) -> dict[str, object]:
    stage = job("stage-1", kind="stage", artifacts=(_artifact(url),), **changes)  # type: ignore[arg-type]
    status, _ = agent.post(envelope(stage, key))
    assert status == 202
    return agent.wait_finished("stage-1")


@pytest.mark.parametrize(
    ("case", "ranged"),
    [
        ("a 416 for a range that exists", lambda start: range_416(len(DATA))),
        ("a range that starts elsewhere", lambda start: wrong_range(DATA, start - 1)),
    ],
)
def test_answers_that_bring_nothing_new_after_a_broken_200_fail_the_stage(
    state: Path, key: SigningKey, case: str, ranged: object
) -> None:
    def answer(number: int, start: int | None) -> bytes:
        return cut_200(DATA, len(DATA) // 2) if start is None else ranged(start)  # type: ignore[operator]

    with HostileServer(answer) as server:
        agent = AgentThread(state, [key])
        try:
            record = _stage(agent, key, server.url("model.gguf"))
        finally:
            agent.close()
    assert record["state"] == "failed", case
    error = str(record["error"])
    assert error.startswith("download_failed: weights: "), error
    assert error.endswith("3 requests in a row brought no byte beyond byte 65536")
    assert " to Range: bytes=65536- (Content-Range " in error  # what the server answered
    assert server.requests == 4  # the broken 200, then three that brought nothing new


def test_a_one_byte_drip_ends_at_the_stage_timeout(state: Path, key: SigningKey) -> None:
    with HostileServer(lambda number, start: drip(100)) as server:
        agent = AgentThread(state, [key])
        try:
            stage = job(
                "stage-1",
                kind="stage",
                artifacts=(_artifact(server.url("drip.bin"), DATA[:100]),),
                stage_timeout=2,
            )
            agent.post(envelope(stage, key))
            record = agent.wait_finished("stage-1")
        finally:
            agent.close()
    assert record["state"] == "failed"
    assert record["error"] == (
        f"download_failed: weights: GET {server.url('drip.bin')} did not finish within 2s "
        "(stage.timeout)"
    )


def test_a_body_slower_than_the_least_rate_fails(tmp_path: Path, files: Path) -> None:
    store = ArtifactStore(tmp_path / "state")
    settings = DownloadSettings(min_rate=1000, rate_window=1.0)
    with NginxServer(tmp_path / "nginx", files, rate=100) as nginx:
        downloader = Downloader(settings)
        partial = store.partial(hashlib.sha256(DATA).hexdigest())
        try:
            with pytest.raises(StageFailed) as failed:
                downloader.fetch(nginx.url("model.gguf"), partial, len(DATA), Deadline.after(600))
        finally:
            partial.close()
            downloader.close()
    assert failed.value.code == "download_failed"
    assert "less than the least rate of 1000 bytes/s" in failed.value.message


def test_a_refused_connection_is_asked_again_until_the_mirror_is_up(
    tmp_path: Path, state: Path, key: SigningKey, files: Path
) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/model.gguf"
    agent = AgentThread(state, [key])
    mirror: list[NginxServer] = []
    try:
        stage = job("stage-1", kind="stage", artifacts=(_artifact(url),))
        agent.post(envelope(stage, key))
        time.sleep(1.0)  # the mirror restarts meanwhile
        mirror.append(NginxServer(tmp_path / "nginx", files, listener=listener))
        record = agent.wait_finished("stage-1")
    finally:
        agent.close()
        for server in mirror:
            server.close()
    assert record["state"] == "succeeded", record
    assert record["detail"] == f"weights: downloaded {len(DATA)} bytes"


def test_5xx_answers_are_asked_again_with_a_pause(state: Path, key: SigningKey) -> None:
    def answer(number: int, start: int | None) -> bytes:
        return unavailable() if number <= 2 else whole(DATA)

    with HostileServer(answer) as server:
        agent = AgentThread(state, [key])
        try:
            record = _stage(agent, key, server.url("model.gguf"))
        finally:
            agent.close()
    assert record["state"] == "succeeded", record
    assert server.requests == 3


def test_a_redirect_to_loopback_is_refused_and_what_it_answered_is_never_said(
    tmp_path: Path,
    state: Path,
    key: SigningKey,
    files: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = b"admin token: s3cr3t\n"
    (files / "secret.bin").write_bytes(secret)
    with NginxServer(tmp_path / "nginx", files) as nginx:
        nginx_redirects = NginxServer(
            tmp_path / "nginx-public",
            files,
            redirects={
                "/model.gguf": nginx.url("secret.bin"),
                "/local.gguf": nginx.url("model.gguf"),
            },
        )
        # nginx as the forward proxy through which "mirror.example" is reached:
        # the signed URL names a public host, its redirect points at loopback.
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{nginx_redirects.port}")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        agent = AgentThread(state, [key])
        try:
            refused = _stage(agent, key, "http://mirror.example/model.gguf")
            # A signed URL on loopback may lead to loopback: that mirror is what was signed.
            local = job(
                "stage-2",
                kind="stage",
                attempt=2,
                artifacts=(_artifact(nginx_redirects.url("local.gguf")),),
            )
            agent.post(envelope(local, key))
            followed = agent.wait_finished("stage-2")
        finally:
            agent.close()
            nginx_redirects.close()
        served = [line.split()[1] for line in nginx.requests()]
    assert refused["state"] == "failed"
    error = str(refused["error"])
    assert error == (
        "download_failed: weights: GET http://mirror.example/model.gguf was redirected to "
        "127.0.0.1, a loopback, link-local or private address; refused (only a signed URL "
        "on such an address may lead there): sign the URL the file is served from"
    )
    assert hashlib.sha256(secret).hexdigest() not in error and str(len(secret)) not in error
    assert "/secret.bin" not in served  # never even asked
    assert followed["state"] == "succeeded", followed


@pytest.fixture
def dripping() -> Iterator[HostileServer]:
    with HostileServer(lambda number, start: drip(150)) as server:
        yield server


def test_an_apply_and_a_restore_run_while_a_stage_hangs_on_the_same_node(
    state: Path, key: SigningKey, dripping: HostileServer
) -> None:
    agent = AgentThread(state, [key])
    try:
        url = dripping.url("drip.bin")
        stage = job("stage-1", kind="stage", artifacts=(_artifact(url, DATA[:150]),))
        agent.post(envelope(stage, key))
        wait_for(lambda: dripping.requests, what="the stage to start downloading")

        agent.post(envelope(job("apply-1"), key))
        applied = agent.wait_finished("apply-1")
        restore = job("restore-1", kind="restore", backup_id=applied["backupId"])
        agent.post(envelope(restore, key))
        restored = agent.wait_finished("restore-1")
        _, staging = agent.get("jobs/stage-1")
    finally:
        stopping = threading.Thread(target=agent.close)
        stopping.start()
        stopping.join(30)
    assert applied["state"] == "succeeded" and restored["state"] == "succeeded"
    assert staging["state"] == "accepted"  # still downloading all along
    assert (state / "runtimes" / "hermes.yaml").read_bytes() == OLD_CONFIG
    assert not stopping.is_alive()  # stopping the agent ends the download


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1:8080/admin",
        "http://localhost/admin",
        "http://[::1]/admin",
        "http://[::ffff:127.0.0.1]/admin",  # loopback inside an IPv6 address
        "http://169.254.169.254/latest/meta-data/",  # a cloud's metadata service
        "http://10.0.0.7/",
        "http://192.168.1.1/",
        "http://[fe80::1]/",
        "http://0.0.0.0/",
        "file:///etc/passwd",
    ],
)
def test_a_public_mirror_may_not_redirect_into_the_nodes_network(target: str) -> None:
    with pytest.raises(StageFailed) as refused:
        Fence("http://93.184.216.34/model.gguf").check_redirect(target)
    assert refused.value.code == "download_failed"
    Fence("http://93.184.216.34/model.gguf").check_redirect("https://93.184.216.35/model.gguf")
    if target.startswith("http"):
        Fence("http://10.0.0.5/model.gguf").check_redirect(target)  # signed inside: allowed
