"""Reviewers' approvals in ``refs/notes/reconciler-approvals`` (docs/trust.md), with real keys from ``ssh-keygen``, real commits signed by
``git commit -S``, and ``ssh-keygen -Y verify`` as the judge of every
signature we accept or refuse."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pygit2
import pytest

from reconciler.cli.main import main
from reconciler.git import approval_notes
from reconciler.git.approval import Approver, load_allowed_signers
from reconciler.git.approval_notes import (
    NOTES_REF,
    approval_message,
    count_approvals,
    read_note,
)
from reconciler.git.sshsig import parse_allowed_signers
from tests.kit.git import clone, git, git_env, install_hook, make_bare_repo
from tests.kit.keys import Key, make_key

ROLLOUT = """apiVersion: reconciler/v1
kind: Rollout
metadata: {name: r}
spec:
  target: {runtime: hermes, provider: ollama, model: m, profile: default}
  nodeIds: [a]
"""


def ssh_sign(key: Path, message: bytes, namespace: str) -> str:
    """A signature made by ``ssh-keygen -Y sign`` itself (stdin to stdout)."""
    return subprocess.run(
        ["ssh-keygen", "-q", "-Y", "sign", "-n", namespace, "-f", str(key)],
        input=message,
        capture_output=True,
        check=True,
    ).stdout.decode()


def ssh_verify(signers: Path, principal: str, signature: str, message: bytes) -> bool:
    sig = signers.parent / "sig.tmp"
    sig.write_text(signature)
    result = subprocess.run(
        [
            "ssh-keygen",
            "-Y",
            "verify",
            "-f",
            str(signers),
            "-I",
            principal,
            "-n",
            "reconciler-approval",
            "-s",
            str(sig),
        ],
        input=message,
        capture_output=True,
    )
    return result.returncode == 0


@dataclass
class Review:
    """A bare fleet repository, a clone per person, and their keys."""

    root: Path
    bare: Path
    alice_work: Path
    bob_work: Path
    alice: Path
    bob: Path
    bob2: Path  # a second key of bob's, on its own line
    carol: Path  # allowed for commits only (namespaces="git")
    dave: Path  # allowed, but his key expired in 2024
    mallory: Path  # not allowed at all
    signers: Path
    commit: str  # alice's signed spec commit

    def approve(self, who: Path, work: Path, *args: str) -> int:
        return main(["approve", "--key", str(who), "--repo", str(work), *args])

    def approver(self, required: int = 1) -> Approver:
        repo = pygit2.Repository(str(self.bare))
        return Approver(repo, load_allowed_signers(self.signers), required_approvals=required)

    def add_note(self, work: Path, commit: str, text: str) -> None:
        git("notes", "--ref", NOTES_REF, "append", "-m", text, commit, cwd=work)

    def push_notes(self, work: Path) -> None:
        git("push", "-q", "origin", f"{NOTES_REF}:{NOTES_REF}", cwd=work)


@pytest.fixture
def review(tmp_path: Path) -> Review:
    keys = tmp_path / "keys"
    keys.mkdir()
    alice, bob, bob2, carol, dave, mallory = (
        make_key(keys / n).private for n in ("alice", "bob", "bob2", "carol", "dave", "mallory")
    )
    signers = tmp_path / "allowed_signers"
    signers.write_text(
        f"alice@example.com {Key(alice).text}\n"
        f"bob@example.com {Key(bob).text}\n"
        f"bob@example.com {Key(bob2).text}\n"
        f'carol@example.com namespaces="git" {Key(carol).text}\n'
        f'dave@example.com valid-before="20250101Z" {Key(dave).text}\n'
    )
    bare = make_bare_repo(tmp_path, {"README.md": "fleet\n"})
    alice_work = clone(bare, tmp_path / "alice-work")
    bob_work = clone(bare, tmp_path / "bob-work")
    (alice_work / "rollouts").mkdir()
    (alice_work / "rollouts" / "r.yaml").write_text(ROLLOUT)
    env = git_env("Alice", "alice@example.com")
    git("add", "-A", cwd=alice_work, env=env)
    git(
        "-c", "gpg.format=ssh", "-c", f"user.signingKey={alice}",
        "commit", "-q", "-S", "-m", "Roll out r", cwd=alice_work, env=env,
    )  # fmt: skip
    git("push", "-q", "origin", "HEAD:main", cwd=alice_work, env=env)
    git("pull", "-q", "origin", "main", cwd=bob_work)
    commit = git("rev-parse", "HEAD", cwd=alice_work)
    return Review(
        tmp_path, bare, alice_work, bob_work, alice, bob, bob2, carol, dave, mallory, signers,
        commit,
    )  # fmt: skip


def test_a_signed_commit_without_approval_is_refused_naming_what_is_missing(
    review: Review,
) -> None:
    approval = review.approver().approve(review.commit)
    assert approval.verified_commit is None
    assert approval.refusals[0].reason.startswith(
        "needs 1 approval besides alice@example.com's; has 0"
    )


def test_bobs_approval_counts_and_ssh_keygen_agrees(review: Review) -> None:
    assert review.approve(review.bob, review.bob_work, review.commit, "--push") == 0
    approver = review.approver()
    assert approver.approve(review.commit).verified_commit == review.commit
    counted = approver.approvals(review.commit).counted
    assert [a.principal for a in counted] == ["bob@example.com"]
    note = read_note(pygit2.Repository(str(review.bare)), review.commit)
    assert note is not None
    message = approval_message(review.commit)
    assert ssh_verify(review.signers, "bob@example.com", note, message)


def test_an_approval_made_by_ssh_keygen_itself_counts(review: Review) -> None:
    signature = ssh_sign(review.bob, approval_message(review.commit), "reconciler-approval")
    review.add_note(review.bob_work, review.commit, signature)
    review.push_notes(review.bob_work)
    assert review.approver().approve(review.commit).verified_commit == review.commit


def test_bad_approvals_are_each_ignored_with_a_reason(
    review: Review, capsys: pytest.CaptureFixture[str]
) -> None:
    work, commit = review.bob_work, review.commit
    other = git("rev-parse", "HEAD~1", cwd=work)
    copied = ssh_sign(review.bob, approval_message(other), "reconciler-approval")
    wrong_namespace = ssh_sign(review.bob, approval_message(commit), "git")
    own = ssh_sign(review.alice, approval_message(commit), "reconciler-approval")
    commit_only = ssh_sign(review.carol, approval_message(commit), "reconciler-approval")
    expired = ssh_sign(review.dave, approval_message(commit), "reconciler-approval")
    stranger = ssh_sign(review.mallory, approval_message(commit), "reconciler-approval")
    truncated = own.replace("\n", "", 2)[:-60] + "\n-----END SSH SIGNATURE-----\n"
    for text in ("LGTM, ship it", copied, wrong_namespace, own, commit_only, expired):
        review.add_note(work, commit, text)
    review.add_note(work, commit, stranger)
    review.add_note(work, commit, truncated)
    review.push_notes(work)

    approval = review.approver().approve(commit)
    assert approval.verified_commit is None
    approvals = review.approver().approvals(commit)
    assert approvals.counted == ()
    ignored = "\n".join(approvals.ignored)
    assert "not an SSH signature ('LGTM, ship it')" in ignored
    assert "made for another commit?" in ignored
    assert "signed for namespace 'git', not 'reconciler-approval'" in ignored
    assert "alice@example.com signed the commit; an author cannot approve it" in ignored
    assert "carol@example.com may sign only namespaces git" in ignored
    assert "dave@example.com's key was valid only until 2025-01-01" in ignored
    assert "that key is not an allowed signer" in ignored
    assert len(approvals.ignored) == 8  # the truncated one too, whatever its reason

    # ssh-keygen agrees with each verdict on the signatures themselves.
    message = approval_message(commit)
    assert not ssh_verify(review.signers, "bob@example.com", copied, message)
    assert not ssh_verify(review.signers, "bob@example.com", wrong_namespace, message)
    assert ssh_verify(review.signers, "alice@example.com", own, message)  # refused by policy
    assert not ssh_verify(review.signers, "carol@example.com", commit_only, message)
    assert not ssh_verify(review.signers, "dave@example.com", expired, message)
    assert not ssh_verify(review.signers, "mallory@example.com", stranger, message)

    capsys.readouterr()
    code = main(
        [
            "verify",
            commit,
            "--repo",
            str(review.bare),
            "--allowed-signers",
            str(review.signers),
            "--require-approvals",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "would NOT be acted on" in out
    assert "needs 1 approval besides alice@example.com's; has 0" in out
    for why in approvals.ignored:  # the moment checked at aside
        assert f"ignored: {why.split(', signed at')[0]}" in out


def test_the_same_principal_counts_once_whatever_the_key(review: Review) -> None:
    assert review.approve(review.bob, review.bob_work, review.commit) == 0
    assert review.approve(review.bob2, review.bob_work, review.commit) == 0
    assert review.approve(review.bob, review.bob_work, review.commit) == 0  # no duplicate
    review.push_notes(review.bob_work)
    approvals = review.approver(required=2).approvals(review.commit)
    assert [a.principal for a in approvals.counted] == ["bob@example.com"]
    assert any("bob@example.com already approved; counted once" in w for w in approvals.ignored)
    assert not approvals.ok
    note = read_note(pygit2.Repository(str(review.bare)), review.commit) or ""
    assert note.count("BEGIN SSH SIGNATURE") == 2


def test_a_new_approval_is_seen_by_the_same_approver(review: Review) -> None:
    approver = review.approver()
    assert approver.approve(review.commit).verified_commit is None
    review.approve(review.bob, review.bob_work, review.commit, "--push")
    assert approver.approve(review.commit).verified_commit == review.commit


def test_garbage_notes_never_raise() -> None:
    allowed = parse_allowed_signers("")
    for note in (
        "",
        "\x00\xff binary",
        "-----BEGIN SSH SIGNATURE-----\n!!!\n-----END SSH SIGNATURE-----",
        "-----BEGIN SSH SIGNATURE-----\nU1NIU0lH\n-----END SSH SIGNATURE-----",
        "-----BEGIN SSH SIGNATURE-----",
        "x" * 10_000,
    ):
        result = count_approvals(note, "0" * 40, allowed, required=1)
        assert not result.ok
        assert result.counted == ()


def test_two_reviewers_pushing_at_once_keep_both_approvals(review: Review) -> None:
    third = clone(review.bare, review.root / "third")
    signers = review.signers
    erin = make_key(review.root / "keys" / "erin").private
    signers.write_text(signers.read_text() + f"erin@example.com {Key(erin).text}\n")
    outcomes: list[int] = []
    start = threading.Barrier(2)

    def approve(key: Path, work: Path) -> None:
        start.wait()
        outcomes.append(
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "reconciler",
                    "approve",
                    review.commit,
                    "--key",
                    str(key),
                    "--repo",
                    str(work),
                    "--push",
                ],
                capture_output=True,
            ).returncode
        )

    threads = [
        threading.Thread(target=approve, args=(review.bob, review.bob_work)),
        threading.Thread(target=approve, args=(erin, third)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert outcomes == [0, 0]
    approvals = review.approver(required=2).approvals(review.commit)
    assert sorted(a.principal for a in approvals.counted) == ["bob@example.com", "erin@example.com"]


def test_a_push_that_lost_the_race_merges_and_keeps_both(
    review: Review, capsys: pytest.CaptureFixture[str]
) -> None:
    erin = make_key(review.root / "keys" / "erin").private
    review.signers.write_text(review.signers.read_text() + f"erin@example.com {Key(erin).text}\n")
    third = clone(review.bare, review.root / "third")
    assert review.approve(erin, third, review.commit) == 0  # local only, for now
    assert review.approve(review.bob, review.bob_work, review.commit, "--push") == 0
    capsys.readouterr()
    assert review.approve(erin, third, review.commit, "--push") == 0
    assert "merged with 1 approval push(es) by others" in capsys.readouterr().out
    approvals = review.approver(required=2).approvals(review.commit)
    assert approvals.ok, approvals.summary()
    # git itself reads the merged notes ref.
    shown = git("notes", "--ref", NOTES_REF, "show", review.commit, cwd=review.bare)
    assert shown.count("BEGIN SSH SIGNATURE") == 2


def test_plan_shows_the_approvals_present_and_missing(
    review: Review, capsys: pytest.CaptureFixture[str]
) -> None:
    assert review.approve(review.bob, review.bob_work, review.commit) == 0
    capsys.readouterr()
    main(
        [
            "plan",
            "--repo",
            str(review.bob_work),
            "--base",
            "HEAD~1",
            "--head",
            review.commit,
            "--allowed-signers",
            str(review.signers),
            "--require-approvals",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert f"Approvals of {review.commit[:12]}: 1 counted, 2 required, 1 missing" in out
    assert "  approved by bob@example.com (SHA256:" in out
    main(
        [
            "plan",
            "--repo",
            str(review.bob_work),
            "--base",
            "HEAD~1",
            "--format",
            "json",
            "--allowed-signers",
            str(review.signers),
            "--require-approvals",
            "1",
        ]
    )
    record = json.loads(capsys.readouterr().out)
    assert record["approvals"]["missing"] == 0
    assert [a["principal"] for a in record["approvals"]["approvedBy"]] == ["bob@example.com"]


def test_an_approval_stops_counting_when_its_key_is_revoked(review: Review) -> None:
    # erin's key is valid until a moment the test's clock passes
    erin = make_key(review.root / "keys" / "erin").private
    review.signers.write_text(
        review.signers.read_text() + f'erin@example.com valid-before="20300101Z" {Key(erin).text}\n'
    )
    assert review.approve(erin, review.bob_work, review.commit, "--push") == 0
    now = [datetime(2029, 12, 31, 23, 0, tzinfo=UTC)]
    repo = pygit2.Repository(str(review.bare))
    approver = Approver(
        repo, load_allowed_signers(review.signers), required_approvals=1, clock=lambda: now[0]
    )
    assert approver.approve(review.commit).verified_commit == review.commit
    now[0] = datetime(2030, 1, 1, 0, 1, tzinfo=UTC)
    refused = approver.approve(review.commit)
    assert refused.verified_commit is None
    assert "erin@example.com's key was valid only until 2030-01-01" in refused.refusals[0].reason


def test_a_push_refused_by_a_hook_is_an_error_naming_it(
    review: Review, capsys: pytest.CaptureFixture[str]
) -> None:
    install_hook(review.bare, "pre-receive", "echo 'notes are closed' >&2\nexit 1\n")
    capsys.readouterr()
    assert review.approve(review.bob, review.bob_work, review.commit, "--push") == 1
    err = capsys.readouterr().err
    assert "notes are closed" in err and "git push failed" in err
    # the approval is kept locally, to push later
    assert read_note(pygit2.Repository(str(review.bob_work)), review.commit) is not None


def test_require_approvals_without_allowed_signers_is_a_usage_error(
    review: Review, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "run",
            "--once",
            "--repo",
            str(review.bare),
            "--key",
            str(review.bob),
            "--require-approvals",
            "1",
        ]
    )
    assert code == 2
    assert "--require-approvals needs --allowed-signers" in capsys.readouterr().err


def test_a_push_that_met_another_push_holding_the_notes_lock_is_tried_again() -> None:
    # What git prints when two first approvals create the notes ref at once
    # (seen with two `git push` into one bare repository): a race, not a
    # refusal; a hook's refusal stays final.
    lock_race = (
        " ! [remote rejected] refs/notes/reconciler-approvals -> "
        "refs/notes/reconciler-approvals (failed to update ref)"
    )
    hook = (
        " ! [remote rejected] refs/notes/reconciler-approvals -> "
        "refs/notes/reconciler-approvals (pre-receive hook declined)"
    )
    assert approval_notes._looks_rejected(lock_race)
    assert not approval_notes._looks_rejected(hook)


def test_approve_of_a_status_commit_approves_the_spec_commit_under_it_and_says_so(
    review: Review, capsys: pytest.CaptureFixture[str]
) -> None:
    # the daemon's status commits land on top of alice's spec commit
    status = review.root / "daemon-work"
    git("clone", "-q", str(review.bare), str(status), cwd=review.root)
    for n in (1, 2):
        (status / "status").mkdir(exist_ok=True)
        (status / "status" / "r.yaml").write_text(f"pass: {n}\n")
        git("add", "-A", cwd=status)
        git("commit", "-q", "-m", f"status: pass {n}", cwd=status)
    git("push", "-q", "origin", "HEAD:main", cwd=status)
    tip = git("rev-parse", "HEAD", cwd=status)
    git("fetch", "-q", "origin", cwd=review.bob_work)
    capsys.readouterr()

    assert review.approve(review.bob, review.bob_work, "origin/main") == 0

    out = capsys.readouterr().out
    assert f'origin/main is {tip[:12]} "status: pass 2"' in out
    assert "changes no rollout, node or reconciler.yaml (nor do the 1 before it)" in out
    assert f'approving the newest spec commit before it, {review.commit[:12]} "Roll out r"' in out
    assert f"approved {review.commit} with" in out
    repo = pygit2.Repository(str(review.bob_work))
    assert read_note(repo, review.commit) is not None
    assert read_note(repo, tip) is None


def test_approve_refuses_when_no_commit_changes_the_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    bob = make_key(keys / "bob").private
    bare = make_bare_repo(tmp_path, {"README.md": "fleet\n"})
    work = clone(bare, tmp_path / "work")

    assert main(["approve", "--key", str(bob), "--repo", str(work), "HEAD"]) == 1

    err = capsys.readouterr().err
    assert "no spec commit at or before HEAD" in err
    assert "change no rollout, node or reconciler.yaml" in err
    assert read_note(pygit2.Repository(str(work)), git("rev-parse", "HEAD", cwd=work)) is None
