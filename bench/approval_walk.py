"""Cost of the verification walk over a long history, with and without
approval rules: each spec commit is judged on its change from the verified
commit before it, so a cold walk folds the whole first-parent chain.

    .venv/bin/python bench/approval_walk.py [--specs 200] [--status 20] [--nodes 200] [--runs 3]

Builds a repository with pygit2: a root commit with ``--nodes`` node files
(half ``role: serving``) and settings, then ``--specs`` spec commits, each
signed (SSHSIG, as ``git commit -S`` writes it) and approved by a reviewer
who is also a serving owner, each followed by ``--status`` status-only
commits (the daemon's). Prints, medians over ``--runs``: a cold walk from
the tip by a fresh ``Approver``; the walk again after one more approval
moved the notes ref; one new spec commit on top of a warm walk. Once with
``spec.approvalRules`` (a serving rule touched by every other commit) and
once without (version 2's global minimum only).
"""

from __future__ import annotations

import argparse
import base64
import statistics
import tempfile
import time
from pathlib import Path

import pygit2
from _common import Row, emit, row
from cryptography.hazmat.primitives.asymmetric import ed25519

from reconciler.git.approval import Approver
from reconciler.git.approval_notes import NAMESPACE, NOTES_REF, approval_message
from reconciler.git.sshsig import parse_allowed_signers, sign_commit_payload, sign_sshsig

RULES = """apiVersion: reconciler/v1
kind: Settings
spec:
  approvalRules:
    - name: serving-owners
      nodes: {selector: {role: serving}}
      principals: [reviewer@example.com]
      require: 1
"""
PLAIN = "apiVersion: reconciler/v1\nkind: Settings\n"


def node(name: str, role: str) -> bytes:
    return (
        "apiVersion: reconciler/v1\nkind: Node\n"
        f"metadata: {{name: {name}}}\n"
        f"spec: {{agent: 'http://127.0.0.1:9', labels: {{role: {role}}}}}\n"
    ).encode()


def rollout(index: int) -> bytes:
    role = "serving" if index % 2 else "research"
    return (
        "apiVersion: reconciler/v1\nkind: Rollout\n"
        f"metadata: {{name: r{index}}}\n"
        f"spec: {{target: {{runtime: hermes, provider: ollama, model: m{index}}}, "
        f"selector: {{role: {role}}}}}\n"
    ).encode()


class Builder:
    def __init__(self, path: Path, author: ed25519.Ed25519PrivateKey) -> None:
        self.repo = pygit2.init_repository(str(path), bare=True)
        self.author = author
        self.who = pygit2.Signature("Bench", "author@example.com", 1_700_000_000, 0)
        self.tip: str | None = None
        self.tick = 0

    def commit(self, tree: pygit2.Oid, sign: bool) -> str:
        self.tick += 1
        who = pygit2.Signature("Bench", "author@example.com", 1_700_000_000 + self.tick, 0)
        parents = [pygit2.Oid(hex=self.tip)] if self.tip else []
        message = f"commit {self.tick}\n"
        if sign:
            payload = str(self.repo.create_commit_string(who, who, message, tree, parents))
            armored = sign_commit_payload(self.author, payload.encode())
            oid = self.repo.create_commit_with_signature(payload, armored, "gpgsig")
        else:
            oid = self.repo.create_commit(None, who, who, message, tree, parents)
        self.tip = str(oid)
        self.repo.references.create("refs/heads/main", oid, force=True)
        return self.tip


_blobs: dict[bytes, pygit2.Oid] = {}
_folders: dict[tuple[str, tuple[tuple[str, pygit2.Oid], ...]], pygit2.Oid] = {}


def tree_of(repo: pygit2.Repository, files: dict[str, bytes]) -> pygit2.Oid:
    """The root tree of ``files``; blobs and folders already written are reused."""
    folders: dict[str, list[tuple[str, pygit2.Oid]]] = {}
    top = repo.TreeBuilder()
    for path, data in sorted(files.items()):
        blob = _blobs.get(data)
        if blob is None:
            blob = _blobs[data] = repo.create_blob(data)
        if "/" in path:
            folder, name = path.split("/", 1)
            folders.setdefault(folder, []).append((name, blob))
        else:
            top.insert(path, blob, pygit2.GIT_FILEMODE_BLOB)
    for folder, entries in folders.items():
        key = (folder, tuple(entries))
        sub = _folders.get(key)
        if sub is None:
            builder = repo.TreeBuilder()
            for name, blob in entries:
                builder.insert(name, blob, pygit2.GIT_FILEMODE_BLOB)
            sub = _folders[key] = builder.write()
        top.insert(folder, sub, pygit2.GIT_FILEMODE_TREE)
    return top.write()


def build(
    path: Path,
    settings: str,
    args: argparse.Namespace,
    author: ed25519.Ed25519PrivateKey,
    reviewer: ed25519.Ed25519PrivateKey,
) -> tuple[pygit2.Repository, list[str]]:
    builder = Builder(path, author)
    repo = builder.repo
    _blobs.clear()
    _folders.clear()
    files: dict[str, bytes] = {"reconciler.yaml": settings.encode()}
    for i in range(args.nodes):
        files[f"nodes/n{i:04d}.yaml"] = node(f"n{i:04d}", "serving" if i % 2 else "research")
    specs = []
    who = pygit2.Signature("Reviewer", "reviewer@example.com")
    for index in range(args.specs):
        files[f"rollouts/r{index}.yaml"] = rollout(index)
        spec = builder.commit(tree_of(repo, files), sign=True)
        specs.append(spec)
        note = sign_sshsig(reviewer, approval_message(spec), NAMESPACE)
        repo.create_note(note, who, who, spec, NOTES_REF, True)
        for j in range(args.status):
            status = {**files, f"status/r{index}.yaml": f"n: {j}\n".encode()}
            builder.commit(tree_of(repo, status), sign=False)
    return repo, specs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--specs", type=int, default=200)
    parser.add_argument("--status", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    author, reviewer = ed25519.Ed25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate()
    allowed = parse_allowed_signers(
        "".join(
            f"{who}@example.com ssh-ed25519 {_blob(key)}\n"
            for who, key in (("author", author), ("reviewer", reviewer))
        )
    )
    results: dict[str, tuple[float, float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, settings in (("with rules", RULES), ("without rules", PLAIN)):
            repo, specs = build(
                Path(tmp) / label.replace(" ", "-"), settings, args, author, reviewer
            )
            tip = str(repo.references["refs/heads/main"].target)
            cold, moved, step = [], [], []
            for _ in range(args.runs):
                approver = Approver(repo, allowed, required_approvals=1)
                start = time.perf_counter()
                approval = approver.approve(tip)
                cold.append((time.perf_counter() - start) * 1000)
                assert approval.verified_commit == specs[-1], approval.refusals[:1]
                who = pygit2.Signature("Other", "other@example.com")
                # any approval moves the notes ref (here: a note on a status commit)
                repo.create_note(f"run {len(cold)}\n", who, who, tip, NOTES_REF, True)
                start = time.perf_counter()
                approver.approve(tip)
                moved.append((time.perf_counter() - start) * 1000)
                extra = repo.create_commit(
                    None, who, who, "status\n", repo[tip].peel(pygit2.Commit).tree.id, [tip]
                )
                start = time.perf_counter()
                approver.approve(str(extra))
                step.append((time.perf_counter() - start) * 1000)
            results[label] = (
                statistics.median(cold),
                statistics.median(moved),
                statistics.median(step),
            )
    commits = args.specs * (1 + args.status)
    print(f"{commits} first-parent commits, {args.specs} spec commits, {args.nodes} nodes")
    print(f"{'walk':36} {'with rules ms':>14} {'without ms':>12}")
    names = ("cold, from the root", "after the notes ref moved", "one new commit on top")
    for i, name in enumerate(names):
        print(f"{name:36} {results['with rules'][i]:14.1f} {results['without rules'][i]:12.1f}")
    rows: list[Row] = [
        row(
            f"approval walk: {name}, {commits} commits, rules",
            results["with rules"][i],
            "ms",
            results["without rules"][i],
            "without rules",
        )
        for i, name in enumerate(names)
    ]
    emit(rows)


def _blob(key: ed25519.Ed25519PrivateKey) -> str:
    raw = key.public_key().public_bytes_raw()
    wire = b"".join(len(p).to_bytes(4, "big") + p for p in (b"ssh-ed25519", raw))
    return base64.b64encode(wire).decode()


if __name__ == "__main__":
    main()
