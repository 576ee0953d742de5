"""Which commit the daemon may act on under an allowed-signers file, in real
repositories whose commits are signed by the real ``git commit -S`` (or
crafted with ``git hash-object``), and agreement with ``git verify-commit``."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pygit2
import pytest

from reconciler.git.approval import Approver, is_spec_commit
from reconciler.git.sshsig import parse_allowed_signers, sign_commit_payload
from reconciler.protocol.signing import load_private_key
from tests.kit.keys import Key, make_key

ENV = {
    "GIT_AUTHOR_NAME": "Alice",
    "GIT_AUTHOR_EMAIL": "alice@example.com",
    "GIT_COMMITTER_NAME": "Alice",
    "GIT_COMMITTER_EMAIL": "alice@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


@dataclass(frozen=True)
class Keys:
    alice: Path  # ed25519, allowed
    mallory: Path  # ed25519, not allowed
    ecdsa: Path  # allowed
    rsa: Path  # allowed
    carol: Path  # allowed only during 2024
    allowed_signers: Path


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    d = tmp_path_factory.mktemp("keys")
    alice = make_key(d / "alice").private
    mallory = make_key(d / "mallory").private
    ecdsa = make_key(d / "ecdsa", kind="ecdsa", bits=256).private
    rsa = make_key(d / "rsa", kind="rsa", bits=2048).private
    carol = make_key(d / "carol").private
    signers = d / "allowed_signers"
    signers.write_text(
        f"alice@example.com {Key(alice).text}\n"
        f"ops@example.com {Key(ecdsa).text}\n"
        f"rsa@example.com {Key(rsa).text}\n"
        f'carol@example.com valid-after="20240101Z",valid-before="20241231Z" {Key(carol).text}\n'
    )
    return Keys(alice, mallory, ecdsa, rsa, carol, signers)


class FleetRepo:
    """A fleet repository driven by the real git binary, no global config."""

    def __init__(self, path: Path, keys: Keys) -> None:
        self.path = path
        self.keys = keys
        path.mkdir(parents=True)
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str, stdin: bytes | None = None, date: str | None = None) -> str:
        env = {**os.environ, **ENV}
        if date:
            env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
        result = subprocess.run(
            ["git", "-C", str(self.path), *args],
            input=stdin,
            env=env,
            capture_output=True,
            check=True,
        )
        return result.stdout.decode()

    def commit(
        self,
        files: dict[str, str],
        message: str,
        key: Path | None = None,
        date: str = "2024-06-01T12:00:00Z",
    ) -> str:
        for name, text in files.items():
            target = self.path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            self.git("add", name)
        sign = ["-c", "gpg.format=ssh", "-c", f"user.signingKey={key}"] if key else []
        self.git(*sign, "commit", "-q", *(["-S"] if key else []), "-m", message, date=date)
        return self.head()

    def head(self) -> str:
        return self.git("rev-parse", "HEAD").strip()

    def raw(self, commit: str) -> bytes:
        return subprocess.run(
            ["git", "-C", str(self.path), "cat-file", "commit", commit],
            capture_output=True,
            check=True,
            env={**os.environ, **ENV},
        ).stdout

    def write_raw(self, content: bytes) -> str:
        """Store a hand-made commit object and move main to it."""
        commit = self.git("hash-object", "-t", "commit", "-w", "--stdin", stdin=content).strip()
        self.git("update-ref", "refs/heads/main", commit)
        self.git("reset", "-q", "--hard", commit)
        return commit

    def verify_commit(self, commit: str) -> bool:
        """What `git verify-commit` says, with our allowed-signers file."""
        result = subprocess.run(
            [
                *("git", "-C", str(self.path)),
                *("-c", f"gpg.ssh.allowedSignersFile={self.keys.allowed_signers}"),
                *("verify-commit", commit),
            ],
            env={**os.environ, **ENV},
            capture_output=True,
        )
        return result.returncode == 0

    def approver(self) -> Approver:
        allowed = parse_allowed_signers(self.keys.allowed_signers.read_text())
        return Approver(pygit2.Repository(str(self.path)), allowed)


def with_gpgsig(raw: bytes, armored: str) -> bytes:
    """Put a gpgsig header into a commit object, as git writes it."""
    headers, body = raw.split(b"\n\n", 1)
    folded = armored.rstrip("\n").replace("\n", "\n ")
    return headers + b"\ngpgsig " + folded.encode() + b"\n\n" + body


def without_gpgsig(raw: bytes) -> bytes:
    headers, body = raw.split(b"\n\n", 1)
    kept = []
    skipping = False
    for line in headers.split(b"\n"):
        if line.startswith(b"gpgsig "):
            skipping = True
            continue
        if skipping and line.startswith(b" "):
            continue
        skipping = False
        kept.append(line)
    return b"\n".join(kept) + b"\n\n" + body


def rollout(abort: bool = False) -> str:
    return (
        "apiVersion: reconciler/v1\nkind: Rollout\nmetadata: {name: llama}\n"
        f"spec:\n  selector: {{role: canary}}\n  abort: {str(abort).lower()}\n"
    )


@pytest.fixture
def repo(tmp_path: Path, keys: Keys) -> FleetRepo:
    return FleetRepo(tmp_path / "fleet", keys)


@pytest.fixture
def base(repo: FleetRepo, keys: Keys) -> str:
    """A signed first rollout: the commit refused changes fall back to."""
    return repo.commit(
        {"rollouts/llama.yaml": rollout(), "nodes/gpu-a1.yaml": "kind: Node\n"},
        "Start llama",
        key=keys.alice,
    )


# --- acted on ---------------------------------------------------------------


@pytest.mark.parametrize("signer", ["alice", "ecdsa", "rsa"])
def test_a_spec_change_signed_by_an_allowed_key_is_acted_on(
    repo: FleetRepo, keys: Keys, base: str, signer: str
) -> None:
    tip = repo.commit(
        {"rollouts/llama.yaml": rollout(abort=True)}, "Abort llama", key=getattr(keys, signer)
    )

    approval = repo.approver().approve(tip)

    assert approval.verified_commit == tip == approval.newest_spec_commit
    assert approval.refusals == ()
    assert approval.acted_on
    assert repo.verify_commit(tip)


def test_an_unsigned_readme_change_blocks_nothing(repo: FleetRepo, base: str) -> None:
    tip = repo.commit({"README.md": "# fleet\n"}, "Docs")
    tip = repo.commit({"status/llama.yaml": "phase: running\n"}, "status: llama running")

    approval = repo.approver().approve(tip)

    assert approval.verified_commit == base == approval.newest_spec_commit
    assert approval.refusals == ()
    assert approval.acted_on


def test_a_repository_without_spec_files_needs_no_signature(repo: FleetRepo) -> None:
    tip = repo.commit({"README.md": "# fleet\n"}, "Empty fleet")

    approval = repo.approver().approve(tip)

    assert (approval.verified_commit, approval.newest_spec_commit, approval.refusals) == (
        None,
        None,
        (),
    )


# --- refused, with the reason; fallback to the older verified commit --------


MakeCommit = Callable[["FleetRepo", Keys], str]


def unsigned(repo: FleetRepo, keys: Keys) -> str:
    return repo.commit({"rollouts/llama.yaml": rollout(abort=True)}, "Abort llama")


def unknown_key(repo: FleetRepo, keys: Keys) -> str:
    return repo.commit(
        {"rollouts/llama.yaml": rollout(abort=True)}, "Abort llama", key=keys.mallory
    )


def tampered(repo: FleetRepo, keys: Keys) -> str:
    signed = repo.commit(
        {"rollouts/llama.yaml": rollout(abort=True)}, "Abort llama", key=keys.alice
    )
    return repo.write_raw(repo.raw(signed).replace(b"Abort llama", b"Abort llama now"))


def pgp(repo: FleetRepo, keys: Keys) -> str:
    plain = repo.commit({"rollouts/llama.yaml": rollout(abort=True)}, "Abort llama")
    armored = (
        "-----BEGIN PGP SIGNATURE-----\n\niQEzBAABCAAdFiEE0000000000000000000000000000000000\n"
        "=abcd\n-----END PGP SIGNATURE-----\n"
    )
    return repo.write_raw(with_gpgsig(repo.raw(plain), armored))


def wrong_namespace(repo: FleetRepo, keys: Keys) -> str:
    plain = repo.commit({"rollouts/llama.yaml": rollout(abort=True)}, "Abort llama")
    raw = repo.raw(plain)
    payload = repo.path.parent / "payload"
    payload.write_bytes(raw)
    subprocess.run(
        ["ssh-keygen", "-q", "-Y", "sign", "-n", "file", "-f", str(keys.alice), str(payload)],
        check=True,
        capture_output=True,
    )
    return repo.write_raw(with_gpgsig(raw, Path(f"{payload}.sig").read_text()))


def expired(repo: FleetRepo, keys: Keys) -> str:
    return repo.commit(
        {"rollouts/llama.yaml": rollout(abort=True)},
        "Abort llama",
        key=keys.carol,
        date="2025-03-01T00:00:00Z",
    )


def not_yet_valid(repo: FleetRepo, keys: Keys) -> str:
    return repo.commit(
        {"rollouts/llama.yaml": rollout(abort=True)},
        "Abort llama",
        key=keys.carol,
        date="2023-06-01T00:00:00Z",
    )


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (unsigned, "the commit is not signed"),
        (unknown_key, "that key is not an allowed signer"),
        (tampered, "bad signature by ED25519 key"),
        (pgp, "signed with an OpenPGP signature, not an SSH signature"),
        (wrong_namespace, "signed for namespace 'file', not 'git'"),
        (expired, "carol@example.com's key was valid only until 2024-12-31T00:00:00Z"),
        (not_yet_valid, "carol@example.com's key is valid only after 2024-01-01T00:00:00Z"),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_a_refused_spec_change_falls_back_to_the_older_verified_commit(
    repo: FleetRepo,
    keys: Keys,
    base: str,
    make: MakeCommit,
    reason: str,
) -> None:
    tip = make(repo, keys)

    approval = repo.approver().approve(tip)

    assert approval.verified_commit == base
    assert approval.newest_spec_commit == tip
    assert [r.commit for r in approval.refusals] == [tip]
    assert reason in approval.refusals[0].reason
    assert approval.refusals[0].author == "Alice <alice@example.com>"
    assert not approval.acted_on
    # the abort in the refused commit is not in the tree the daemon acts on
    tree = pygit2.Repository(str(repo.path))[approval.verified_commit].peel(pygit2.Commit).tree
    assert b"abort: false" in tree["rollouts/llama.yaml"].peel(pygit2.Blob).data


@pytest.mark.parametrize(
    "make", [unsigned, unknown_key, tampered, pgp, wrong_namespace, expired, not_yet_valid]
)
def test_our_verdict_agrees_with_git_verify_commit(
    repo: FleetRepo,
    keys: Keys,
    base: str,
    make: MakeCommit,
) -> None:
    tip = make(repo, keys)
    signed_in_window = repo.commit(
        {"nodes/gpu-a2.yaml": "kind: Node\n"},
        "Add node",
        key=keys.carol,
        date="2024-06-01T00:00:00Z",
    )
    approver = repo.approver()

    for commit in (base, tip, signed_in_window):
        assert approver.check_commit(commit).ok == repo.verify_commit(commit), commit

    assert [approver.check_commit(c).ok for c in (base, tip, signed_in_window)] == [
        True,
        False,
        True,
    ]


def test_refusals_pile_up_newest_first_until_a_verified_commit(
    repo: FleetRepo, keys: Keys, base: str
) -> None:
    first = unsigned(repo, keys)
    repo.commit({"README.md": "docs\n"}, "Docs")
    second = repo.commit({"nodes/gpu-a2.yaml": "kind: Node\n"}, "Add node", key=keys.mallory)
    tip = repo.commit({"status/llama.yaml": "phase: running\n"}, "status")

    approval = repo.approver().approve(tip)

    assert approval.verified_commit == base
    assert approval.newest_spec_commit == second
    assert [r.commit for r in approval.refusals] == [second, first]


def test_a_newer_signed_spec_change_approves_its_whole_tree(
    repo: FleetRepo, keys: Keys, base: str
) -> None:
    unsigned(repo, keys)
    tip = repo.commit({"nodes/gpu-a2.yaml": "kind: Node\n"}, "Add node", key=keys.alice)

    approval = repo.approver().approve(tip)

    assert (approval.verified_commit, approval.refusals) == (tip, ())


def test_an_unsigned_root_commit_with_spec_files_is_refused(repo: FleetRepo) -> None:
    root = repo.commit({"reconciler.yaml": "kind: Settings\n"}, "Settings")

    approval = repo.approver().approve(root)

    assert approval.verified_commit is None
    assert approval.newest_spec_commit == root
    assert approval.refusals[0].reason == "the commit is not signed"


def test_merges_are_judged_against_their_first_parent(
    repo: FleetRepo, keys: Keys, base: str
) -> None:
    # a reviewed branch of unsigned work, merged by an approver with a signed merge
    repo.git("checkout", "-q", "-b", "feature")
    repo.commit({"rollouts/other.yaml": rollout()}, "Add other rollout")
    repo.git("checkout", "-q", "main")
    repo.git(
        "-c", "gpg.format=ssh", "-c", f"user.signingKey={keys.alice}",
        "merge", "-q", "--no-ff", "-S", "-m", "Merge feature", "feature",
    )  # fmt: skip
    signed_merge = repo.head()
    # the other way round: signed work merged without a signature
    repo.git("checkout", "-q", "-b", "feature2")
    signed_work = repo.commit({"rollouts/third.yaml": rollout()}, "Add third", key=keys.alice)
    repo.git("checkout", "-q", "main")
    repo.git("merge", "-q", "--no-ff", "-m", "Merge feature2", "feature2")
    unsigned_merge = repo.head()
    approver = repo.approver()

    assert approver.approve(signed_merge).verified_commit == signed_merge
    after = approver.approve(unsigned_merge)
    assert after.verified_commit == signed_merge  # not the signed side-branch commit
    assert signed_work not in {r.commit for r in after.refusals}
    assert [r.commit for r in after.refusals] == [unsigned_merge]


def test_spec_commit_means_a_changed_spec_path(repo: FleetRepo, keys: Keys, base: str) -> None:
    git = pygit2.Repository(str(repo.path))
    status = repo.commit({"status/llama.yaml": "x\n"}, "status")
    settings = repo.commit({"reconciler.yaml": "kind: Settings\n"}, "settings")
    lookalike = repo.commit({"rollouts-old/x.yaml": "x\n", "nodes.md": "x\n"}, "lookalikes")

    def spec(commit: str) -> bool:
        return is_spec_commit(git, git[commit].peel(pygit2.Commit))

    assert [spec(base), spec(status), spec(settings), spec(lookalike)] == [True, False, True, False]


# --- caching ----------------------------------------------------------------


def test_results_are_cached_per_commit(repo: FleetRepo, keys: Keys, base: str) -> None:
    refused = unsigned(repo, keys)
    approver = repo.approver()
    first = approver.approve(refused)

    # the same tip is a lookup: the very same answer comes back
    assert approver.approve(refused) is first
    assert approver.check_commit(refused) is approver.check_commit(refused)
    # a status commit on top reuses the chain's answer
    tip = repo.commit({"status/llama.yaml": "phase: running\n"}, "status")
    assert approver.approve(tip) == first


# --- signing status commits ---------------------------------------------------


def test_a_status_commit_signed_by_the_daemon_passes_git_verify_commit(
    tmp_path: Path, repo: FleetRepo, keys: Keys, base: str
) -> None:
    daemon_key = make_key(tmp_path / "reconciler").private
    private = load_private_key(daemon_key).private_key  # what `run --key` loads
    git = pygit2.Repository(str(repo.path))
    parent = git[base].peel(pygit2.Commit)
    builder = git.TreeBuilder(parent.tree)
    status = git.TreeBuilder()
    status.insert("llama.yaml", git.create_blob(b"phase: running\n"), pygit2.enums.FileMode.BLOB)
    builder.insert("status", status.write(), pygit2.enums.FileMode.TREE)
    who = pygit2.Signature("reconciler", "reconciler@localhost", 1717243200, 0)

    # the stub says Oid; pygit2 returns the commit object's text
    content = str(
        git.create_commit_string(who, who, "status: llama running\n", builder.write(), [parent.id])
    )
    commit = str(
        git.create_commit_with_signature(content, sign_commit_payload(private, content.encode()))
    )

    allowed = tmp_path / "daemon_signers"
    allowed.write_text(f"reconciler@localhost {Key(daemon_key).text}\n")
    result = subprocess.run(
        [
            "git",
            "-C",
            str(repo.path),
            "-c",
            f"gpg.ssh.allowedSignersFile={allowed}",
            "verify-commit",
            commit,
        ],
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert 'Good "git" signature for reconciler@localhost' in result.stderr
    # and it round-trips through our own verifier
    approver = Approver(git, parse_allowed_signers(allowed.read_text()))
    assert approver.check_commit(commit).ok
    # a status-only commit still needs no signature for approval purposes
    assert repo.approver().approve(commit).verified_commit == base


def test_a_merge_is_a_spec_commit_when_it_differs_from_any_parent(
    repo: FleetRepo, keys: Keys, base: str
) -> None:
    # Parents in either order: an unsigned merge that takes one side's spec
    # changes the other side's, so it needs a signature itself.
    repo.git("checkout", "-q", "-b", "side")
    side = repo.commit({"rollouts/other.yaml": rollout()}, "Side", key=keys.alice)
    repo.git("checkout", "-q", "main")
    main = repo.commit({"rollouts/third.yaml": rollout()}, "Main", key=keys.alice)
    tree = repo.git("rev-parse", f"{side}^{{tree}}").strip()
    merge = repo.git("commit-tree", tree, "-p", side, "-p", main, "-m", "Merge").strip()
    same = repo.git("commit-tree", tree, "-p", side, "-m", "One side").strip()
    git = pygit2.Repository(str(repo.path))

    assert is_spec_commit(git, git[merge].peel(pygit2.Commit))
    assert not is_spec_commit(git, git[same].peel(pygit2.Commit))
    approval = repo.approver().approve(merge)
    assert [r.commit for r in approval.refusals] == [merge]
    assert approval.verified_commit == side  # its first parent: the daemon's
    # forward-only rule (tests/test_approval_attacks.py) refuses that move
