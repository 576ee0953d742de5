"""The node-side glue shipped for llama.cpp (example-repo/deploy/):
llama-server-after-apply.sh restarts a real llama-server on the model the
runtime config names and exits 0 only once it answers /health; the systemd
unit template it restarts under systemd."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.cli.llama_runtime import LlamaNode, after_apply_script, free_port
from tests.kit.llama import Models, complete, health, llama_server_binary


@pytest.fixture
def node(tmp_path: Path) -> Iterator[LlamaNode]:
    server = LlamaNode(llama_server_binary(), free_port(), tmp_path / "run")
    try:
        yield server
    finally:
        server.stop()


def _config(path: Path, body: str) -> Path:
    path.write_text("provider: llama.cpp\nmodel: tiny\nprofile: default\n" + body)
    return path


def _model_dir(models: Models, seed: int) -> Path:
    return models.model(seed).parent


def test_it_restarts_the_server_on_the_model_directory_of_each_config(
    tmp_path: Path, node: LlamaNode, models: Models
) -> None:
    first = _config(tmp_path / "a.yaml", f"modelDir: {_model_dir(models, 1)}\n")
    done = node.start(first)
    assert done.returncode == 0, done.stderr
    assert complete(node.url)["model"] == str(models.model(1))
    pid = node.pid_file.read_text()

    second = _config(tmp_path / "b.yaml", f"modelDir: '{_model_dir(models, 2)}'\n")
    done = node.start(second)
    assert done.returncode == 0, done.stderr
    assert f"serves {models.model(2)}" in done.stdout
    assert complete(node.url)["model"] == str(models.model(2))
    assert node.pid_file.read_text() != pid
    assert not Path(f"/proc/{pid.strip()}").exists()  # the old server is gone


def test_a_config_without_model_directory_names_its_one_artifact(
    tmp_path: Path, node: LlamaNode, models: Models
) -> None:
    path = models.model(3)
    config = _config(
        tmp_path / "c.yaml", f"artifacts:\n  weights:\n    path: {path}\n    sha256: {'a' * 64}\n"
    )
    done = node.start(config)
    assert done.returncode == 0, done.stderr
    assert complete(node.url)["model"] == str(path)


def test_a_model_that_does_not_load_fails_with_the_servers_words(
    tmp_path: Path, node: LlamaNode, models: Models
) -> None:
    config = _config(tmp_path / "bad.yaml", f"modelDir: {models.truncated().parent}\n")
    done = node.start(config)
    assert done.returncode != 0
    assert "llama-server exited while loading" in done.stderr
    assert str(node.log) in done.stderr
    assert health(node.url) == 0


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("", "has no modelDir and no artifacts"),
        ("modelDir: /nonexistent/models/abc\n", "/nonexistent/models/abc/model.gguf"),
    ],
)
def test_a_config_it_cannot_use_fails_before_touching_the_server(
    tmp_path: Path, node: LlamaNode, body: str, says: str
) -> None:
    done = node.start(_config(tmp_path / "x.yaml", body))
    assert done.returncode != 0
    assert says in done.stderr
    assert not node.pid_file.exists()


def test_stop_stops_the_server_of_its_port_and_starts_none(
    tmp_path: Path, node: LlamaNode, models: Models
) -> None:
    """The slot script stops a slot this way (test_llama_slot_script.py)."""
    started = node.start(_config(tmp_path / "a.yaml", f"modelDir: {_model_dir(models, 1)}\n"))
    assert started.returncode == 0, started.stderr
    pid = node.pid_file.read_text().strip()

    done = subprocess.run(
        ["bash", str(after_apply_script()), "stop"],
        env={**os.environ, **node.environment()},
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout == f"port {node.port}: llama-server {pid} stopped\n"
    assert not node.pid_file.exists()
    assert not Path(f"/proc/{pid}").exists()
    assert health(node.url) == 0


def test_the_systemd_unit_template_is_one_systemd_accepts(tmp_path: Path) -> None:
    """systemd's own checker (systemd-analyze verify) on an instance of the
    template, its binary pointed at one that exists on this machine."""
    unit = (after_apply_script().parent / "llama-server@.service").read_text()
    assert "EnvironmentFile=/run/llama-server/%i.env" in unit  # what the script writes
    (tmp_path / "llama-server@.service").write_text(
        unit.replace("/usr/local/bin/llama-server", str(llama_server_binary()))
    )
    checked = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", "llama-server@8080.service"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert (checked.returncode, checked.stderr) == (0, "")
    assert os.access(after_apply_script(), os.X_OK)


def test_stopping_a_node_leaves_alone_a_process_that_took_its_stale_pid(tmp_path: Path) -> None:
    """A pid file can outlive its server, and the kernel hands its pid to
    another process: stopping the node must not signal that one."""
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        node = LlamaNode(tmp_path / "llama-server", free_port(), tmp_path / "run")
        node.run_dir.mkdir()
        node.pid_file.write_text(f"{stranger.pid}\n")

        node.stop()

        assert stranger.poll() is None  # still running, never signalled
    finally:
        stranger.kill()
        stranger.wait()
