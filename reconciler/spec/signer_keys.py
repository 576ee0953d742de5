"""The public keys of ``modelSigners``: what a key must be (an EC public key
on P-256 or P-384, in PEM), said in words a person can act on, and which
signers vouch for a model.

Pure: parses text, touches no file. Must not verify signatures (the agent
does, with the OpenSSF reference library, which takes the same keys).
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from reconciler.spec.artifacts import ModelSigner

# The curves the reference library's key verifier accepts.
CURVES = {"secp256r1": "P-256", "secp384r1": "P-384"}


def key_problem(text: str) -> str:
    """Why ``text`` is not a signer's key; "" when it is one."""
    try:
        key = load_pem_public_key(text.encode("utf-8"))
    except (ValueError, TypeError, UnicodeError):
        return (
            "is not a PEM public key; give the output of "
            "`openssl ec -in KEY.pem -pubout`, from -----BEGIN PUBLIC KEY----- to "
            "-----END PUBLIC KEY-----"
        )
    if not isinstance(key, ec.EllipticCurvePublicKey):
        return (
            "is not an EC key: model signatures are checked with EC keys on P-256 or P-384 "
            "(openssl ecparam -name prime256v1 -genkey)"
        )
    if key.curve.name not in CURVES:
        return (
            f"is an EC key on {key.curve.name}, not on P-256 or P-384: make one with "
            "openssl ecparam -name prime256v1 -genkey"
        )
    return ""


def covering(signers: Iterable[ModelSigner], model: str) -> tuple[ModelSigner, ...]:
    """The signers whose ``models`` globs match ``model``, in their order."""
    return tuple(s for s in signers if any(fnmatchcase(model, g) for g in s.models))
