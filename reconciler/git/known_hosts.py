"""Checking an SSH server's host key against an OpenSSH ``known_hosts`` file
(docs/cli.md, "SSH remotes"): the key must match an entry for that
host and port, or the connection is refused before any data is read.

The file is read the way ``ssh`` reads it: a port other than 22 is looked
up as ``[host]:port``; host patterns may be lists, wildcards (``*``, ``?``),
negations (``!``) or hashed (``|1|salt|hash``, ``HashKnownHosts yes``);
``@revoked`` marks a key refused for every host. ``@cert-authority`` lines
are skipped: host certificates are not supported, so they never vouch for
a key.

Pure apart from reading the file; no switch here or anywhere accepts an
unknown key. The Git edge (``gitstore``) hands in the key the server
offered and turns the refusal into the error the person sees.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path

from reconciler.spec.errors import HostKeyError

DEFAULT_PORT = 22


def default_known_hosts() -> Path:
    return Path.home() / ".ssh" / "known_hosts"


@dataclass(frozen=True)
class HostKey:
    """A public key in SSH wire format, as a server offers it."""

    blob: bytes

    @property
    def kind(self) -> str:
        """The key type named inside the blob (``ssh-ed25519``, ...)."""
        if len(self.blob) < 4:
            return "unknown"
        size = int.from_bytes(self.blob[:4], "big")
        return self.blob[4 : 4 + size].decode("ascii", "replace") or "unknown"

    @property
    def fingerprint(self) -> str:
        """``SHA256:...`` exactly as ``ssh-keygen -l`` prints it."""
        digest = base64.b64encode(hashlib.sha256(self.blob).digest()).decode()
        return "SHA256:" + digest.rstrip("=")

    def line(self, host: str, port: int) -> str:
        """The ``known_hosts`` line that would accept this key."""
        return f"{host_entry_name(host, port)} {self.kind} {base64.b64encode(self.blob).decode()}"


@dataclass(frozen=True)
class _Entry:
    line: int
    marker: str  # "", "@revoked" or "@cert-authority"
    patterns: str
    key: HostKey | None  # None: a blob that is not base64


def host_entry_name(host: str, port: int) -> str:
    """How ``ssh`` names a host in ``known_hosts``: the bare name for port
    22, ``[host]:port`` otherwise."""
    return host if port == DEFAULT_PORT else f"[{host}]:{port}"


def verify_host_key(path: Path, host: str, port: int, offered: HostKey) -> None:
    """Return when ``offered`` matches an entry for ``host``/``port`` in the
    file at ``path``; raise HostKeyError naming the host, the offered key's
    fingerprint and the file otherwise (missing file, no entry, another
    key, a revoked key)."""
    name = host_entry_name(host, port)
    where = f"{name} (offered {offered.kind} {offered.fingerprint})"
    add = (
        f"compare {offered.fingerprint} with the fingerprints the server's owner publishes "
        f"(or `ssh-keygen -lf` of its host key), and only then add the key: "
        f"echo '{offered.line(host, port)}' >> {path}"
    )
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise HostKeyError(
            f"refusing SSH host {where}: the known-hosts file {path} does not exist",
            f"pass --known-hosts FILE with the server's key, or {add}",
        ) from None
    except OSError as e:
        raise HostKeyError(
            f"refusing SSH host {where}: cannot read the known-hosts file {path}: {e}",
            "make the file readable, or pass another one with --known-hosts",
        ) from None
    entries = [e for e in _entries(text) if e.marker != "@cert-authority"]
    for entry in entries:
        if entry.marker == "@revoked" and entry.key == offered:
            raise HostKeyError(
                f"refusing SSH host {where}: that key is marked @revoked in {path} "
                f"line {entry.line}",
                "the key was withdrawn: ask the server's owner for the current key",
            )
    for_host = [e for e in entries if not e.marker and _matches(e.patterns, name)]
    if any(e.key == offered for e in for_host):
        return
    pinned_kinds = {e.key.kind for e in for_host if e.key is not None}
    if pinned_kinds and offered.kind not in pinned_kinds:
        kinds = ", ".join(sorted(pinned_kinds))
        raise HostKeyError(
            f"refusing SSH host {where}: {path} pins only other key types for it ({kinds})",
            "libssh2 chooses the host key type itself, so pin every type the server has; "
            f"this may still be an impostor: {add}",
        )
    if for_host:
        held = ", ".join(
            f"line {e.line}: {e.key.kind} {e.key.fingerprint}" if e.key else f"line {e.line}"
            for e in for_host
        )
        raise HostKeyError(
            f"refusing SSH host {where}: the HOST KEY DIFFERS from {path} ({held}); "
            "nothing was read or pushed",
            "someone may be impersonating the server, or its key was replaced: only when the "
            f"server's owner confirms {offered.fingerprint} replace the line with: "
            f"{offered.line(host, port)}",
        )
    raise HostKeyError(
        f"refusing SSH host {where}: the host is not in {path}",
        add,
    )


def _entries(text: str) -> list[_Entry]:
    found: list[_Entry] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = ""
        if fields[0].startswith("@"):
            marker, fields = fields[0], fields[1:]
        if len(fields) < 3:
            continue
        try:
            key: HostKey | None = HostKey(base64.b64decode(fields[2], validate=True))
        except (binascii.Error, ValueError):
            key = None
        if key is not None and key.kind != fields[1]:
            key = None  # a line whose type contradicts its blob vouches for nothing
        found.append(_Entry(number, marker, fields[0], key))
    return found


def _matches(patterns: str, name: str) -> bool:
    """``ssh``'s host matching: any positive pattern matches and no negated one."""
    if patterns.startswith("|1|"):
        return _hashed_matches(patterns, name)
    matched = False
    for pattern in patterns.split(","):
        negated = pattern.startswith("!")
        pattern = pattern.removeprefix("!")
        # ssh's patterns know only * and ?; brackets are literal characters.
        hit = fnmatch.fnmatchcase(name.lower(), pattern.lower().replace("[", "[[]"))
        if hit and negated:
            return False
        matched = matched or hit
    return matched


def _hashed_matches(entry: str, name: str) -> bool:
    parts = entry.split("|")
    if len(parts) != 4:
        return False
    try:
        salt = base64.b64decode(parts[2], validate=True)
        want = base64.b64decode(parts[3], validate=True)
    except (binascii.Error, ValueError):
        return False
    got = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return hmac.compare_digest(got, want)
