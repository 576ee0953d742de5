"""``reconciler verify``: would the daemon act on this commit, and why.

Prints the newest commit at or before REV that changed ``rollouts/``,
``nodes/`` or ``reconciler.yaml``, who signed it or why it is refused, and
when refused, the older commit the daemon falls back to. Exit 0 when the
daemon would act on REV's spec, 1 when it would not, 2 for a usage error
(bad arguments, unreadable allowed-signers file, unknown REV, no repository),
so that 1 always means "refused".

Reads a local repository (``git.revisions``); decides nothing itself (``approval``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from reconciler.git.approval import Approval, Approver, load_allowed_signers
from reconciler.git.revisions import describe_commit, open_local_repository, resolve_or_branch_tip
from reconciler.git.sshsig import AllowedSigner
from reconciler.spec.errors import ReconcilerError, UsageError

HELP = "tell whether a commit would be acted on under --allowed-signers, and why"

_SHORT = 12


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "rev", nargs="?", metavar="REV", help="commit to check (default: the branch tip)"
    )
    parser.add_argument(
        "--repo", default=".", metavar="PATH", help="fleet repository (default: current directory)"
    )
    parser.add_argument(
        "--branch", default="main", help="branch whose tip is checked when REV is omitted"
    )
    parser.add_argument(
        "--allowed-signers",
        required=True,
        metavar="FILE",
        help="git allowed-signers file (as for gpg.ssh.allowedSignersFile)",
    )


def run(args: argparse.Namespace) -> int:
    allowed = _allowed_signers(Path(args.allowed_signers))
    repo = open_local_repository(args.repo)
    label, tip = resolve_or_branch_tip(repo, args.rev, args.branch)
    approver = Approver(repo, allowed)
    approval = approver.approve(tip)
    print(describe(repo, approver, approval, label, tip))
    return 0 if approval.acted_on else 1


def _allowed_signers(path: Path) -> tuple[AllowedSigner, ...]:
    # 1 must mean "refused", so a bad file is a usage error here.
    try:
        return load_allowed_signers(path)
    except UsageError:
        raise
    except ReconcilerError as exc:
        raise UsageError(exc.message, exc.hint) from None


def describe(repo: Any, approver: Approver, approval: Approval, label: str, tip: str) -> str:
    """The report, in words: what is acted on and why (``repo``: pygit2's)."""
    head = f"{label} ({tip[:_SHORT]})"
    if approval.newest_spec_commit is None:
        return (
            f"{head}: would be acted on\n"
            "  no commit at or before it changes rollouts/, nodes/ or reconciler.yaml;"
            " nothing needs a signature"
        )
    lines: list[str] = []
    if approval.acted_on:
        verified = approval.newest_spec_commit
        lines.append(f"{head}: would be acted on")
        lines.append(f"  newest spec change: {_show_commit(repo, verified)}")
        lines.append(f"  {approver.check_commit(verified).reason}")
        return "\n".join(lines)
    newest, *older = approval.refusals
    lines.append(f"{head}: would NOT be acted on")
    lines.append(f"  newest spec change: {_show_commit(repo, newest.commit)}")
    lines.append(f"  refused: {newest.reason}")
    if older:
        lines.append("  older spec changes, also refused:")
        for refusal in older:
            lines.append(f"    {_show_commit(repo, refusal.commit)}")
            lines.append(f"      refused: {refusal.reason}")
    if approval.verified_commit is None:
        lines.append(
            "  the daemon falls back to: nothing; no spec change at or before it verifies,"
            " so it acts on no rollouts"
        )
        if repo.is_shallow:
            lines.append(
                "  note: this is a shallow clone, so older signed commits may be missing;"
                " `git fetch --unshallow` and check again"
            )
    else:
        lines.append(f"  the daemon falls back to: {_show_commit(repo, approval.verified_commit)}")
        lines.append(f"    {approver.check_commit(approval.verified_commit).reason}")
    lines.append(
        "  to approve: an allowed signer pushes a signed commit (`git commit -S`, `git merge -S`)"
        " that changes rollouts/, nodes/ or reconciler.yaml; its whole tree is what is approved"
    )
    return "\n".join(lines)


def _show_commit(repo: Any, commit_id: str) -> str:
    return describe_commit(repo, commit_id, _SHORT)
