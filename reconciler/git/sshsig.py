"""SSH signatures in git's format (OpenSSH ``SSHSIG``), checked and made in-process.

What this module is for:

- ``parse_allowed_signers``: read git's allowed-signers file (the file
  ``gpg.ssh.allowedSignersFile`` names) into ``AllowedSigner`` values, refusing
  a bad line with its ``source:line``.
- ``verify_sshsig``: check one armored ``-----BEGIN SSH SIGNATURE-----`` over
  a message against those signers, the way ``ssh-keygen -Y verify`` does when
  git calls it for ``git verify-commit`` (namespace, key, validity window at the
  commit's committer time), and say in words why a signature is refused.
- ``sign_commit_payload``: make such a signature with an Ed25519 key, for the
  gpgsig header of the daemon's status commits; ``sign_sshsig`` in any
  namespace (a reviewer's approval, docs/trust.md).

Pure: bytes and values in, values out. No Git, no files, no subprocesses;
the only clock reading is ``verify_sshsig``'s default when ``at`` is omitted.

The format (OpenSSH PROTOCOL.sshsig): the armored blob is
``"SSHSIG" || uint32 version=1 || string publickey || string namespace ||
string reserved || string hash_algorithm || string signature``, and the key
signs ``"SSHSIG" || string namespace || string reserved || string
hash_algorithm || string H(message)``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from reconciler.spec.errors import ReconcilerError

MAGIC = b"SSHSIG"
ARMOR_BEGIN = "-----BEGIN SSH SIGNATURE-----"
ARMOR_END = "-----END SSH SIGNATURE-----"

# Public key types we can verify; the value is what `ssh-keygen -l` prints.
KEY_TYPES: dict[str, str] = {
    "ssh-ed25519": "ED25519",
    "ecdsa-sha2-nistp256": "ECDSA",
    "ecdsa-sha2-nistp384": "ECDSA",
    "ecdsa-sha2-nistp521": "ECDSA",
    "ssh-rsa": "RSA",
}
_ECDSA: dict[str, tuple[ec.EllipticCurve, hashes.HashAlgorithm]] = {
    "ecdsa-sha2-nistp256": (ec.SECP256R1(), hashes.SHA256()),
    "ecdsa-sha2-nistp384": (ec.SECP384R1(), hashes.SHA384()),
    "ecdsa-sha2-nistp521": (ec.SECP521R1(), hashes.SHA512()),
}
# RSA signature algorithms SSHSIG allows: never SHA-1 "ssh-rsa".
_RSA_SIG: dict[str, hashes.HashAlgorithm] = {
    "rsa-sha2-256": hashes.SHA256(),
    "rsa-sha2-512": hashes.SHA512(),
}
_MESSAGE_HASHES = {"sha256": hashlib.sha256, "sha512": hashlib.sha512}
# Words for foreign armour, so a refusal names what was found.
_FOREIGN_ARMOR = {
    "-----BEGIN PGP SIGNATURE-----": "an OpenPGP signature",
    "-----BEGIN PGP MESSAGE-----": "an OpenPGP message",
    "-----BEGIN SIGNED MESSAGE-----": "an X.509 (gpgsm) signature",
}


@dataclass(frozen=True)
class AllowedSigner:
    """One line of an allowed-signers file."""

    principals: tuple[str, ...]
    namespaces: tuple[str, ...] | None  # patterns; None: any namespace
    valid_after: datetime | None
    valid_before: datetime | None
    key_type: str
    key: bytes  # the SSH wire blob of the public key

    @property
    def key_id(self) -> str:
        return fingerprint(self.key)


@dataclass(frozen=True)
class SignatureCheck:
    """The verdict on one signature. ``reason`` is a sentence either way."""

    ok: bool
    reason: str
    principal: str | None = None  # the allowed-signers principals, comma-joined
    key_id: str | None = None  # SHA256:... of the signing key, when it could be read


def fingerprint(key_blob: bytes) -> str:
    """The key's fingerprint exactly as ``ssh-keygen -l`` prints it."""
    digest = base64.b64encode(hashlib.sha256(key_blob).digest()).decode("ascii")
    return "SHA256:" + digest.rstrip("=")


# --- allowed signers ------------------------------------------------------


def parse_allowed_signers(text: str, source: str = "allowed signers") -> tuple[AllowedSigner, ...]:
    """Parse git's allowed-signers format (``man ssh-keygen``, ALLOWED SIGNERS).

    ``principals [options] keytype base64-key [comment]``; blank lines and
    ``#`` comments are skipped. Options: ``namespaces="a,b"``,
    ``valid-after=``/``valid-before=`` (``YYYYMMDD[HHMM[SS]][Z]``; without
    ``Z`` the machine's local time, as OpenSSH and git read it).
    ``cert-authority`` is refused: certificates are not supported.
    """
    signers = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            signers.append(_parse_signer_line(line))
        except ValueError as exc:
            raise ReconcilerError(
                f"{source}:{number}: {exc}",
                "fix the line; the format is `principals [options] keytype base64-key`"
                " as in `man ssh-keygen` (ALLOWED SIGNERS)",
            ) from None
    return tuple(signers)


def _parse_signer_line(line: str) -> AllowedSigner:
    principals_text, rest = _take_token(line)
    principals = tuple(p for p in _unquote(principals_text).split(",") if p)
    if not principals:
        raise ValueError("no principals before the key")
    token, rest = _take_token(rest)
    options: dict[str, str | None] = {}
    if token and not _looks_like_key_type(token):
        options = _parse_options(token)
        token, rest = _take_token(rest)
    key_type = token
    key_text, _comment = _take_token(rest)
    if not key_type or not key_text:
        raise ValueError("expected a key type and a base64 key after the principals")
    if key_type not in KEY_TYPES:
        raise ValueError(
            f"key type {key_type!r} is not supported (supported: {', '.join(KEY_TYPES)})"
        )
    try:
        blob = base64.b64decode(key_text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"the {key_type} key is not valid base64") from None
    try:
        blob_type = _Reader(blob).string().decode("ascii", "replace")
    except ValueError:
        raise ValueError(f"the {key_type} key is truncated") from None
    if blob_type != key_type:
        raise ValueError(f"the key says {blob_type!r} but the line says {key_type!r}")
    try:
        _public_key(blob)
    except ValueError as exc:
        raise ValueError(f"the {key_type} key cannot be read: {exc}") from None

    namespaces: tuple[str, ...] | None = None
    valid_after = valid_before = None
    for name, value in options.items():
        if name == "cert-authority":
            raise ValueError(
                "cert-authority lines are not supported: list each signer's own public key"
            )
        if name not in ("namespaces", "valid-after", "valid-before"):
            raise ValueError(
                f"unknown option {name!r} (known: namespaces, valid-after, valid-before)"
            )
        if value is None:
            raise ValueError(f"option {name!r} needs a value")
        if name == "namespaces":
            namespaces = tuple(n.strip() for n in value.split(",") if n.strip())
        elif name == "valid-after":
            valid_after = parse_validity_time(value)
        else:
            valid_before = parse_validity_time(value)
    return AllowedSigner(principals, namespaces, valid_after, valid_before, key_type, blob)


def _looks_like_key_type(token: str) -> bool:
    # OpenSSH tells options from a key type by trying to read a key; every
    # key type name has one of these shapes, and no option does.
    return token in KEY_TYPES or token.startswith(("ssh-", "ecdsa-", "sk-", "rsa-"))


def _take_token(text: str) -> tuple[str, str]:
    """Split off the first whitespace-delimited token; quotes may hold spaces."""
    text = text.lstrip()
    in_quotes = False
    for index, char in enumerate(text):
        if char == '"':
            in_quotes = not in_quotes
        elif char in " \t" and not in_quotes:
            return text[:index], text[index:].lstrip()
    if in_quotes:
        raise ValueError("unterminated quote")
    return text, ""


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    return text


def _parse_options(token: str) -> dict[str, str | None]:
    options: dict[str, str | None] = {}
    for part in re.findall(r'(?:[^,"]|"[^"]*")+', token):
        name, sep, value = part.partition("=")
        options[name.lower()] = _unquote(value) if sep else None
    return options


_VALIDITY = re.compile(r"([0-9]{8})([0-9]{4})?([0-9]{2})?(Z)?", re.IGNORECASE)


def parse_validity_time(text: str) -> datetime:
    """``YYYYMMDD[HHMM[SS]][Z]`` as OpenSSH reads it: ``Z`` is UTC, else local time."""
    match = _VALIDITY.fullmatch(text.strip())
    if not match:
        raise ValueError(f"time {text!r} is not YYYYMMDD[HHMM[SS]][Z]")
    digits = match.group(1) + (match.group(2) or "0000") + (match.group(3) or "00")
    try:
        moment = datetime.strptime(digits, "%Y%m%d%H%M%S")
    except ValueError:
        raise ValueError(f"time {text!r} is not a real date") from None
    if match.group(4):
        return moment.replace(tzinfo=UTC)
    return moment.astimezone()  # naive -> the machine's local zone


# --- verifying ------------------------------------------------------------


class _Reader:
    """SSH wire format: uint32 and length-prefixed strings."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def raw(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise ValueError("truncated")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def uint32(self) -> int:
        value: int = struct.unpack(">I", self.raw(4))[0]
        return value

    def string(self) -> bytes:
        return self.raw(self.uint32())

    def mpint(self) -> int:
        return int.from_bytes(self.string(), "big", signed=True)

    def done(self) -> bool:
        return self.pos == len(self.data)


def _ssh_string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


_PublicKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey | rsa.RSAPublicKey


def _public_key(blob: bytes) -> _PublicKey:
    """A cryptography public key from an SSH wire blob; ValueError if unreadable."""
    reader = _Reader(blob)
    key_type = reader.string().decode("ascii", "replace")
    try:
        if key_type == "ssh-ed25519":
            raw = reader.string()
            if len(raw) != 32:
                raise ValueError("an Ed25519 key is 32 bytes")
            return ed25519.Ed25519PublicKey.from_public_bytes(raw)
        if key_type in _ECDSA:
            curve, _hash = _ECDSA[key_type]
            reader.string()  # curve name, implied by the key type
            return ec.EllipticCurvePublicKey.from_encoded_point(curve, reader.string())
        if key_type == "ssh-rsa":
            exponent = reader.mpint()
            modulus = reader.mpint()
            return rsa.RSAPublicNumbers(exponent, modulus).public_key()
    except (UnsupportedAlgorithm, TypeError) as exc:
        raise ValueError(str(exc)) from None
    raise ValueError(f"key type {key_type!r} is not supported")


def _verify_raw(key_blob: bytes, signature: bytes, signed: bytes) -> str | None:
    """Check the inner SSH signature; None if good, else why not."""
    public = _public_key(key_blob)
    reader = _Reader(signature)
    sig_type = reader.string().decode("ascii", "replace")
    sig = reader.string()
    try:
        if isinstance(public, ed25519.Ed25519PublicKey):
            if sig_type != "ssh-ed25519":
                return f"signature type {sig_type} does not fit an Ed25519 key"
            public.verify(sig, signed)
        elif isinstance(public, ec.EllipticCurvePublicKey):
            key_type = _Reader(key_blob).string().decode("ascii")
            if sig_type != key_type:
                return f"signature type {sig_type} does not fit a {key_type} key"
            inner = _Reader(sig)
            der = encode_dss_signature(inner.mpint(), inner.mpint())
            public.verify(der, signed, ec.ECDSA(_ECDSA[key_type][1]))
        else:
            if sig_type not in _RSA_SIG:
                return f"RSA signature type {sig_type} is not allowed (only rsa-sha2-256/512)"
            public.verify(sig, signed, padding.PKCS1v15(), _RSA_SIG[sig_type])
    except InvalidSignature:
        return "the signature does not match the signed content (changed after signing?)"
    return None


def verify_sshsig(
    armored: str,
    message: bytes,
    allowed: Sequence[AllowedSigner],
    *,
    namespace: str = "git",
    at: datetime | None = None,
) -> SignatureCheck:
    """Check an armored SSHSIG over ``message``, as ``git verify-commit`` would.

    ``at`` is the moment the allowed-signers validity windows are checked
    against: git passes the commit's committer time. Omitted: now.
    Never raises on bad input; every refusal is a ``SignatureCheck`` with a reason.
    """
    parsed = _parse(armored)
    if isinstance(parsed, SignatureCheck):
        return parsed
    key_id = fingerprint(parsed.key_blob)
    key_words = f"{_key_kind(parsed.key_blob)} key {key_id}"
    if parsed.namespace != namespace.encode():
        shown = parsed.namespace.decode("utf-8", "replace")
        return SignatureCheck(
            False,
            f"signed for namespace {shown!r}, not {namespace!r} (made with `ssh-keygen -Y sign -n {shown}`?)",
            key_id=key_id,
        )
    hasher = _MESSAGE_HASHES.get(parsed.hash_name.decode("ascii", "replace"))
    if hasher is None:
        return SignatureCheck(
            False,
            f"hash {parsed.hash_name.decode('ascii', 'replace')!r} is not sha256 or sha512",
            key_id=key_id,
        )
    signed = (
        MAGIC
        + _ssh_string(parsed.namespace)
        + _ssh_string(parsed.reserved)
        + _ssh_string(parsed.hash_name)
        + _ssh_string(hasher(message).digest())
    )
    try:
        problem = _verify_raw(parsed.key_blob, parsed.signature, signed)
    except ValueError as exc:
        return SignatureCheck(False, f"the signature cannot be read: {exc}", key_id=key_id)
    if problem:
        return SignatureCheck(False, f"bad signature by {key_words}: {problem}", key_id=key_id)
    moment = at if at is not None else datetime.now(UTC)
    if moment.tzinfo is None:
        moment = moment.astimezone()
    return _signer_of(parsed.key_blob, key_id, key_words, allowed, namespace, moment)


@dataclass(frozen=True)
class _Sshsig:
    """The fields of an SSHSIG blob, as read, not yet checked."""

    key_blob: bytes
    namespace: bytes
    reserved: bytes
    hash_name: bytes
    signature: bytes


def _parse(armored: str) -> _Sshsig | SignatureCheck:
    """The SSHSIG inside ``armored``, or the refusal saying why there is none."""
    text = armored.strip()
    for marker, words in _FOREIGN_ARMOR.items():
        if text.startswith(marker):
            return SignatureCheck(False, f"signed with {words}, not an SSH signature")
    if not text.startswith(ARMOR_BEGIN) or not text.endswith(ARMOR_END):
        return SignatureCheck(False, "the signature is not an SSH signature (no SSHSIG armour)")
    body = text[len(ARMOR_BEGIN) : -len(ARMOR_END)]
    try:
        blob = base64.b64decode("".join(body.split()), validate=True)
    except (binascii.Error, ValueError):
        return SignatureCheck(False, "the SSH signature is not valid base64")
    try:
        reader = _Reader(blob)
        if reader.raw(6) != MAGIC:
            return SignatureCheck(False, "the SSH signature does not start with SSHSIG")
        version = reader.uint32()
        fields = [reader.string() for _ in range(5)]
    except ValueError:
        return SignatureCheck(False, "the SSH signature is truncated")
    if version != 1:
        return SignatureCheck(False, f"SSH signature version {version} is not supported")
    return _Sshsig(*fields)


def _signer_of(
    key_blob: bytes,
    key_id: str,
    key_words: str,
    allowed: Sequence[AllowedSigner],
    namespace: str,
    moment: datetime,
) -> SignatureCheck:
    """The allowed signer a good signature by ``key_blob`` counts for at
    ``moment``, or why none does (namespaces, validity windows)."""
    candidates = [s for s in allowed if s.key == key_blob]
    if not candidates:
        return SignatureCheck(
            False,
            f"good signature by {key_words}, but that key is not an allowed signer",
            key_id=key_id,
        )
    refusals = []
    for signer in candidates:
        who = ",".join(signer.principals)
        if signer.namespaces is not None and not any(
            fnmatchcase(namespace, pattern) for pattern in signer.namespaces
        ):
            refusals.append(f"{who} may sign only namespaces {','.join(signer.namespaces)}")
        elif signer.valid_after is not None and moment < signer.valid_after:
            refusals.append(
                f"{who}'s key is valid only after {_show(signer.valid_after)}, signed at {_show(moment)}"
            )
        elif signer.valid_before is not None and moment > signer.valid_before:
            refusals.append(
                f"{who}'s key was valid only until {_show(signer.valid_before)}, signed at {_show(moment)}"
            )
        else:
            return SignatureCheck(True, f"good signature by {who} with {key_words}", who, key_id)
    return SignatureCheck(
        False, f"good signature by {key_words}, but " + "; ".join(refusals), key_id=key_id
    )


def _key_kind(blob: bytes) -> str:
    try:
        return KEY_TYPES.get(_Reader(blob).string().decode("ascii"), "unknown")
    except (ValueError, UnicodeDecodeError):
        return "unknown"


def _show(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- signing --------------------------------------------------------------


def sign_commit_payload(private_key: ed25519.Ed25519PrivateKey, payload: bytes) -> str:
    """An armored SSHSIG (namespace ``git``, sha512) over a commit's content,
    byte for byte what ``ssh-keygen -Y sign -n git`` writes, for the gpgsig header."""
    return sign_sshsig(private_key, payload, "git")


def sign_sshsig(private_key: ed25519.Ed25519PrivateKey, message: bytes, namespace: str) -> str:
    """An armored SSHSIG (sha512) over ``message`` in ``namespace``, byte for
    byte what ``ssh-keygen -Y sign -n NAMESPACE`` writes with that key."""
    public_blob = _ssh_string(b"ssh-ed25519") + _ssh_string(
        private_key.public_key().public_bytes_raw()
    )
    space, reserved, hash_name = namespace.encode("utf-8"), b"", b"sha512"
    signed = (
        MAGIC
        + _ssh_string(space)
        + _ssh_string(reserved)
        + _ssh_string(hash_name)
        + _ssh_string(hashlib.sha512(message).digest())
    )
    signature = _ssh_string(b"ssh-ed25519") + _ssh_string(private_key.sign(signed))
    blob = (
        MAGIC
        + struct.pack(">I", 1)
        + _ssh_string(public_blob)
        + _ssh_string(space)
        + _ssh_string(reserved)
        + _ssh_string(hash_name)
        + _ssh_string(signature)
    )
    encoded = base64.b64encode(blob).decode("ascii")
    lines = [encoded[i : i + 70] for i in range(0, len(encoded), 70)]
    return "\n".join([ARMOR_BEGIN, *lines, ARMOR_END]) + "\n"
