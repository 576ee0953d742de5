"""known_hosts read the way OpenSSH reads it: ports, patterns, hashed names,
revoked keys; every refusal names the host, the offered key and the file."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest

from reconciler.git.known_hosts import HostKey, verify_host_key
from reconciler.spec.errors import HostKeyError
from tests.kit.keys import fingerprint, make_key


def _key(tmp_path: Path, name: str) -> tuple[HostKey, Path]:
    line = make_key(tmp_path / name, comment=name).line
    return HostKey(base64.b64decode(line.split()[1])), Path(f"{tmp_path / name}.pub")


def test_the_fingerprint_is_the_one_ssh_keygen_prints(tmp_path: Path) -> None:
    key, pub = _key(tmp_path, "host")
    assert key.fingerprint == fingerprint(pub)
    assert key.kind == "ssh-ed25519"


@pytest.mark.parametrize(
    ("patterns", "host", "port", "known"),
    [
        ("forge.example", "forge.example", 22, True),
        ("forge.example", "forge.example", 2222, False),  # another port: [host]:port
        ("[forge.example]:2222", "forge.example", 2222, True),
        ("[forge.example]:2222", "forge.example", 22, False),
        ("*.example,other", "forge.example", 22, True),
        ("*.example,!forge.example", "forge.example", 22, False),
        ("fo?ge.example", "forge.example", 22, True),
        ("FORGE.example", "forge.example", 22, True),
        ("[127.0.0.1]:*", "127.0.0.1", 2222, True),
    ],
)
def test_host_patterns(tmp_path: Path, patterns: str, host: str, port: int, known: bool) -> None:
    key, _ = _key(tmp_path, "host")
    path = tmp_path / "known_hosts"
    path.write_text(f"# a comment\n\n{patterns} {key.kind} {base64.b64encode(key.blob).decode()}\n")
    if known:
        verify_host_key(path, host, port, key)
    else:
        with pytest.raises(HostKeyError, match="not in"):
            verify_host_key(path, host, port, key)


def test_hashed_names_as_ssh_keygen_writes_them(tmp_path: Path) -> None:
    key, _ = _key(tmp_path, "host")
    path = tmp_path / "known_hosts"
    path.write_text(key.line("forge.example", 2222) + "\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(path)], check=True, capture_output=True)
    assert path.read_text().startswith("|1|")
    verify_host_key(path, "forge.example", 2222, key)
    with pytest.raises(HostKeyError):
        verify_host_key(path, "forge.example", 22, key)


def test_a_different_key_names_both_fingerprints_and_the_line(tmp_path: Path) -> None:
    pinned, _ = _key(tmp_path, "pinned")
    offered, _ = _key(tmp_path, "offered")
    path = tmp_path / "known_hosts"
    path.write_text("other.example ssh-ed25519 AAAA\n" + pinned.line("forge.example", 22) + "\n")
    with pytest.raises(HostKeyError) as refused:
        verify_host_key(path, "forge.example", 22, offered)
    text = str(refused.value)
    assert "HOST KEY DIFFERS" in text and "line 2" in text
    assert pinned.fingerprint in text and offered.fingerprint in text and str(path) in text


def test_a_pinned_key_of_another_type_is_no_match_and_says_so(tmp_path: Path) -> None:
    ed25519, _ = _key(tmp_path, "host")
    make_key(tmp_path / "ecdsa", kind="ecdsa")
    ecdsa = HostKey(base64.b64decode((tmp_path / "ecdsa.pub").read_text().split()[1]))
    path = tmp_path / "known_hosts"
    path.write_text(ed25519.line("forge.example", 22) + "\n")
    with pytest.raises(HostKeyError, match="pins only other key types for it \\(ssh-ed25519\\)"):
        verify_host_key(path, "forge.example", 22, ecdsa)


def test_a_line_whose_type_contradicts_its_key_vouches_for_nothing(tmp_path: Path) -> None:
    key, _ = _key(tmp_path, "host")
    path = tmp_path / "known_hosts"
    path.write_text(f"forge.example ssh-rsa {base64.b64encode(key.blob).decode()}\n")
    with pytest.raises(HostKeyError):
        verify_host_key(path, "forge.example", 22, key)


def test_cert_authority_lines_vouch_for_nothing(tmp_path: Path) -> None:
    key, _ = _key(tmp_path, "host")
    path = tmp_path / "known_hosts"
    path.write_text("@cert-authority " + key.line("forge.example", 22) + "\n")
    with pytest.raises(HostKeyError, match="not in"):
        verify_host_key(path, "forge.example", 22, key)
