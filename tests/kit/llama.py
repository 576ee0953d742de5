"""llama.cpp's llama-server for the tests: the binary `make llama-server`
builds, small seeded GGUF models written per test session, a server started
on a free loopback port, and what it answers.

    server = LlamaServer(llama_server_binary(), models.model(1), tmp_path / "log")
    with server:
        assert complete(server.url)["model"] == str(models.model(1))

A test that needs the binary and finds none fails, naming the make target:
the Makefile builds it before running the tests.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.cli.gguf_models import write_model, write_truncated
from reconciler.cli.llama_runtime import (
    BINARY_VARIABLE,
    SERVER_ARGS,
    cache_binary,
    find_binary,
    free_port,
    stop_process,
)
from reconciler.spec.artifacts import Artifact
from tests.kit.waiting import wait_for

PROMPT = "Hello"


def llama_server_binary() -> Path:
    found = find_binary()
    if found is None:
        pytest.fail(
            f"llama-server not found (${BINARY_VARIABLE}, or {cache_binary()}): "
            "run `make llama-server` once (it builds llama.cpp's pinned source release)",
            pytrace=False,
        )
    return found


class Models:
    """GGUF files written once per test session, in one folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def model(self, seed: int, name: str = "") -> Path:
        """The model of ``seed``; another ``name`` is another file (another
        digest) with the same weights."""
        path = self.folder / f"seed-{seed}{'-' + name if name else ''}" / "model.gguf"
        return path if path.exists() else write_model(path, seed, name)

    def slow(self, seed: int) -> Path:
        """A model with 512-wide embeddings and 6 blocks (65 MB): each token
        costs tens of times what one of ``model``'s does."""
        path = self.folder / f"seed-{seed}-slow" / "model.gguf"
        return path if path.exists() else write_model(path, seed, embed=512, blocks=6)

    def truncated(self, seed: int = 1) -> Path:
        """The model of ``seed`` cut in half: llama.cpp refuses to load it."""
        path = self.folder / f"seed-{seed}-truncated" / "model.gguf"
        return path if path.exists() else write_truncated(path, self.model(seed))


class LlamaServer:
    """``llama-server -m MODEL --host 127.0.0.1 --port P --metrics -c 256
    -np 2`` as a child process; ``stop`` sends SIGTERM, then SIGKILL."""

    def __init__(self, binary: Path, model: Path, log: Path, args: str = SERVER_ARGS) -> None:
        self.binary = binary
        self.model = model
        self.log = log
        self.args = args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> LlamaServer:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    str(self.binary),
                    "-m",
                    str(self.model),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    *self.args.split(),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_healthy(self, timeout: float = 60) -> None:
        """Until /health answers 200; fails with the log's tail if the
        server exits first."""

        def ready() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(
                    f"llama-server exited ({self.process.returncode}): {self.log_tail()}"
                )
            return health(self.url) == 200

        wait_for(ready, timeout, what=f"llama-server on {self.url} to load {self.model}")

    def log_tail(self, lines: int = 5) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            stop_process(self.process.pid)
            self.process.wait()

    def __enter__(self) -> LlamaServer:
        self.start().wait_healthy()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def health(url: str) -> int:
    """/health's status; 0 when nothing answers."""
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code
    except httpx.HTTPError:
        return 0


def complete(url: str, prompt: str = PROMPT, max_tokens: int = 8, **extra: Any) -> Any:
    """The answer to a ``/v1/completions`` request at temperature 0."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()


def metric(url: str, name: str) -> float | None:
    """The sum of ``name``'s series in /metrics; None when absent."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{")
    ]
    return sum(values) if values else None


def served_model(url: str) -> str:
    """The file the server at ``url`` loaded (its ``/v1/models`` id)."""
    return str(json.loads(httpx.get(f"{url}/v1/models", timeout=10).text)["data"][0]["id"])


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def model_artifact(url: str, model: Path, name: str = "weights") -> Artifact:
    """The artifact of ``model`` served at ``url``."""
    fields: dict[str, Any] = {
        "name": name,
        "url": url,
        "sha256": file_digest(model),
        "size": model.stat().st_size,
    }
    if "path" in Artifact.__dataclass_fields__:  # an agent that lays out model directories
        fields["path"] = "model.gguf"
    return Artifact(**fields)


def node_config(model: Path, seed: int) -> bytes:
    """A node's runtime config before any rollout, naming ``model`` the way
    the agent names a staged artifact (the after-apply script loads it)."""
    return (
        f"provider: llama.cpp\nmodel: tiny-llama-{seed}\nprofile: default\n"
        f"artifacts:\n  weights:\n    path: {model}\n    sha256: {file_digest(model)}\n"
    ).encode()


def which_model(answer_model: str, candidates: dict[str, Path]) -> str:
    """The label of the candidate whose bytes the file an answer names
    holds (the agent's copy of a model is another path, the same bytes)."""
    digest = file_digest(Path(answer_model))
    for label, path in candidates.items():
        if file_digest(path) == digest:
            return label
    raise AssertionError(f"{answer_model} is none of {sorted(candidates)}")
