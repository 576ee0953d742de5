"""Keys for tests, made by the real ``ssh-keygen``: the daemon's and the
agents' signing keys, people's commit-signing keys, SSH client and host
keys. One maker for all of them.

    key = make_key(tmp_path / "keys" / "alice")    # ed25519, comment "alice"
    key.private, key.public                         # .../alice, .../alice.pub
    key.line                                        # "ssh-ed25519 AAAA... alice"
    key.text                                        # "ssh-ed25519 AAAA..."
    key.signing                                     # a SigningKey (ed25519 only)
    key.fingerprint                                 # "SHA256:..." as ssh-keygen -l says
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from reconciler.protocol.signing import SigningKey, load_private_key


@dataclass(frozen=True)
class Key:
    private: Path

    @property
    def public(self) -> Path:
        return Path(f"{self.private}.pub")

    @property
    def line(self) -> str:
        """The public key file's line, comment included."""
        return self.public.read_text().strip()

    @property
    def text(self) -> str:
        """``KIND BASE64``: the public key without its comment."""
        kind, blob, *_ = self.line.split()
        return f"{kind} {blob}"

    @cached_property
    def signing(self) -> SigningKey:
        return load_private_key(self.private)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public)


def make_key(
    path: Path, *, kind: str = "ed25519", bits: int | None = None, comment: str | None = None
) -> Key:
    """A new unencrypted key pair at ``path`` and ``path.pub`` (comment: the
    file's name unless given)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    size = ["-b", str(bits)] if bits else []
    subprocess.run(
        [
            "ssh-keygen", "-q", "-t", kind, *size, "-N", "",
            "-C", path.name if comment is None else comment, "-f", str(path),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return Key(path)


def fingerprint(pub: Path) -> str:
    """``SHA256:...`` exactly as ``ssh-keygen -l`` prints it."""
    out = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(pub)], check=True, capture_output=True, text=True
    ).stdout
    return out.split()[1]
