"""Forge merges signed with OpenPGP (``--allowed-pgp-keys``, docs/trust.md): keys made by ``gpg`` in the test, commits signed by the real
``git -c gpg.format=openpgp commit -S``, and ``git verify-commit`` as the
judge of every verdict."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pygit2
import pytest

from reconciler.cli.main import main
from reconciler.git.approval import Approver, load_allowed_signers
from reconciler.git.openpgp import PgpKeyring
from tests.kit.git import clone, git, git_env, make_bare_repo
from tests.kit.keys import make_key

ROLLOUT = """apiVersion: reconciler/v1
kind: Rollout
metadata: {name: r}
spec:
  target: {runtime: hermes, provider: ollama, model: m, profile: default}
  nodeIds: [a]
"""


def require_gpg() -> None:
    if shutil.which("gpg") is None:
        reason = "gpg is not installed (apt-get install gnupg; .ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@dataclass
class GpgHome:
    """A throw-away GNUPGHOME holding secret keys, as a forge would."""

    path: Path

    def gpg(self, *args: str) -> str:
        return subprocess.run(
            ["gpg", "--homedir", str(self.path), "--batch", *args],
            capture_output=True,
            check=True,
            text=True,
        ).stdout

    def new_key(self, uid: str) -> str:
        self.gpg("--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never")
        listing = self.gpg("--with-colons", "--list-secret-keys", uid)
        return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr"))

    def export(self, fingerprint: str, out: Path) -> Path:
        out.write_text(self.gpg("--armor", "--export", fingerprint))
        return out


@pytest.fixture
def gpg_home() -> Iterator[GpgHome]:
    require_gpg()
    # Short path: gpg-agent's socket lives in it, and socket paths are short.
    home = Path(tempfile.mkdtemp(prefix="gpg-"))
    home.chmod(0o700)
    try:
        yield GpgHome(home)
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def signed_commit(work: Path, home: GpgHome, key: str, files: dict[str, str], msg: str) -> str:
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    env = git_env("Forge", "noreply@forge.example", {"GNUPGHOME": str(home.path)})
    git("add", "-A", cwd=work, env=env)
    git(
        "-c", "gpg.format=openpgp", "-c", f"user.signingKey={key}",
        "commit", "-q", "-S", "-m", msg, cwd=work, env=env,
    )  # fmt: skip
    git("push", "-q", "origin", "HEAD:main", cwd=work, env=env)
    return git("rev-parse", "HEAD", cwd=work)


def git_verifies(repo: Path, commit: str, keyring: PgpKeyring) -> bool:
    """``git verify-commit`` with only the allowed keys in its keyring."""
    env = git_env(extra={"GNUPGHOME": str(keyring.home)})
    result = subprocess.run(
        ["git", "verify-commit", commit], cwd=repo, env=env, capture_output=True
    )
    return result.returncode == 0


def test_a_forge_merge_signed_with_an_allowed_openpgp_key_counts(
    tmp_path: Path, gpg_home: GpgHome, capsys: pytest.CaptureFixture[str]
) -> None:
    forge = gpg_home.new_key("Forge <noreply@forge.example>")
    impostor = gpg_home.new_key("Impostor <evil@example.com>")
    keys = gpg_home.export(forge, tmp_path / "forge.asc")
    bare = make_bare_repo(tmp_path, {"README.md": "fleet\n"})
    work = clone(bare, tmp_path / "work")
    good = signed_commit(work, gpg_home, forge, {"rollouts/r.yaml": ROLLOUT}, "Merge #1")
    keyring = PgpKeyring.load(keys)
    try:
        repo = pygit2.Repository(str(bare))
        approver = Approver(repo, (), pgp=keyring)
        check = approver.check_commit(good)
        assert check.ok, check.reason
        assert check.principal == "Forge <noreply@forge.example>"
        assert check.key_id == forge
        assert git_verifies(bare, good, keyring)

        bad = signed_commit(work, gpg_home, impostor, {"rollouts/r.yaml": ROLLOUT + "#\n"}, "x")
        refused = Approver(repo, (), pgp=keyring).check_commit(bad)
        assert not refused.ok
        assert "not in --allowed-pgp-keys" in refused.reason
        assert not git_verifies(bare, bad, keyring)

        # Without --allowed-pgp-keys an OpenPGP signature is not an SSH one.
        ssh_only = Approver(repo, ()).check_commit(good)
        assert not ssh_only.ok and "OpenPGP" in ssh_only.reason

        capsys.readouterr()
        code = main(
            [
                "verify",
                good,
                "--repo",
                str(bare),
                "--allowed-pgp-keys",
                str(keys),
                "--allowed-signers",
                str(_one_signer(tmp_path)),
            ]
        )
        out = capsys.readouterr().out
        assert code == 0, out
        assert "good OpenPGP signature by Forge <noreply@forge.example>" in out
    finally:
        keyring.close()
    assert not keyring.home.exists()


def test_a_forge_merge_still_needs_a_reviewers_approval(tmp_path: Path, gpg_home: GpgHome) -> None:
    forge = gpg_home.new_key("Forge <noreply@forge.example>")
    keys = gpg_home.export(forge, tmp_path / "forge.asc")
    bare = make_bare_repo(tmp_path, {"README.md": "fleet\n"})
    work = clone(bare, tmp_path / "work")
    merge = signed_commit(work, gpg_home, forge, {"rollouts/r.yaml": ROLLOUT}, "Merge #2")
    signers = _one_signer(tmp_path)
    keyring = PgpKeyring.load(keys)
    try:
        repo = pygit2.Repository(str(bare))
        approver = Approver(repo, load_allowed_signers(signers), required_approvals=1, pgp=keyring)
        refusal = approver.approve(merge).refusals[0].reason
        assert refusal.startswith("needs 1 approval besides Forge <noreply@forge.example>'s")
        assert main(["approve", merge, "--key", str(tmp_path / "bob"), "--repo", str(work)]) == 0
        git("push", "-q", "origin", "refs/notes/reconciler-approvals", cwd=work)
        assert approver.approve(merge).verified_commit == merge
    finally:
        keyring.close()


def test_a_file_without_keys_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_gpg()
    bare = make_bare_repo(tmp_path, {"README.md": "fleet\n"})
    empty = tmp_path / "keys.asc"
    empty.write_text("not a key\n")
    capsys.readouterr()
    code = main(
        [
            "verify",
            "--repo",
            str(bare),
            "--allowed-signers",
            str(_one_signer(tmp_path)),
            "--allowed-pgp-keys",
            str(empty),
        ]
    )
    assert code == 2
    assert f"{empty}: no OpenPGP public key could be imported" in capsys.readouterr().err


def _one_signer(tmp_path: Path) -> Path:
    """An allowed-signers file with bob, a reviewer."""
    key = tmp_path / "bob"
    if not key.exists():
        make_key(key, comment="bob")
    kind, blob, *_ = Path(f"{key}.pub").read_text().split()
    path = tmp_path / "allowed_signers"
    path.write_text(f"bob@example.com {kind} {blob}\n")
    return path
