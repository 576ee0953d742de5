"""Small llama-architecture GGUF models, written with the llama.cpp
project's own ``gguf`` library, for the model demo and the tests: a
vocabulary of 512 tokens, 64-wide embeddings, 2 blocks and random float32
weights drawn from a seeded generator (about 0.6 MB).

The same seed and name give the same bytes; two seeds give two models that
answer differently at temperature 0; the same seed under another name gives
another file (another digest) with the same weights, so the same answers.

``gguf`` comes with the ``demo`` (and ``test``) extra: a node or a daemon
never needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from reconciler.spec.errors import ReconcilerError

VOCAB = 512
EMBED = 64
BLOCKS = 2  # feed-forward width: twice the embeddings
HEADS = 4
CONTEXT = 8192  # the most a server may give a slot; tests of long generations use it
BYTE_TOKENS = 256
CONTROL = ("<unk>", "<s>", "</s>")


class GgufMissing(ReconcilerError):
    """The ``gguf`` library is not installed."""


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise GgufMissing(
            "writing a GGUF model needs PyPI's gguf, which is not installed",
            hint="pip install 'fleet-rollout-reconciler[demo]'",
        ) from None
    return gguf


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of a SentencePiece-style vocabulary:
    the control tokens, the 256 byte tokens, then word pieces."""
    gguf = _gguf()
    tokens = list(CONTROL)
    types = [int(gguf.TokenType.UNKNOWN), int(gguf.TokenType.CONTROL), int(gguf.TokenType.CONTROL)]
    tokens += [f"<0x{b:02X}>" for b in range(BYTE_TOKENS)]
    types += [int(gguf.TokenType.BYTE)] * BYTE_TOKENS
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-"
    pieces = ["\u2581"] + list(letters) + ["\u2581" + c for c in letters]
    pairs = (a + b for a in "etaoinshrdlu" for b in "etaoinshrdlucmw")
    while len(tokens) + len(pieces) < VOCAB:
        pieces.append(next(pairs))
    tokens += pieces
    types += [int(gguf.TokenType.NORMAL)] * len(pieces)
    scores = [0.0] * (len(CONTROL) + BYTE_TOKENS) + [-float(i) for i in range(len(pieces))]
    return tokens, scores, types


def _weights(seed: int, embed: int, blocks: int) -> dict[str, Any]:
    """Tensor name -> float32 array, in the order they are written; numpy's
    shape is ggml's reversed."""
    rng = np.random.default_rng(seed)
    feed_forward = 2 * embed

    def matrix(rows: int, columns: int) -> Any:
        return (rng.standard_normal((rows, columns)) / np.sqrt(columns)).astype(np.float32)

    ones = np.ones(embed, dtype=np.float32)
    tensors: dict[str, Any] = {"token_embd.weight": matrix(VOCAB, embed)}
    for block in range(blocks):
        prefix = f"blk.{block}."
        tensors[prefix + "attn_norm.weight"] = ones
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensors[prefix + name + ".weight"] = matrix(embed, embed)
        tensors[prefix + "ffn_norm.weight"] = ones
        tensors[prefix + "ffn_gate.weight"] = matrix(feed_forward, embed)
        tensors[prefix + "ffn_up.weight"] = matrix(feed_forward, embed)
        tensors[prefix + "ffn_down.weight"] = matrix(embed, feed_forward)
    tensors["output_norm.weight"] = ones
    tensors["output.weight"] = matrix(VOCAB, embed) * 4  # sharper logits: varied answers
    return tensors


def write_model(
    path: Path, seed: int, name: str = "", *, embed: int = EMBED, blocks: int = BLOCKS
) -> Path:
    """Write the model of ``seed`` to ``path``; ``name`` (default
    ``tiny-llama-SEED``) goes in ``general.name`` only. Wider ``embed`` and
    more ``blocks`` make a slower model."""
    gguf = _gguf()
    tokens, scores, types = vocabulary()
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name or f"tiny-llama-{seed}")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(embed)
    writer.add_block_count(blocks)
    writer.add_feed_forward_length(2 * embed)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(embed // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    for tensor_name, array in _weights(seed, embed, blocks).items():
        writer.add_tensor(tensor_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_truncated(path: Path, source: Path, keep: float = 0.5) -> Path:
    """A copy of ``source`` cut to ``keep`` of its length: what an
    interrupted copy of a shard looks like; llama.cpp refuses to load it."""
    data = source.read_bytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[: int(len(data) * keep)])
    return path
