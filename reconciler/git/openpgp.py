"""OpenPGP commit signatures, for forges that sign web merges with OpenPGP
(docs/trust.md), checked by the ``gpg`` binary git itself uses.

``PgpKeyring.load(FILE)`` imports the armored public keys of FILE into a
keyring of its own (a temporary ``GNUPGHOME``, never the user's), so only
those keys can make a signature good. ``verify`` runs ``gpg --verify``
with ``--status-fd`` and reads gpg's machine-readable status lines, as git
does: a signature counts only with ``GOODSIG`` and ``VALIDSIG``; an
expired or revoked key, a bad signature or an unknown key is a refusal with
a reason in words. Nothing of OpenPGP is parsed here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path

from reconciler.git.sshsig import SignatureCheck
from reconciler.spec.errors import ReconcilerError

PGP_ARMOR = "-----BEGIN PGP SIGNATURE-----"
GPG_TIMEOUT = 30.0  # seconds for one gpg call


@dataclass(frozen=True)
class PgpKey:
    fingerprint: str  # the primary key's, 40 hex digits
    uid: str  # the first user id, e.g. "GitHub <noreply@github.com>"


class PgpKeyring:
    """A private keyring holding only the allowed OpenPGP keys."""

    def __init__(self, home: Path, keys: tuple[PgpKey, ...], source: str) -> None:
        self.home = home
        self.keys = keys
        self.source = source
        self._finalizer = weakref.finalize(self, _remove_home, home)

    @classmethod
    def load(cls, path: Path) -> PgpKeyring:
        """Import the armored public keys in ``path``; ReconcilerError
        naming the file when gpg is missing, the file unreadable, or no key
        could be imported."""
        if shutil.which("gpg") is None:
            raise ReconcilerError(
                "--allowed-pgp-keys needs the gpg binary, which is not installed",
                "install it (Debian: apt-get install gnupg)",
            )
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ReconcilerError(
                f"cannot read the OpenPGP keys file {path}: {exc.strerror or exc}",
                "give a file of armored OpenPGP public keys (gpg --armor --export KEYID)",
            ) from None
        home = Path(tempfile.mkdtemp(prefix="reconciler-gpg-"))
        os.chmod(home, 0o700)
        try:
            result = _gpg(home, "--import", stdin=data)
            keys = _list_keys(home)
        except ReconcilerError:
            _remove_home(home)
            raise
        if not keys:
            _remove_home(home)
            detail = result.stderr.decode("utf-8", "replace").strip().splitlines()
            raise ReconcilerError(
                f"{path}: no OpenPGP public key could be imported"
                + (f" ({detail[-1]})" if detail else ""),
                "the file must hold armored public keys (gpg --armor --export KEYID)",
            )
        return cls(home, keys, str(path))

    def verify(self, armored: str, payload: bytes) -> SignatureCheck:
        """Check a detached armored OpenPGP signature over ``payload`` against
        the keyring. Never raises on bad input."""
        with tempfile.NamedTemporaryFile(dir=self.home, suffix=".asc") as sig:
            sig.write(armored.encode("utf-8"))
            sig.flush()
            try:
                result = _gpg(
                    self.home, "--status-fd", "1", "--verify", sig.name, "-", stdin=payload
                )
            except ReconcilerError as exc:
                return SignatureCheck(False, str(exc))
        return read_status(result.stdout.decode("utf-8", "replace"), self.keys)

    def close(self) -> None:
        self._finalizer()


def read_status(status: str, keys: tuple[PgpKey, ...]) -> SignatureCheck:
    """gpg's ``--status-fd`` lines -> a verdict, with the key's user id as
    the principal and its primary fingerprint as the key id."""
    words: dict[str, list[str]] = {}
    for line in status.splitlines():
        if line.startswith("[GNUPG:] "):
            name, *rest = line[9:].split(" ")
            words.setdefault(name, rest)
    by_fpr = {k.fingerprint: k for k in keys}
    if "VALIDSIG" in words and "GOODSIG" in words:
        fields = words["VALIDSIG"]
        primary = fields[-1] if len(fields) >= 10 else fields[0]
        key = by_fpr.get(primary)
        if key is None:  # cannot happen: the keyring holds only allowed keys
            return SignatureCheck(False, f"good OpenPGP signature by unlisted key {primary}")
        return SignatureCheck(
            True, f"good OpenPGP signature by {key.uid} ({primary})", key.uid, primary
        )
    for name, text in (
        ("EXPKEYSIG", "by an expired OpenPGP key"),
        ("REVKEYSIG", "by a revoked OpenPGP key"),
        ("EXPSIG", "that has expired"),
        ("BADSIG", "that does not match the signed content (changed after signing?)"),
    ):
        if name in words:
            who = " ".join(words[name][1:])
            return SignatureCheck(False, f"OpenPGP signature {text}" + (f": {who}" if who else ""))
    if "NO_PUBKEY" in words or "ERRSIG" in words:
        key_id = (words.get("NO_PUBKEY") or words.get("ERRSIG") or ["?"])[0]
        return SignatureCheck(
            False, f"OpenPGP signature by key {key_id}, which is not in --allowed-pgp-keys"
        )
    return SignatureCheck(False, "the OpenPGP signature cannot be read")


def _list_keys(home: Path) -> tuple[PgpKey, ...]:
    out = _gpg(home, "--with-colons", "--fixed-list-mode", "--list-keys").stdout.decode(
        "utf-8", "replace"
    )
    keys: list[PgpKey] = []
    fingerprint = ""
    expect_primary_fpr = False
    uid = ""
    for line in out.splitlines():
        fields = line.split(":")
        if fields[0] == "pub":
            if fingerprint:
                keys.append(PgpKey(fingerprint, uid))
            fingerprint, uid, expect_primary_fpr = "", "", True
        elif fields[0] == "fpr" and expect_primary_fpr:
            fingerprint, expect_primary_fpr = fields[9], False
        elif fields[0] == "uid" and not uid:
            uid = fields[9].replace("\\x3a", ":")
        elif fields[0] == "sub":
            expect_primary_fpr = False
    if fingerprint:
        keys.append(PgpKey(fingerprint, uid))
    return tuple(keys)


def _gpg(home: Path, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(
            [
                "gpg",
                "--homedir",
                str(home),
                "--batch",
                "--no-tty",
                "--trust-model",
                "always",
                *args,
            ],
            input=stdin,
            capture_output=True,
            timeout=GPG_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReconcilerError(f"cannot run gpg: {exc}", "install gnupg") from None


def _remove_home(home: Path) -> None:
    # gpg may have started an agent for this home: stop it before removing.
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(
            ["gpgconf", "--homedir", str(home), "--kill", "all"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    shutil.rmtree(home, ignore_errors=True)


__all__ = ["PGP_ARMOR", "PgpKey", "PgpKeyring", "read_status"]
