"""Pinned TLS between the daemon and agents (docs/trust.md).

An agent serves HTTPS with a certificate of its own (``reconciler keys tls``
makes a self-signed one); its node file pins it with ``agentCertSha256``,
the SHA-256 of the certificate's DER bytes, as 64 hex digits or
``sha256:`` + base64. Whoever talks to an agent accepts exactly the pinned
certificate, whatever CA or hostname, and checks it after the handshake,
before a single byte of a request is written.

Must not do HTTP or decide anything about rollouts.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import os
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from reconciler.spec.errors import KeyFileError

CERT_DAYS = 3650  # a pinned certificate's expiry is not what protects it


def parse_pin(text: str) -> bytes:
    """The 32-byte SHA-256 of an ``agentCertSha256`` value; ValueError otherwise."""
    value = text.strip()
    if value.startswith("sha256:"):
        try:
            digest = base64.b64decode(value[len("sha256:") :] + "==", validate=False)
        except (binascii.Error, ValueError):
            digest = b""
    else:
        try:
            digest = bytes.fromhex(value.replace(":", ""))
        except ValueError:
            digest = b""
    if len(digest) != 32:
        raise ValueError("must be 64 hex digits or sha256: + base64 of a SHA-256")
    return digest


def cert_sha256(der: bytes) -> str:
    """The pin of a certificate, in hex: what ``agentCertSha256`` holds."""
    return hashlib.sha256(der).hexdigest()


def pin_problem(der: bytes | None, pin: bytes) -> str:
    """Empty when the peer's certificate ``der`` is the pinned one; else why not."""
    if der is None:
        return "the peer presented no certificate"
    got = hashlib.sha256(der).digest()
    if got != pin:
        return (
            f"the peer's certificate has SHA-256 {got.hex()}, "
            f"not the pinned agentCertSha256 {pin.hex()}"
        )
    return ""


def client_context() -> ssl.SSLContext:
    """TLS for talking to pinned agents: no CA or hostname check, since the
    pin, checked on every connection before anything is sent, is stricter."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """The agent's HTTPS context; ``KeyFileError`` naming the file if unusable."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise KeyFileError(
            f"cannot use TLS certificate {cert} with key {key}: {exc}",
            "make a pair with: reconciler keys tls --out DIR --name NODE",
        ) from None
    return context


def generate_cert(out_dir: Path, name: str) -> tuple[Path, Path, str]:
    """Write a self-signed certificate ``DIR/NAME.crt`` and its key
    ``DIR/NAME.key`` (mode 0600); returns both paths and the pin (hex)."""
    crt_path, key_path = out_dir / f"{name}.crt", out_dir / f"{name}.key"
    for existing in (crt_path, key_path):
        if existing.exists():
            raise KeyFileError(
                f"{existing} already exists",
                "choose another --out directory, or move the old files away first",
            )
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        os.chmod(key_path, 0o600)
        crt_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    except OSError as exc:
        raise KeyFileError(f"cannot write into {out_dir}: {exc.strerror}") from exc
    return crt_path, key_path, cert_sha256(cert.public_bytes(serialization.Encoding.DER))
