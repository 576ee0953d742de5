"""A model producer's signature, checked on the node before anything
serves: an OpenSSF Model Signing signature (a Sigstore bundle whose DSSE
envelope holds an in-toto statement listing each signed file's path and
SHA-256), verified by the reference library (``model_signing``, EC key
verification) against the keys of the signers the signed stage job names,
over the laid-out model directory.

The checks, in order; the first that fails is the stage's
``signature_invalid`` message:

1. the file is a signature bundle (not corrupted or cut short);
2. the files it signs are exactly the artifacts: each artifact's path with
   its SHA-256, none missing, none extra (compared with the digests the
   download already checked);
3. the model directory holds no symbolic link;
4. one signer's key verifies the envelope, and the directory's files hash
   to what is signed (the library re-hashes every file).

Must not: fetch files (``stage_job``) or lay out directories
(``model_dirs``); trust a key the job did not carry.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.node.runtime_config import JobFailed
from reconciler.protocol.job_view import JobSigner
from reconciler.protocol.model_ids import layout_pairs

INVALID = "signature_invalid"
_PAYLOAD_TYPE = "application/vnd.in-toto+json"


@dataclass(frozen=True)
class Verified:
    """Who vouched for a model directory: the signer whose key verified,
    and the signature file's SHA-256."""

    signer: str
    sha256: str

    def record(self) -> dict[str, str]:
        return {"signer": self.signer, "sha256": self.sha256}


def signed_files(signature: bytes) -> dict[str, str]:
    """path -> SHA-256 of the files ``signature`` lists (not yet verified);
    ``JobFailed`` when it is not a signature bundle of whole files."""
    try:
        bundle = json.loads(signature)
        envelope = bundle["dsseEnvelope"]
        if envelope["payloadType"] != _PAYLOAD_TYPE:
            raise ValueError(f"payload type {envelope['payloadType']!r}")
        statement = json.loads(base64.b64decode(envelope["payload"], validate=True))
        predicate = statement["predicate"]
        method = predicate["serialization"]
        resources = predicate["resources"]
        if method.get("method") != "files" or method.get("hash_type") != "sha256":
            raise ValueError(f"serialization {method!r}, not whole files hashed with sha256")
        files = {str(r["name"]): str(r["digest"]) for r in resources if r["algorithm"] == "sha256"}
        if len(files) != len(resources):
            raise ValueError("a file is listed twice, or hashed with another algorithm")
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as exc:
        raise JobFailed(
            f"{INVALID}: the signature file is not an OpenSSF Model Signing bundle of whole "
            f"files hashed with SHA-256 (corrupted or cut short?): {_short(exc)}; nothing "
            "was activated"
        ) from None
    return files


def compare_files(signed: Mapping[str, str], artifacts: Iterable[Mapping[str, Any]]) -> None:
    """``JobFailed`` unless ``signed`` is exactly the artifacts' paths and digests."""
    wanted = dict(layout_pairs(artifacts))
    missing = sorted(set(wanted) - set(signed))
    extra = sorted(set(signed) - set(wanted))
    other = sorted(p for p in set(wanted) & set(signed) if wanted[p] != signed[p])
    said = []
    if missing:
        said.append(f"artifacts not signed: {', '.join(missing)}")
    if extra:
        said.append(f"signed files that are not artifacts: {', '.join(extra)}")
    if other:
        said.append(
            "signed with another digest: "
            + ", ".join(
                f"{p} (signed {signed[p][:12]}..., artifact {wanted[p][:12]}...)" for p in other
            )
        )
    if said:
        raise JobFailed(
            f"{INVALID}: the signature is over other files than the rollout's artifacts: "
            + "; ".join(said)
            + "; nothing was activated"
        )


def refuse_links(model_dir: Path) -> None:
    """``JobFailed`` when the directory holds a symbolic link anywhere."""
    for top, folders, names in os.walk(model_dir):
        for name in folders + names:
            if os.path.islink(os.path.join(top, name)):
                found = os.path.relpath(os.path.join(top, name), model_dir)
                raise JobFailed(
                    f"{INVALID}: the model directory {model_dir} holds a symbolic link, "
                    f"{found}; a signed model is made of its own files only; nothing was "
                    "activated"
                )


def verify(
    model_dir: Path,
    signature_path: Path,
    signature_sha256: str,
    signers: Sequence[JobSigner],
    artifacts: Sequence[Mapping[str, Any]],
) -> Verified:
    """The signer that vouches for ``model_dir``, or ``JobFailed``
    ``signature_invalid`` saying which check failed (module docstring)."""
    compare_files(signed_files(signature_path.read_bytes()), artifacts)
    refuse_links(model_dir)
    from model_signing import verifying  # loaded by the first signed stage only

    tried = []
    with tempfile.TemporaryDirectory(prefix="reconciler-keys-") as keys:
        for signer in signers:
            key = Path(keys, f"{signer.name}.pub")
            key.write_text(signer.public_key, encoding="utf-8")
            try:
                config = verifying.Config().use_elliptic_key_verifier(public_key=key)
            except ValueError as exc:
                tried.append(f"{signer.name} (its key cannot be used: {_short(exc)})")
                continue
            try:
                config.verify(model_dir, signature_path)
            except Exception as exc:  # the library's words, said at our edge
                if _wrong_key(exc):
                    tried.append(signer.name)
                    continue
                raise JobFailed(
                    f"{INVALID}: signed by {signer.name}, but the files of {model_dir} "
                    f"do not match what is signed: {_short(exc)}; nothing was activated"
                ) from None
            return Verified(signer.name, signature_sha256)
    raise JobFailed(
        f"{INVALID}: no key of the signers covering this model verifies the signature "
        f"(tried {', '.join(tried) or 'none'}); it was made with another key; nothing was "
        "activated"
    )


def _wrong_key(exc: Exception) -> bool:
    """Did the envelope fail to verify with this key (not the files)?"""
    from cryptography.exceptions import InvalidSignature

    return isinstance(exc, InvalidSignature) or str(exc).startswith("Key mismatch")


def _short(exc: BaseException) -> str:
    text = str(exc).strip().split("\n", 1)[0] or type(exc).__name__
    return text[:300]
