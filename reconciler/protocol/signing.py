"""Ed25519 keys and signed job envelopes: the one module both sides use.

The daemon signs job payloads with its OpenSSH Ed25519 key; agents (and the
simulated fleet) verify them against the public keys they trust. A key is
named by its fingerprint exactly as ``ssh-keygen -l`` prints it
(``SHA256:`` + unpadded base64 of the SHA-256 of the public key blob).

Envelope (docs/protocol.md)::

    {"payload": {...}, "keyId": "SHA256:...", "signature": "<standard base64>"}

The signature covers ``canonical_json(payload)``. ``verify_envelope`` runs the
first checks of an agent, in the documented order (``invalid_job``,
``untrusted_key``, ``bad_signature``) and raises ``JobRefused`` with the code.
The node, time and runtime checks belong to the agent, which knows them.

This module must not do HTTP, read the clock or decide anything about
rollouts; it reads key files only in the ``load_*`` functions.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from nacl.bindings import crypto_sign, crypto_sign_open, crypto_sign_seed_keypair
from nacl.exceptions import BadSignatureError

from reconciler.spec.errors import KeyFileError

PRIVATE_KEY_NAME = "reconciler"
PUBLIC_KEY_NAME = "reconciler.pub"
KEY_COMMENT = "reconciler"


class JobRefused(Exception):
    """A posted job fails a check; ``code`` is the protocol's error code and
    ``status`` the HTTP status an agent answers with."""

    STATUS: ClassVar[dict[str, int]] = {
        "invalid_job": 400,
        "untrusted_key": 403,
        "bad_signature": 403,
        "wrong_node": 421,
        "expired": 422,
        "not_yet_valid": 422,
        "unsupported_runtime": 422,
        "live_not_allowed": 403,
        "job_conflict": 409,
    }

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = self.STATUS.get(code, 400)


def fingerprint(public_key: Ed25519PublicKey) -> str:
    """``SHA256:...`` exactly as ``ssh-keygen -lf`` prints it."""
    return blob_fingerprint(_public_blob(public_key))


# The SSH wire form of an Ed25519 public key (RFC 8709): string "ssh-ed25519",
# then a string of the 32 key bytes. Built directly: cryptography's OpenSSH
# serialiser costs ten times as much, and a daemon reads 10,000 agentKeys.
ED25519_BLOB_PREFIX = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20"


def _raw_public(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _public_blob(public_key: Ed25519PublicKey) -> bytes:
    return ED25519_BLOB_PREFIX + _raw_public(public_key)


def blob_fingerprint(blob: bytes) -> str:
    """``fingerprint`` of a public key's SSH wire form."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")


# Signing and checking run in libsodium (PyNaCl), the same Ed25519 (RFC 8032)
# as cryptography's: signatures are deterministic, so byte for byte the same,
# and libsodium's check is at least as strict (it also refuses small-order
# keys and R points). Measured in one run, a check costs about half of
# cryptography's (50 against 97 us) and a signature two thirds (21 against
# 31 us); the daemon and an agent do one of each per job. Keys are still
# read and written with cryptography. tests/test_signing_sodium.py pins both
# against cryptography's own answers.
SIGNATURE_BYTES = 64


@dataclass(frozen=True)
class TrustedKey:
    """A public key an agent accepts jobs from."""

    key_id: str
    public_key: Ed25519PublicKey
    source: str = ""  # where it was loaded from, for messages
    raw: bytes = field(default=b"", compare=False, repr=False)  # the 32 key bytes

    def __post_init__(self) -> None:
        if not self.raw:
            object.__setattr__(self, "raw", _raw_public(self.public_key))

    @classmethod
    def from_public_key(cls, public_key: Ed25519PublicKey, source: str = "") -> TrustedKey:
        return cls(fingerprint(public_key), public_key, source)

    def verify(self, data: bytes, signature: bytes) -> bool:
        # libsodium reads the first 64 bytes of its input as the signature:
        # any other length is refused here, or a short signature would borrow
        # the message's first bytes.
        if len(signature) != SIGNATURE_BYTES:
            return False
        try:
            crypto_sign_open(signature + data, self.raw)
        except BadSignatureError:
            return False
        return True


class SigningKey:
    """The daemon's private key. ``private_key`` is the cryptography object,
    for other signers (SSH commit signatures) that need it."""

    def __init__(self, private_key: Ed25519PrivateKey, source: str = "") -> None:
        self.private_key = private_key
        self.public_key = private_key.public_key()
        self.source = source
        seed = private_key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        self._sodium_secret = crypto_sign_seed_keypair(seed)[1]
        blob = _public_blob(self.public_key)
        self.key_id = blob_fingerprint(blob)
        self.public_openssh = f"ssh-ed25519 {base64.b64encode(blob).decode('ascii')} {KEY_COMMENT}"

    def sign(self, data: bytes) -> bytes:
        # libsodium answers signature + message; the signature is its first 64 bytes.
        return crypto_sign(data, self._sodium_secret)[:SIGNATURE_BYTES]

    def trusted(self) -> TrustedKey:
        """This key's public half, as an agent would trust it."""
        return TrustedKey(self.key_id, self.public_key, self.source)

    def __repr__(self) -> str:
        return f"SigningKey({self.key_id})"


# -- key files ---------------------------------------------------------------


def generate_key(out_dir: Path, name: str = PRIVATE_KEY_NAME) -> tuple[Path, Path]:
    """Write a new unencrypted OpenSSH Ed25519 key pair into ``out_dir``:
    ``NAME`` (mode 0600) and ``NAME.pub`` (default ``reconciler``; an
    agent's key is ``agent``). Refuses to overwrite."""
    out_dir = Path(out_dir)
    private_path = out_dir / name
    public_path = out_dir / f"{name}.pub"
    for existing in (private_path, public_path):
        if existing.exists():
            raise KeyFileError(
                f"{existing} already exists",
                "choose another --out directory, or move the old key away first",
            )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        key = Ed25519PrivateKey.generate()
        private_bytes = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        # Created 0600 from the start, never briefly readable by others.
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(private_bytes)
        os.chmod(private_path, 0o600)  # the umask may have removed bits, never added
        public = SigningKey(key).public_openssh.rsplit(" ", 1)[0]
        public_path.write_text(f"{public} {name}\n", encoding="ascii")
    except OSError as exc:
        raise KeyFileError(f"cannot write a key into {out_dir}: {exc.strerror}") from exc
    return private_path, public_path


def load_private_key(path: Path) -> SigningKey:
    """The OpenSSH Ed25519 private key at ``path``; refuses a file that group or
    others can read, as ssh does. The format is checked first: advice to make
    a file private is for files that are keys."""
    path = Path(path)
    try:
        data = path.read_bytes()
        mode = path.stat().st_mode
    except FileNotFoundError as exc:
        raise KeyFileError(
            f"private key {path} does not exist",
            "create one with: reconciler keys generate --out DIR",
        ) from exc
    except OSError as exc:
        raise KeyFileError(f"cannot read private key {path}: {exc.strerror}") from exc
    try:
        key = serialization.load_ssh_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise KeyFileError(
            f"{path} is not an unencrypted OpenSSH private key: {exc}",
            "use a key made by `reconciler keys generate` or `ssh-keygen -t ed25519 -N ''`",
        ) from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(
            f"{path} is a {type(key).__name__}, not an Ed25519 key",
            "generate one with: reconciler keys generate --out DIR",
        )
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"private key {path} is accessible by others (mode {stat.S_IMODE(mode):04o})",
            f"make it private: chmod 600 {path}",
        )
    return SigningKey(key, str(path))


def load_public_key(path: Path) -> TrustedKey:
    """An OpenSSH ``ssh-ed25519 AAAA... comment`` public key file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read public key {path}: {exc.strerror}") from exc
    try:
        key = serialization.load_ssh_public_key(data.strip())
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise KeyFileError(
            f"{path} is not an OpenSSH public key: {exc}",
            "pass the .pub file written next to the daemon's key",
        ) from exc
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} is not an Ed25519 public key (ssh-ed25519 ...)")
    return TrustedKey.from_public_key(key, str(path))


def load_trusted_keys(paths: list[Path]) -> dict[str, TrustedKey]:
    """Several trust keys (for rotation), by key id."""
    keys: dict[str, TrustedKey] = {}
    for path in paths:
        key = load_public_key(path)
        keys[key.key_id] = key
    if not keys:
        raise KeyFileError("no trust key given", "pass --trust-key FILE (the daemon's .pub file)")
    return keys


# -- envelopes ---------------------------------------------------------------


# Built once: json.dumps with options builds a new encoder on every call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(payload: Mapping[str, Any] | list[Any]) -> bytes:
    """The signed bytes: keys sorted, no spaces, UTF-8 not escaped; the same as
    ``json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``."""
    return _CANONICAL.encode(payload).encode("utf-8")


def make_envelope(payload: Mapping[str, Any], key: SigningKey) -> dict[str, Any]:
    signature = key.sign(canonical_json(payload))
    return {
        "payload": dict(payload),
        "keyId": key.key_id,
        "signature": base64.b64encode(signature).decode("ascii"),
    }


def envelope_bytes(payload: Mapping[str, Any], key: SigningKey) -> bytes:
    """``canonical_json(make_envelope(payload, key))``, encoding the payload once
    (the daemon signs thousands of jobs per pass)."""
    signed = canonical_json(payload)
    signature = base64.b64encode(key.sign(signed))
    return b'{"keyId":"%s","payload":%s,"signature":"%s"}' % (
        key.key_id.encode("ascii"),
        signed,
        signature,
    )


def verify_envelope(envelope: Any, trusted: Mapping[str, TrustedKey]) -> dict[str, Any]:
    """The verified payload of ``envelope``, or ``JobRefused`` with
    ``invalid_job``, ``untrusted_key`` or ``bad_signature``, in that order."""
    from reconciler.protocol.job_payload import payload_problems  # jobs holds the schema

    if not isinstance(envelope, dict):
        raise JobRefused("invalid_job", "the body is not a JSON object (a job envelope)")
    problems = payload_problems(envelope, envelope=True)
    if problems:
        raise JobRefused("invalid_job", "; ".join(problems))
    payload: dict[str, Any] = envelope["payload"]
    key = trusted.get(envelope["keyId"])
    if key is None:
        raise JobRefused(
            "untrusted_key",
            f"key {envelope['keyId']} is not trusted here; "
            "start the agent with --trust-key for the daemon's .pub file",
        )
    try:
        signature = base64.b64decode(envelope["signature"], validate=True)
    except (binascii.Error, ValueError):
        raise JobRefused("bad_signature", "the signature is not standard base64") from None
    if not key.verify(canonical_json(payload), signature):
        raise JobRefused(
            "bad_signature", f"the signature does not match the payload for key {key.key_id}"
        )
    return payload
