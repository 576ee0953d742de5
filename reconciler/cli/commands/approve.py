"""``reconciler approve [REV] --key FILE [--repo DIR] [--push] [-o FORMAT]``: sign a
reviewer's yes to a commit into the repository (docs/trust.md).

Signs ``reconciler-approval v1\\ncommit <full id>\\n`` with the reviewer's
OpenSSH Ed25519 key (SSHSIG, namespace ``reconciler-approval``, as
``ssh-keygen -Y sign -n reconciler-approval`` would) and appends it to the
commit's note under ``refs/notes/reconciler-approvals``; ``--push`` pushes
that ref, merging approvals others pushed meanwhile. REV is resolved to the
newest spec commit at or before it by first parent (``origin/main`` is often
the daemon's status commit, which no approval is about), and the report says
when that is another commit than REV names. Notes and signatures
are ``git.approval_notes``; this module only reads arguments and reports.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reconciler.cli.output_format import add_format_argument, structured
from reconciler.cli.remote_options import add_repo_argument, local_repo

HELP = "approve a commit: sign it into refs/notes/reconciler-approvals (a reviewer's yes)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rev", nargs="?", default="HEAD", metavar="REV", help="default HEAD")
    parser.add_argument(
        "--key",
        required=True,
        type=Path,
        metavar="FILE",
        help="the reviewer's OpenSSH Ed25519 private key",
    )
    add_repo_argument(parser, "a clone (or bare copy) of the fleet repository")
    parser.add_argument(
        "--push", action="store_true", help="push the approvals ref, merging others' approvals"
    )
    parser.add_argument("--remote", default="origin", help="where --push goes (default origin)")
    add_format_argument(
        parser,
        ("text", "json", "yaml"),
        "text: what was done, in words (default); json or yaml: the same as one record",
    )


def run(args: argparse.Namespace) -> int:
    from reconciler.git.approval_notes import (
        NAMESPACE,
        NOTES_REF,
        append_approval,
        approval_message,
        identity,
        push_approvals,
    )
    from reconciler.git.revisions import describe_commit, newest_spec_commit, open_repository
    from reconciler.git.sshsig import sign_sshsig
    from reconciler.protocol.signing import load_private_key

    where = local_repo(args.repo, "approve", "writes the approval into a local repository's notes")
    repo = open_repository(where, "pass --repo with a clone of the fleet repository")
    found, passed = newest_spec_commit(repo, args.rev)
    commit = str(found.id)
    lines: list[str] = []
    if passed:
        lines.append(
            f"{args.rev} is {describe_commit(repo, str(passed[0].id))}, which changes no "
            "rollout, node or reconciler.yaml"
            + (f" (nor do the {len(passed) - 1} before it)" if len(passed) > 1 else "")
            + f": approving the newest spec commit before it, {describe_commit(repo, commit)}"
        )
    key = load_private_key(args.key)
    armored = sign_sshsig(key.private_key, approval_message(commit), NAMESPACE)
    who = identity(repo)
    added = append_approval(repo, commit, armored, who)
    what = "approved" if added else "already approved by this key:"
    lines.append(f"{what} {commit} with {key.key_id} ({NOTES_REF})")
    merges: int | None = None
    if args.push:
        workdir = Path(repo.workdir or repo.path)
        merges = push_approvals(repo, workdir, args.remote, who)
        merged = f", merged with {merges} approval push(es) by others" if merges else ""
        lines.append(f"pushed {NOTES_REF} to {args.remote}{merged}")
    else:
        lines.append(f"next: git push {args.remote} {NOTES_REF} (or run again with --push)")
    if args.format == "text":
        print("\n".join(lines))
        return 0
    record = {
        "rev": args.rev,
        "commit": commit,
        "passedOver": [str(c.id) for c in passed],
        "keyId": key.key_id,
        "added": added,
        "notesRef": NOTES_REF,
        "pushed": None if merges is None else {"remote": args.remote, "mergedPushes": merges},
    }
    sys.stdout.write(structured(json.dumps(record, indent=2) + "\n", args.format))
    return 0
