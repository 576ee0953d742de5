"""SSHSIG in-process: allowed-signers parsing, verification against
signatures made by the real ``ssh-keygen -Y sign``, and our own signatures
checked by ``ssh-keygen -Y verify``."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from reconciler.git.sshsig import (
    AllowedSigner,
    fingerprint,
    parse_allowed_signers,
    sign_commit_payload,
    verify_sshsig,
)
from reconciler.spec.errors import ReconcilerError
from tests.kit.keys import make_key

MESSAGE = b"tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\n\nhello fleet\n"


@dataclass(frozen=True)
class Key:
    path: Path
    public_line: str  # "keytype base64"

    def signer_line(self, principal: str, options: str = "") -> str:
        return " ".join(p for p in (principal, options, self.public_line) if p)

    def sign(self, message: bytes, tmp: Path, namespace: str = "git", *extra: str) -> str:
        target = tmp / f"msg-{len(list(tmp.iterdir()))}"
        target.write_bytes(message)
        subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-Y",
                "sign",
                "-n",
                namespace,
                "-f",
                str(self.path),
                *extra,
                str(target),
            ],
            check=True,
            capture_output=True,
        )
        return (tmp / (target.name + ".sig")).read_text()


def signing_key(directory: Path, name: str, kind: str = "ed25519", bits: int | None = None) -> Key:
    return Key(directory / name, make_key(directory / name, kind=kind, bits=bits).text)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Key]:
    directory = tmp_path_factory.mktemp("keys")
    return {
        "alice": signing_key(directory, "alice"),
        "mallory": signing_key(directory, "mallory"),
        "ecdsa": signing_key(directory, "ecdsa", "ecdsa", 256),
        "rsa": signing_key(directory, "rsa", "rsa", 2048),
    }


def allowed(*lines: str) -> tuple[AllowedSigner, ...]:
    return parse_allowed_signers("\n".join(lines) + "\n")


# --- allowed-signers file -------------------------------------------------


def test_allowed_signers_lines_with_options_comments_and_quotes(keys: dict[str, Key]) -> None:
    text = "\n".join(
        [
            "# who may approve fleet changes",
            "",
            keys["alice"].signer_line("alice@example.com,alice@corp.example") + " alice laptop",
            keys["ecdsa"].signer_line(
                '"*@ops.example"',
                'namespaces="git,file",valid-after="20240101",valid-before=20250630Z',
            ),
        ]
    )

    alice, ops = parse_allowed_signers(text)

    assert alice.principals == ("alice@example.com", "alice@corp.example")
    assert alice.namespaces is None and alice.valid_after is None and alice.valid_before is None
    assert alice.key_type == "ssh-ed25519"
    assert ops.principals == ("*@ops.example",)
    assert ops.namespaces == ("git", "file")
    assert ops.valid_after is not None and ops.valid_after.tzinfo is not None
    assert ops.valid_before == datetime(2025, 6, 30, tzinfo=UTC)
    assert ops.key_type == "ecdsa-sha2-nistp256"


def test_key_id_is_what_ssh_keygen_prints(keys: dict[str, Key]) -> None:
    (alice,) = allowed(keys["alice"].signer_line("alice@example.com"))
    printed = subprocess.run(
        ["ssh-keygen", "-l", "-f", f"{keys['alice'].path}.pub"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()[1]

    assert fingerprint(alice.key) == printed == alice.key_id


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("{cert} ", "cert-authority lines are not supported"),
        ("{opt} ", "unknown option 'no-touch-required'"),
        ("{unknown_type}", "key type 'ssh-dss' is not supported"),
        ("{bad_base64}", "not valid base64"),
        ("{mismatch}", "the key says 'ssh-ed25519' but the line says 'ssh-rsa'"),
        ("{bad_time}", "is not YYYYMMDD"),
        ("{no_key}", "expected a key type and a base64 key"),
    ],
)
def test_a_bad_line_is_refused_naming_file_and_line(
    keys: dict[str, Key], line: str, words: str
) -> None:
    kind, blob = keys["alice"].public_line.split()
    bad = line.format(
        cert=f"ca@example.com cert-authority {kind} {blob}",
        opt=f"a@example.com no-touch-required {kind} {blob}",
        unknown_type=f"a@example.com ssh-dss {blob}",
        bad_base64=f"a@example.com {kind} not*base64",
        mismatch=f"a@example.com ssh-rsa {blob}",
        bad_time=f'a@example.com valid-after="2024-01-01" {kind} {blob}',
        no_key="a@example.com",
    )
    text = "# first line is a comment\n" + keys["rsa"].signer_line("ok@example.com") + "\n" + bad

    with pytest.raises(ReconcilerError) as caught:
        parse_allowed_signers(text, source="/etc/reconciler/allowed_signers")

    assert caught.value.message.startswith("/etc/reconciler/allowed_signers:3: ")
    assert words in caught.value.message


# --- verifying signatures made by ssh-keygen ------------------------------


@pytest.mark.parametrize("name", ["alice", "ecdsa", "rsa"])
def test_a_good_signature_by_an_allowed_key_verifies(
    keys: dict[str, Key], tmp_path: Path, name: str
) -> None:
    signers = allowed(keys[name].signer_line(f"{name}@example.com"))
    armored = keys[name].sign(MESSAGE, tmp_path)

    check = verify_sshsig(armored, MESSAGE, signers)

    assert check.ok, check.reason
    assert check.principal == f"{name}@example.com"
    assert check.key_id == signers[0].key_id
    assert f"good signature by {name}@example.com" in check.reason


def test_sha256_message_hash_verifies(keys: dict[str, Key], tmp_path: Path) -> None:
    signers = allowed(keys["alice"].signer_line("alice@example.com"))
    armored = keys["alice"].sign(MESSAGE, tmp_path, "git", "-O", "hashalg=sha256")

    assert verify_sshsig(armored, MESSAGE, signers).ok


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("tampered", "bad signature by ED25519 key"),
        ("unknown key", "that key is not an allowed signer"),
        ("wrong namespace", "signed for namespace 'file', not 'git'"),
        ("namespaces option", "may sign only namespaces file"),
        ("pgp", "signed with an OpenPGP signature, not an SSH signature"),
        ("garbage", "not an SSH signature"),
        ("truncated", "truncated"),
    ],
)
def test_refusals_say_why(keys: dict[str, Key], tmp_path: Path, case: str, expected: str) -> None:
    alice = keys["alice"]
    signers = allowed(alice.signer_line("alice@example.com"))
    message = MESSAGE
    if case == "tampered":
        armored = alice.sign(MESSAGE, tmp_path)
        message = MESSAGE.replace(b"hello", b"jello")
    elif case == "unknown key":
        armored = keys["mallory"].sign(MESSAGE, tmp_path)
    elif case == "wrong namespace":
        armored = alice.sign(MESSAGE, tmp_path, "file")
    elif case == "namespaces option":
        signers = allowed(alice.signer_line("alice@example.com", 'namespaces="file"'))
        armored = alice.sign(MESSAGE, tmp_path)
    elif case == "pgp":
        armored = "-----BEGIN PGP SIGNATURE-----\n\niQEzBAABCAAd\n-----END PGP SIGNATURE-----\n"
    elif case == "garbage":
        armored = "hello"
    else:
        whole = alice.sign(MESSAGE, tmp_path).splitlines()
        armored = "\n".join([whole[0], whole[1][:20], whole[-1]])

    check = verify_sshsig(armored, message, signers)

    assert not check.ok
    assert expected in check.reason
    assert check.principal is None


def test_validity_window_is_checked_at_the_given_time(keys: dict[str, Key], tmp_path: Path) -> None:
    signers = allowed(
        keys["alice"].signer_line(
            "alice@example.com", 'valid-after="20240101Z",valid-before="20241231235959Z"'
        )
    )
    armored = keys["alice"].sign(MESSAGE, tmp_path)

    inside = verify_sshsig(armored, MESSAGE, signers, at=datetime(2024, 6, 1, tzinfo=UTC))
    before = verify_sshsig(armored, MESSAGE, signers, at=datetime(2023, 12, 31, tzinfo=UTC))
    after = verify_sshsig(armored, MESSAGE, signers, at=datetime(2025, 1, 1, tzinfo=UTC))

    assert inside.ok
    assert not before.ok and "valid only after 2024-01-01T00:00:00Z" in before.reason
    assert not after.ok and "valid only until 2024-12-31T23:59:59Z" in after.reason


def test_a_second_line_for_the_same_key_can_still_allow_it(
    keys: dict[str, Key], tmp_path: Path
) -> None:
    # as OpenSSH does: a line whose window excludes the time is skipped, not fatal
    signers = allowed(
        keys["alice"].signer_line("old@example.com", 'valid-before="20200101Z"'),
        keys["alice"].signer_line("alice@example.com"),
    )

    check = verify_sshsig(keys["alice"].sign(MESSAGE, tmp_path), MESSAGE, signers)

    assert check.ok and check.principal == "alice@example.com"


# --- signing --------------------------------------------------------------


def load_key(path: Path) -> ed25519.Ed25519PrivateKey:
    key = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    assert isinstance(key, ed25519.Ed25519PrivateKey)
    return key


def test_our_signature_is_what_ssh_keygen_writes(keys: dict[str, Key], tmp_path: Path) -> None:
    # Ed25519 is deterministic, so the armour must match byte for byte.
    ours = sign_commit_payload(load_key(keys["alice"].path), MESSAGE)

    assert ours == keys["alice"].sign(MESSAGE, tmp_path)


def test_ssh_keygen_verifies_our_signature(keys: dict[str, Key], tmp_path: Path) -> None:
    signers_file = tmp_path / "allowed_signers"
    signers_file.write_text(keys["alice"].signer_line("daemon@reconciler") + "\n")
    sig = tmp_path / "payload.sig"
    sig.write_text(sign_commit_payload(load_key(keys["alice"].path), MESSAGE))

    result = subprocess.run(
        [
            *("ssh-keygen", "-Y", "verify", "-f", str(signers_file)),
            *("-I", "daemon@reconciler", "-n", "git", "-s", str(sig)),
        ],
        input=MESSAGE,
        capture_output=True,
    )

    assert result.returncode == 0, result.stderr
    assert verify_sshsig(sig.read_text(), MESSAGE, allowed(signers_file.read_text())).ok
