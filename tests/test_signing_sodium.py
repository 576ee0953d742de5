"""Ed25519 in libsodium against cryptography's: every signature the daemon
and the agents make is the one cryptography makes, and every check refuses
at least what cryptography's refuses (signing.py uses libsodium for speed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.protocol.evidence import parse_agent_key
from reconciler.protocol.signing import (
    SigningKey,
    TrustedKey,
    generate_key,
    load_private_key,
    load_public_key,
)


def verify_with(public_key: Ed25519PublicKey, data: bytes, signature: bytes) -> bool:
    """cryptography's own check, which ``TrustedKey.verify`` must refuse at least as."""
    try:
        public_key.verify(signature, data)
    except InvalidSignature:
        return False
    return True


# The order of the Ed25519 group: S and S + L are the same scalar, and only S < L is valid.
GROUP_ORDER = 2**252 + 27742317777372353535851937790883648493


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[SigningKey, TrustedKey]:
    root = tmp_path_factory.mktemp("keys")
    private, public = generate_key(root)
    return load_private_key(private), load_public_key(public)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=2048))
def test_signatures_are_cryptographys_byte_for_byte(
    keys: tuple[SigningKey, TrustedKey], data: bytes
) -> None:
    key, trusted = keys
    signature = key.sign(data)
    assert signature == key.private_key.sign(data)  # Ed25519 is deterministic
    assert trusted.verify(data, signature)


def test_an_ssh_keygen_key_signs_and_checks_as_cryptography_does(tmp_path: Path) -> None:
    path = tmp_path / "ops"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ops", "-f", str(path)], check=True
    )
    key = load_private_key(path)
    trusted = parse_agent_key((tmp_path / "ops.pub").read_text())
    data = b'{"jobId":"apply-0001","state":"succeeded"}'
    assert key.sign(data) == key.private_key.sign(data)
    assert trusted.raw == load_public_key(tmp_path / "ops.pub").raw
    assert trusted.verify(data, key.sign(data))


@settings(max_examples=200, deadline=None)
@given(data=st.binary(min_size=1, max_size=512), position=st.integers(0, 63), bit=st.integers(0, 7))
def test_a_changed_bit_of_the_signature_is_refused_by_both(
    keys: tuple[SigningKey, TrustedKey], data: bytes, position: int, bit: int
) -> None:
    key, trusted = keys
    signature = bytearray(key.sign(data))
    signature[position] ^= 1 << bit
    assert trusted.verify(data, bytes(signature)) is False
    assert verify_with(trusted.public_key, data, bytes(signature)) is False


@settings(max_examples=100, deadline=None)
@given(data=st.binary(min_size=1, max_size=512), position=st.integers(0, 511))
def test_a_changed_message_is_refused_by_both(
    keys: tuple[SigningKey, TrustedKey], data: bytes, position: int
) -> None:
    key, trusted = keys
    signature = key.sign(data)
    changed = bytearray(data)
    changed[position % len(data)] ^= 0x01
    assert trusted.verify(bytes(changed), signature) is False
    assert verify_with(trusted.public_key, bytes(changed), signature) is False


def test_another_keys_signature_is_refused(
    keys: tuple[SigningKey, TrustedKey], tmp_path: Path
) -> None:
    _, trusted = keys
    other = load_private_key(generate_key(tmp_path)[0])
    data = b"payload"
    assert trusted.verify(data, other.sign(data)) is False
    assert verify_with(trusted.public_key, data, other.sign(data)) is False


@pytest.mark.parametrize("length", [0, 1, 32, 63, 65, 128])
def test_a_signature_of_another_length_is_refused(
    keys: tuple[SigningKey, TrustedKey], length: int
) -> None:
    key, trusted = keys
    data = b"payload"
    signature = (key.sign(data) * 3)[:length]
    assert trusted.verify(data, signature) is False
    assert verify_with(trusted.public_key, data, signature) is False


def test_a_short_signature_cannot_borrow_the_messages_first_byte(
    keys: tuple[SigningKey, TrustedKey],
) -> None:
    """libsodium reads signature + message as one buffer: a 63-byte signature
    followed by a message whose first byte completes a real signature of the
    rest must still be refused."""
    key, trusted = keys
    rest = b'{"state":"succeeded"}'
    real = key.sign(rest)
    message = real[63:] + rest
    assert trusted.verify(message, real[:63]) is False
    assert verify_with(trusted.public_key, message, real[:63]) is False


def test_a_non_canonical_s_is_refused_by_both(keys: tuple[SigningKey, TrustedKey]) -> None:
    key, trusted = keys
    data = b"payload"
    signature = key.sign(data)
    s = int.from_bytes(signature[32:], "little") + GROUP_ORDER
    assert s < 2**256
    malleable = signature[:32] + s.to_bytes(32, "little")
    assert trusted.verify(data, malleable) is False
    assert verify_with(trusted.public_key, data, malleable) is False


def test_a_small_order_key_signs_nothing() -> None:
    """The identity point as a key with R = identity and S = 0 satisfies the
    bare equation for every message; libsodium refuses such keys outright."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    identity = (1).to_bytes(32, "little")
    trusted = TrustedKey.from_public_key(Ed25519PublicKey.from_public_bytes(identity))
    forged = identity + bytes(32)
    for data in (b"", b"payload", b'{"state":"succeeded"}'):
        assert trusted.verify(data, forged) is False
