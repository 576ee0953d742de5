"""The model directory on a real agent, from files a real nginx serves:
staged files are laid out as ``STATE/models/MODELID/PATH`` hard links into
the store, the runtime's config names it as ``modelDir``, retention keeps a
directory exactly as long as its files, and an agent SIGKILLed between
laying it out and activating comes back to a clean directory and a job
that can run again."""

from __future__ import annotations

import hashlib
import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reconciler.spec.artifacts import Artifact, Drain
from reconciler.spec.safe_yaml import load_yaml
from tests.kit.agents import AgentThread, start_agent
from tests.kit.jobs import envelope, job
from tests.kit.keys import Key, make_key
from tests.kit.nginx import NginxServer
from tests.kit.runtime import METRIC, StandInRuntime
from tests.kit.waiting import wait_for

OLD_CONFIG = b"provider: vllm\nmodel: old\nprofile: default\n"


@pytest.fixture
def owner(tmp_path: Path) -> Key:
    return make_key(tmp_path / "keys" / "reconciler")


@pytest.fixture
def files(tmp_path: Path) -> Path:
    folder = tmp_path / "files"
    folder.mkdir()
    for i in range(4):
        (folder / f"weights-{i}.gguf").write_bytes(f"weights {i}\n".encode() * 1000)
    (folder / "tokenizer.json").write_bytes(b'{"vocab": []}\n')
    return folder


@pytest.fixture
def nginx(tmp_path: Path, files: Path) -> Iterator[NginxServer]:
    with NginxServer(tmp_path / "nginx", files) as server:
        yield server


@pytest.fixture
def state(tmp_path: Path) -> Path:
    config = tmp_path / "state" / "runtimes" / "hermes.yaml"
    config.parent.mkdir(parents=True)
    config.write_bytes(OLD_CONFIG)
    return tmp_path / "state"


def _artifact(nginx: NginxServer, files: Path, name: str, file: str, path: str = "") -> Artifact:
    data = (files / file).read_bytes()
    return Artifact(name, nginx.url(file), hashlib.sha256(data).hexdigest(), len(data), path)


def _model(nginx: NginxServer, files: Path, i: int) -> tuple[Artifact, ...]:
    """Rollout ``i``'s model: its own weights and the shared tokenizer."""
    return (
        _artifact(nginx, files, "weights", f"weights-{i}.gguf", "model.gguf"),
        _artifact(nginx, files, "tokenizer", "tokenizer.json", "tokenizer/tokenizer.json"),
    )


def _model_id(artifacts: tuple[Artifact, ...]) -> str:
    pairs = sorted([a.layout_path, a.sha256] for a in artifacts)
    canonical = json.dumps(pairs, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


def _config(state: Path) -> dict[str, object]:
    value = load_yaml("hermes.yaml", (state / "runtimes" / "hermes.yaml").read_bytes())
    assert isinstance(value, dict)
    return value


def _stage_and_apply(
    agent: AgentThread, owner: Key, i: int, artifacts: tuple[Artifact, ...]
) -> None:
    rollout = f"r{i}"
    agent.post(
        envelope(
            job(f"stage-{i}", kind="stage", rollout=rollout, artifacts=artifacts), owner.signing
        )
    )
    assert agent.wait_finished(f"stage-{i}")["state"] == "succeeded"
    agent.post(envelope(job(f"apply-{i}", rollout=rollout, artifacts=artifacts), owner.signing))
    applied = agent.wait_finished(f"apply-{i}")
    assert applied["state"] == "succeeded", applied


def test_an_apply_lays_out_the_model_directory_as_links_and_names_it_in_the_config(
    state: Path, owner: Key, nginx: NginxServer, files: Path
) -> None:
    artifacts = _model(nginx, files, 0)
    agent = AgentThread(state, [owner.signing])
    try:
        _stage_and_apply(agent, owner, 0, artifacts)
    finally:
        agent.close()

    model_dir = state.absolute() / "models" / _model_id(artifacts)
    config = _config(state)
    assert config["modelDir"] == str(model_dir)
    assert list(config) == ["provider", "model", "profile", "artifacts", "modelDir"]
    store = state / "artifacts" / "sha256"
    for artifact in artifacts:
        laid = model_dir / artifact.layout_path
        assert laid.read_bytes() == (store / artifact.sha256).read_bytes()
        assert laid.stat().st_ino == (store / artifact.sha256).stat().st_ino  # a link, no copy
    listed = sorted(str(p.relative_to(model_dir)) for p in model_dir.rglob("*") if p.is_file())
    assert listed == ["model.gguf", "tokenizer/tokenizer.json"]
    pairs = (state / "models" / f"{model_dir.name}.json").read_bytes()
    assert hashlib.sha256(pairs).hexdigest() == model_dir.name


def test_without_paths_each_file_lies_under_its_name(
    state: Path, owner: Key, nginx: NginxServer, files: Path
) -> None:
    artifacts = (_artifact(nginx, files, "weights", "weights-0.gguf"),)
    agent = AgentThread(state, [owner.signing])
    try:
        _stage_and_apply(agent, owner, 0, artifacts)
    finally:
        agent.close()

    model_dir = Path(str(_config(state)["modelDir"]))
    assert model_dir.name == _model_id(artifacts)
    assert [p.name for p in model_dir.iterdir()] == ["weights"]


def test_retention_keeps_a_model_directory_exactly_as_long_as_its_files(
    state: Path, owner: Key, nginx: NginxServer, files: Path
) -> None:
    models = [_model(nginx, files, i) for i in range(4)]
    agent = AgentThread(state, [owner.signing], keep_artifacts=1)
    try:
        for i, artifacts in enumerate(models):
            _stage_and_apply(agent, owner, i, artifacts)
    finally:
        agent.close()

    held = {p.name for p in (state / "artifacts" / "sha256").iterdir()}
    dirs = {p.name for p in (state / "models").iterdir() if p.is_dir()}
    # The first model's weights went, and its directory with them.
    assert models[0][0].sha256 not in held
    assert _model_id(models[0]) not in dirs
    assert not (state / "models" / f"{_model_id(models[0])}.json").exists()
    # The current and the previous config's directories stay, whole.
    assert {_model_id(models[3]), _model_id(models[2])} <= dirs
    for ident in dirs:
        pairs = json.loads((state / "models" / f"{ident}.json").read_bytes())
        for path, sha256 in pairs:
            assert sha256 in held, (ident, path)
            assert (state / "models" / ident / path).is_file()
    assert models[0][1].sha256 in held  # the shared tokenizer: a kept directory holds it


def test_an_agent_sigkilled_between_laying_out_and_activating_recovers_and_the_job_runs_again(
    tmp_path: Path, owner: Key, nginx: NginxServer, files: Path
) -> None:
    artifacts = _model(nginx, files, 0)
    ident = _model_id(artifacts)
    with StandInRuntime("old", delay=60.0) as runtime:
        busy: list[int] = []
        client = threading.Thread(
            target=lambda: busy.append(
                httpx.post(f"{runtime.url}/v1/completions", timeout=90).status_code
            )
        )
        client.start()  # a generation in flight: the drain waits
        wait_for(lambda: runtime.in_flight > 0, what="the generation to start")
        drain = Drain(60, f"{runtime.url}/metrics", METRIC, 0)
        agent = start_agent(
            tmp_path / "a1", "node-a", owner.public, config=OLD_CONFIG, keep_port=True
        )
        try:
            jobs = f"{agent.url}/v1/nodes/node-a/jobs"
            stage = envelope(job("stage-1", kind="stage", artifacts=artifacts), owner.signing)
            httpx.post(jobs, json=stage, timeout=10)
            wait_for(lambda: agent.get("jobs/stage-1")["state"] == "succeeded", what="staged")
            apply = envelope(job("apply-1", artifacts=artifacts, drain=drain), owner.signing)
            httpx.post(jobs, json=apply, timeout=10)
            wait_for(lambda: agent.get("jobs/apply-1")["state"] == "running", what="the drain")
            assert (agent.state / "models" / ident / "model.gguf").is_file()
            agent.process.send_signal(signal.SIGKILL)
            agent.process.wait()
            # What a kill while laying out would leave: a directory being built.
            leftover = agent.state / "models" / f".building-{ident}"
            (leftover / "tokenizer").mkdir(parents=True)
            (leftover / "model.gguf").write_bytes(b"half")

            agent.restart()
            failed = agent.get("jobs/apply-1")
            runtime.released.set()
            client.join()
            again = envelope(
                job("apply-2", attempt=2, artifacts=artifacts, drain=drain), owner.signing
            )
            httpx.post(jobs, json=again, timeout=10)
            done = wait_for(
                lambda: (r := agent.get("jobs/apply-2"))["state"] in ("succeeded", "failed") and r,
                what="the job run again",
                timeout=60,
            )
        finally:
            agent.close()
    assert failed["state"] == "failed"
    assert failed["error"] == "agent restarted before the job ran; nothing was changed"
    assert done["state"] == "succeeded", done
    config = load_yaml("hermes.yaml", agent.config_bytes() or b"")
    model_dir = agent.state.absolute() / "models" / ident
    assert config["modelDir"] == str(model_dir)
    assert sorted(p.name for p in (agent.state / "models").iterdir()) == [ident, f"{ident}.json"]
    store = agent.state / "artifacts" / "sha256"
    for artifact in artifacts:
        assert (model_dir / artifact.layout_path).read_bytes() == (
            store / artifact.sha256
        ).read_bytes()


def test_an_agent_sigkilled_after_activating_tells_the_config_was_left_new(
    tmp_path: Path, owner: Key, nginx: NginxServer, files: Path
) -> None:
    artifacts = _model(nginx, files, 0)
    started = tmp_path / "after-apply-started"
    agent = start_agent(
        tmp_path / "a1",
        "node-a",
        owner.public,
        config=OLD_CONFIG,
        keep_port=True,
        after_apply=f"touch {started}; sleep 120",
    )
    try:
        jobs = f"{agent.url}/v1/nodes/node-a/jobs"
        stage = envelope(job("stage-1", kind="stage", artifacts=artifacts), owner.signing)
        httpx.post(jobs, json=stage, timeout=10)
        wait_for(lambda: agent.get("jobs/stage-1")["state"] == "succeeded", what="staged")
        apply = envelope(job("apply-1", artifacts=artifacts), owner.signing)
        httpx.post(jobs, json=apply, timeout=10)
        wait_for(started.exists, what="the after-apply command")
        agent.process.send_signal(signal.SIGKILL)
        agent.process.wait()
        agent.restart()
        failed = agent.get("jobs/apply-1")
    finally:
        agent.close()
    # The config written holds modelDir: recovery tells it from the old one.
    assert failed["error"] == "agent restarted during apply; config left as new"
    assert load_yaml("hermes.yaml", agent.config_bytes() or b"")["modelDir"] == str(
        agent.state.absolute() / "models" / _model_id(artifacts)
    )
