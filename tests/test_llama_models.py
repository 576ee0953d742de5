"""The models the tests and the model demo generate (reconciler/cli/gguf_models.py),
served by a real llama-server built from llama.cpp's pinned source release:
deterministic bytes per seed, different seeds answering differently, the
same weights under another name answering the same from another digest,
and a truncated file the server refuses to load."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import gguf
import pytest

from reconciler.cli.gguf_models import VOCAB, write_model
from reconciler.cli.llama_runtime import IDLE_METRICS
from tests.kit.llama import LlamaServer, Models, complete, llama_server_binary, metric


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_seed_gives_the_same_bytes_and_another_name_another_digest(tmp_path: Path) -> None:
    first = write_model(tmp_path / "a" / "model.gguf", 7)
    again = write_model(tmp_path / "b" / "model.gguf", 7)
    renamed = write_model(tmp_path / "c" / "model.gguf", 7, "A2")
    other = write_model(tmp_path / "d" / "model.gguf", 8)
    assert _digest(first) == _digest(again)
    assert len({_digest(first), _digest(renamed), _digest(other)}) == 3
    assert 400_000 < first.stat().st_size < 800_000
    reader = gguf.GGUFReader(first)
    tokens = reader.fields["tokenizer.ggml.tokens"]
    types = reader.fields["tokenizer.ggml.token_type"]
    assert len(tokens.data) == VOCAB
    byte_type = int(gguf.TokenType.BYTE)
    assert [int(types.parts[i][0]) for i in types.data[3:259]] == [byte_type] * 256
    assert bytes(tokens.parts[tokens.data[3 + 0x41]]).decode() == "<0x41>"


def test_seeds_answer_differently_and_the_same_weights_answer_the_same(
    tmp_path: Path, models: Models
) -> None:
    binary = llama_server_binary()
    answers = {}
    for label, path in {
        "A": models.model(1),
        "A2": models.model(1, "A2"),
        "B": models.model(2),
    }.items():
        with LlamaServer(binary, path, tmp_path / f"{label}.log") as server:
            first = complete(server.url, max_tokens=16)
            assert complete(server.url, max_tokens=16)["choices"] == first["choices"]
            assert first["model"] == str(path)  # the answer names the file it came from
            assert metric(server.url, IDLE_METRICS[0]) == 0
            assert metric(server.url, IDLE_METRICS[1]) == 0
            answers[label] = first["choices"][0]["text"]
    assert answers["A"] == answers["A2"]
    assert answers["A"] != answers["B"]


def test_a_truncated_model_is_refused_and_the_server_exits(tmp_path: Path, models: Models) -> None:
    server = LlamaServer(llama_server_binary(), models.truncated(), tmp_path / "bad.log").start()
    try:
        assert server.process is not None
        code = server.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.stop()
        raise AssertionError(f"llama-server kept running: {server.log_tail()}") from None
    assert code != 0
    assert "model" in server.log_tail(20).lower()


def test_a_missing_binary_fails_the_test_naming_the_make_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECONCILER_LLAMA_SERVER", str(tmp_path / "nowhere" / "llama-server"))
    with pytest.raises(pytest.fail.Exception, match="run `make llama-server` once"):
        llama_server_binary()
    monkeypatch.delenv("RECONCILER_LLAMA_SERVER")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(pytest.fail.Exception, match=str(tmp_path / "cache" / "reconciler")):
        llama_server_binary()
