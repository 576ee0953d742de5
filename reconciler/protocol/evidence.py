"""Signed answers (docs/trust.md): the agent signs what it says, the
daemon believes it only when the signature verifies against the node's
``agentKey``.

An answer object carries ``evidence: {keyId, signature}``: an Ed25519
signature, standard base64, over the canonical JSON (the job envelope's rules, docs/protocol.md) of
the answer without ``evidence``. The signature covers the whole answer, so
fields added to an answer later are covered without a change here.

Recorded evidence (a node's ``evidence`` in status) is checked with the
same rule: each kept answer's canonical JSON against its signature.

Must not do HTTP, read the clock or decide anything about rollouts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from reconciler.protocol.observations import SignedAnswer
from reconciler.protocol.signing import (
    ED25519_BLOB_PREFIX,
    SigningKey,
    TrustedKey,
    blob_fingerprint,
    canonical_json,
)

EVIDENCE = "evidence"


def sign_answer(answer: Mapping[str, Any], key: SigningKey | None) -> dict[str, Any]:
    """``answer`` with its ``evidence``; unchanged (a copy) without a key."""
    body = {k: v for k, v in answer.items() if k != EVIDENCE}
    if key is None:
        return body
    signature = base64.b64encode(key.sign(canonical_json(body))).decode("ascii")
    return {**body, EVIDENCE: {"keyId": key.key_id, "signature": signature}}


def signed_answer_bytes(answer: Mapping[str, Any], key: SigningKey | None) -> bytes:
    """``sign_answer(answer, key)`` as JSON bytes, encoded once: the signed
    canonical JSON with ``evidence`` spliced in as its last member. JSON
    objects are unordered, so a reader that takes ``evidence`` out and
    canonicalises the rest gets the signed bytes back (an agent answers
    thousands of requests a second; a second encoding is a third of a
    signature's cost)."""
    if EVIDENCE in answer:
        answer = {k: v for k, v in answer.items() if k != EVIDENCE}
    data = canonical_json(answer)
    if key is None:
        return data
    signature = base64.b64encode(key.sign(data))
    evidence = b'"evidence":{"keyId":"%s","signature":"%s"}}' % (key.key_id.encode(), signature)
    return data[:-1] + (b"," if len(data) > 2 else b"") + evidence


def split_answer(answer: Mapping[str, Any]) -> SignedAnswer | None:
    """The answer and its evidence as a value, or None when it carries none
    (or a malformed one: that is no evidence either)."""
    evidence = answer.get(EVIDENCE)
    if not isinstance(evidence, dict):
        return None
    key_id, signature = evidence.get("keyId"), evidence.get("signature")
    if not isinstance(key_id, str) or not isinstance(signature, str):
        return None
    return SignedAnswer({k: v for k, v in answer.items() if k != EVIDENCE}, key_id, signature)


def evidence_problem(signed: SignedAnswer | None, key: TrustedKey) -> str:
    """Empty when ``signed`` verifies against ``key``; else why not, in words."""
    if signed is None:
        return "the answer carries no evidence (is the agent started with --key?)"
    return signature_problem(signed.body, signed.key_id, signed.signature, key)


def signature_problem(body: Any, key_id: str, signature: str, key: TrustedKey) -> str:
    """Empty when ``signature`` by ``key_id`` signs ``canonical_json(body)``
    and ``key_id`` is ``key``; else why not."""
    if key_id != key.key_id:
        return f"signed by key {key_id}, not by the node's agentKey {key.key_id}"
    try:
        data = canonical_json(body)
    except (TypeError, ValueError):
        return "the signed answer is not a JSON object"
    return signed_bytes_problem(data, key_id, signature, key)


def signed_bytes_problem(data: bytes, key_id: str, signature: str, key: TrustedKey) -> str:
    """``signature_problem`` for an answer already in canonical JSON ``data``."""
    if key_id != key.key_id:
        return f"signed by key {key_id}, not by the node's agentKey {key.key_id}"
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return "the signature is not standard base64"
    if not key.verify(data, raw):
        return f"bad signature for key {key.key_id}"
    return ""


def parse_agent_key(line: str, source: str = "") -> TrustedKey:
    """A node's ``agentKey``: one OpenSSH ``ssh-ed25519 AAAA... [comment]``
    line; ValueError saying what is wrong otherwise."""
    parts = line.strip().split()
    if len(parts) < 2 or parts[0] != "ssh-ed25519":
        raise ValueError("must be an OpenSSH Ed25519 public key line: ssh-ed25519 AAAA... comment")
    # The key data is the SSH wire form: its prefix, then the 32 key bytes
    # (read directly: cryptography's OpenSSH parser costs several times more).
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        blob = b""
    if len(blob) != len(ED25519_BLOB_PREFIX) + 32 or not blob.startswith(ED25519_BLOB_PREFIX):
        raise ValueError("the ssh-ed25519 key data is not a valid public key")
    try:
        key = Ed25519PublicKey.from_public_bytes(blob[len(ED25519_BLOB_PREFIX) :])
    except (ValueError, UnsupportedAlgorithm):
        raise ValueError("the ssh-ed25519 key data is not a valid public key") from None
    return TrustedKey(blob_fingerprint(blob), key, source, raw=blob[len(ED25519_BLOB_PREFIX) :])


def derived_agent_key(seed: str, node: str) -> SigningKey:
    """The simulated fleet's key for ``node``: Ed25519 from SHA-256 of the
    seed and the node name, so tests and benchmarks can write each node's
    ``agentKey`` without asking the simulator. Never for real agents."""
    secret = hashlib.sha256(f"reconciler-sim-agent\0{seed}\0{node}".encode()).digest()
    return SigningKey(Ed25519PrivateKey.from_private_bytes(secret), f"sim seed, node {node}")
