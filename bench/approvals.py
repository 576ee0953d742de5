"""Cost per commit of the forge-merge key check (OpenPGP through ``gpg``)
against the SSH path, and of counting reviewers' approvals.

    .venv/bin/python bench/approvals.py [--commits 30] [--runs 3]

Builds a repository in a temporary directory with spec commits signed by
``git -c gpg.format=openpgp commit -S`` (an Ed25519 OpenPGP key made by
``gpg``) and the same number signed by ``git -c gpg.format=ssh commit -S``
(an Ed25519 SSH key), then prints per commit: the first (uncached) check of
each kind by ``Approver``, and the approvals check of a commit whose note
holds two approvals (one reviewer's, one by the commit's own signer).
Medians over ``--runs`` fresh approvers, the two kinds run alternately.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pygit2
from _common import Row, emit, row

from reconciler.git.approval import Approver
from reconciler.git.approval_notes import NAMESPACE, NOTES_REF, approval_message
from reconciler.git.openpgp import PgpKeyring
from reconciler.git.sshsig import parse_allowed_signers, sign_sshsig
from reconciler.protocol.signing import load_private_key

ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "Bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "Bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, env=env or ENV, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def signed_commit(work: Path, index: int, config: list[str], env: dict[str, str]) -> str:
    (work / "rollouts" / f"r{index}.yaml").write_text(f"n: {index}\n")
    run("git", "add", "-A", cwd=work, env=env)
    run("git", *config, "commit", "-q", "-S", "-m", f"change {index}", cwd=work, env=env)
    return run("git", "rev-parse", "HEAD", cwd=work, env=env)


def per_commit_ms(check: Callable[[str], object], commits: list[str]) -> float:
    start = time.perf_counter()
    for commit in commits:
        check(commit)
    return (time.perf_counter() - start) * 1000 / len(commits)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commits", type=int, default=30, help="commits of each kind")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="gpg-bench-"))
    home.chmod(0o700)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp)
            gpg = ["gpg", "--homedir", str(home), "--batch"]
            run(*gpg, "--passphrase", "", "--quick-gen-key", "Forge <forge@example.com>",
                "ed25519", "sign", "never")  # fmt: skip
            listing = run(*gpg, "--with-colons", "--list-secret-keys")
            fpr = next(line.split(":")[9] for line in listing.splitlines() if line[:3] == "fpr")
            (base / "forge.asc").write_text(run(*gpg, "--armor", "--export", fpr))
            for name in ("author", "reviewer"):
                run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(base / name))
            signers = base / "allowed_signers"
            signers.write_text(
                "".join(
                    f"{name}@example.com {(base / f'{name}.pub').read_text().split(' ', 2)[0]} "
                    f"{(base / f'{name}.pub').read_text().split()[1]}\n"
                    for name in ("author", "reviewer")
                )
            )
            work = base / "fleet"
            (work / "rollouts").mkdir(parents=True)
            run("git", "init", "-q", "-b", "main", cwd=work)
            pgp_env = {**ENV, "GNUPGHOME": str(home)}
            pgp_config = ["-c", "gpg.format=openpgp", "-c", f"user.signingKey={fpr}"]
            ssh_config = ["-c", "gpg.format=ssh", "-c", f"user.signingKey={base / 'author'}"]
            pgp_commits, ssh_commits = [], []
            for i in range(args.commits):
                pgp_commits.append(signed_commit(work, 2 * i, pgp_config, pgp_env))
                ssh_commits.append(signed_commit(work, 2 * i + 1, ssh_config, ENV))
            repo = pygit2.Repository(str(work))
            author = load_private_key(base / "author").private_key
            reviewer = load_private_key(base / "reviewer").private_key
            who = pygit2.Signature("Bench", "bench@example.com")
            for commit in ssh_commits:
                note = "".join(
                    sign_sshsig(key, approval_message(commit), NAMESPACE)
                    for key in (reviewer, author)
                )
                repo.create_note(note, who, who, commit, NOTES_REF, True)
            allowed = parse_allowed_signers(signers.read_text())
            keyring = PgpKeyring.load(base / "forge.asc")
            try:
                pgp_ms, ssh_ms, approvals_ms = [], [], []
                for _ in range(args.runs):
                    pgp_ms.append(
                        per_commit_ms(
                            Approver(repo, allowed, pgp=keyring).check_signature, pgp_commits
                        )
                    )
                    ssh_ms.append(
                        per_commit_ms(Approver(repo, allowed).check_signature, ssh_commits)
                    )
                    approver = Approver(repo, allowed, required_approvals=1)
                    for commit in ssh_commits:
                        approver.check_signature(commit)
                    approvals_ms.append(per_commit_ms(approver.check_commit, ssh_commits))
                checker = Approver(repo, allowed, required_approvals=1, pgp=keyring)
                assert all(checker.check_signature(c).ok for c in pgp_commits)
                assert all(checker.check_commit(c).ok for c in ssh_commits)
            finally:
                keyring.close()
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)
    pgp, ssh, counted = (statistics.median(v) for v in (pgp_ms, ssh_ms, approvals_ms))
    print(f"{'check, per commit':40} {'ms':>8}")
    print(f"{'OpenPGP signature (gpg --verify)':40} {pgp:8.3f}")
    print(f"{'SSH signature (in-process SSHSIG)':40} {ssh:8.3f}   OpenPGP/SSH {pgp / ssh:.0f}x")
    print(f"{'2 approvals in a note (after signature)':40} {counted:8.3f}")
    rows: list[Row] = [
        row("approvals: OpenPGP commit signature via gpg", pgp, "ms", ssh, "SSH path"),
        row("approvals: SSH commit signature", ssh, "ms"),
        row("approvals: count 2 approvals in a note", counted, "ms"),
    ]
    emit(rows)


if __name__ == "__main__":
    main()
