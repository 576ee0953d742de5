"""Commit signature checks: in-process SSHSIG against `git verify-commit`.

    .venv/bin/python bench/sshsig.py [--commits 200] [--git-sample 20] [--status 2000]

Builds a repository in a temporary directory with signed spec commits
(Ed25519 signed in-process; ECDSA P-256 and RSA 3072 signed by `git commit -S`),
then prints, per key type: our first verification of a commit (reading the
commit included), a cached one, and `git verify-commit` on the same commits,
with the ratio. Then the cost of `Approver.approve` over a history of status
commits: first walk, unchanged tip, and one new status commit on top.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import pygit2
from _common import Row, emit, row
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from reconciler.git.approval import Approver
from reconciler.git.sshsig import parse_allowed_signers, sign_commit_payload

ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "Bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "Bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}
WHO = pygit2.Signature("Bench", "bench@example.com", 1717243200, 0)


def keygen(directory: Path, name: str, *kind: str) -> Path:
    path = directory / name
    subprocess.run(["ssh-keygen", "-q", *kind, "-N", "", "-f", str(path)], check=True)
    return path


def public(path: Path) -> str:
    kind, blob, *_ = Path(f"{path}.pub").read_text().split()
    return f"{kind} {blob}"


def commit_file(
    repo: pygit2.Repository,
    folder: str,
    name: str,
    data: bytes,
    key: ed25519.Ed25519PrivateKey | None,
) -> str:
    """One commit on main changing folder/name, signed in-process if key is given."""
    parent = repo.head.peel(pygit2.Commit) if not repo.head_is_unborn else None
    root = repo.TreeBuilder(parent.tree) if parent else repo.TreeBuilder()
    sub = (
        repo.TreeBuilder(parent.tree[folder].peel(pygit2.Tree))
        if parent and folder in parent.tree
        else repo.TreeBuilder()
    )
    sub.insert(name, repo.create_blob(data), pygit2.enums.FileMode.BLOB)
    root.insert(folder, sub.write(), pygit2.enums.FileMode.TREE)
    parents: list[str | pygit2.Oid] = [parent.id] if parent else []
    content = str(repo.create_commit_string(WHO, WHO, f"{folder}/{name}\n", root.write(), parents))
    if key is None:
        oid = repo.create_commit(None, WHO, WHO, f"{folder}/{name}\n", root.write(), parents)
    else:
        oid = repo.create_commit_with_signature(content, sign_commit_payload(key, content.encode()))
    if parent:
        repo.references["refs/heads/main"].set_target(oid)
    else:
        repo.references.create("refs/heads/main", oid)
    return str(oid)


def git_signed_commit(workdir: Path, key: Path, index: int) -> str:
    target = workdir / "rollouts" / f"git-{key.name}-{index}.yaml"
    target.parent.mkdir(exist_ok=True)
    target.write_text(f"n: {index}\n")
    subprocess.run(["git", "-C", str(workdir), "add", "rollouts"], env=ENV, check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(workdir),
            "-c",
            "gpg.format=ssh",
            "-c",
            f"user.signingKey={key}",
            "commit",
            "-q",
            "-S",
            "-m",
            f"signed {index}",
        ],
        env=ENV,
        check=True,
    )
    out = subprocess.run(
        ["git", "-C", str(workdir), "rev-parse", "HEAD"], env=ENV, capture_output=True, text=True
    )
    return out.stdout.strip()


def per_commit_ms(run: object, items: list[str]) -> float:
    assert callable(run)
    start = time.perf_counter()
    for item in items:
        run(item)
    return (time.perf_counter() - start) * 1000 / len(items)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--commits", type=int, default=200, help="Ed25519 commits signed in-process"
    )
    parser.add_argument("--git-sample", type=int, default=20, help="commits per type for git")
    parser.add_argument("--status", type=int, default=2000, help="status commits on top")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        ed_path = keygen(base, "ed25519", "-t", "ed25519")
        ecdsa_path = keygen(base, "ecdsa", "-t", "ecdsa", "-b", "256")
        rsa_path = keygen(base, "rsa", "-t", "rsa", "-b", "3072")
        signers = base / "allowed_signers"
        signers.write_text(
            "".join(f"{p.name}@example.com {public(p)}\n" for p in (ed_path, ecdsa_path, rsa_path))
        )
        ed_key = serialization.load_ssh_private_key(ed_path.read_bytes(), password=None)
        assert isinstance(ed_key, ed25519.Ed25519PrivateKey)

        workdir = base / "fleet"
        workdir.mkdir()
        subprocess.run(["git", "-C", str(workdir), "init", "-q", "-b", "main"], env=ENV, check=True)
        by_type: dict[str, list[str]] = {
            "ssh-ed25519": [],
            "ecdsa-sha2-nistp256": [],
            "rsa-3072": [],
        }
        for i in range(args.git_sample):
            by_type["ecdsa-sha2-nistp256"].append(git_signed_commit(workdir, ecdsa_path, i))
            by_type["rsa-3072"].append(git_signed_commit(workdir, rsa_path, i))
        repo = pygit2.Repository(str(workdir))
        for i in range(args.commits):
            by_type["ssh-ed25519"].append(
                commit_file(repo, "rollouts", f"r{i}.yaml", f"n: {i}\n".encode(), ed_key)
            )
        allowed = parse_allowed_signers(signers.read_text())

        def git_verify(commit: str) -> None:
            result = subprocess.run(
                [
                    "git",
                    "-C",
                    str(workdir),
                    "-c",
                    f"gpg.ssh.allowedSignersFile={signers}",
                    "verify-commit",
                    commit,
                ],
                env=ENV,
                capture_output=True,
            )
            assert result.returncode == 0, result.stderr

        print(
            f"{'key type':22} {'first':>10} {'cached':>10} {'git verify-commit':>18} {'git/first':>10}"
        )
        rows: list[Row] = []
        for key_type, commits in by_type.items():
            approver = Approver(repo, allowed)
            firsts, cached = [], []
            for _ in range(3):
                approver = Approver(repo, allowed)
                firsts.append(per_commit_ms(approver.check_commit, commits))
                cached.append(per_commit_ms(approver.check_commit, commits))
            assert all(approver.check_commit(c).ok for c in commits)
            git_ms = per_commit_ms(git_verify, commits[: args.git_sample])
            first = statistics.median(firsts)
            print(
                f"{key_type:22} {first:8.3f}ms {statistics.median(cached) * 1000:8.2f}us"
                f" {git_ms:16.2f}ms {git_ms / first:9.0f}x"
            )
            rows.append(
                row(f"sshsig {key_type}: verify a commit", first, "ms", git_ms, "git verify-commit")
            )

        for i in range(args.status):
            commit_file(repo, "status", f"s{i % 50}.yaml", f"n: {i}\n".encode(), None)
        tip = str(repo.head.target)
        approver = Approver(repo, allowed)
        start = time.perf_counter()
        approval = approver.approve(tip)
        walk_ms = (time.perf_counter() - start) * 1000
        assert approval.acted_on
        repeat = 10_000
        start = time.perf_counter()
        for _ in range(repeat):
            approver.approve(tip)
        same_us = (time.perf_counter() - start) * 1e6 / repeat
        new_tip = commit_file(repo, "status", "new.yaml", b"x\n", None)
        start = time.perf_counter()
        approver.approve(new_tip)
        new_us = (time.perf_counter() - start) * 1e6
        print(
            f"approve over {args.status} status commits above the newest spec commit:"
            f" first walk {walk_ms:.1f} ms, unchanged tip {same_us:.2f} us,"
            f" one new status commit {new_us:.0f} us"
        )
        tag = f"sshsig approve over {args.status:,} status commits"
        rows += [
            row(f"{tag}: first walk", walk_ms, "ms"),
            row(f"{tag}: unchanged tip", same_us, "us"),
            row(f"{tag}: one new status commit", new_us, "us"),
        ]
        emit(rows)


if __name__ == "__main__":
    main()
