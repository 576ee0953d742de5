"""What the intent verbs (``pause``, ``resume``, ``abort``, ``rollback``,
``skip``, and ``freeze``/``unfreeze`` for ``reconciler.yaml``) share: their common options, and writing, committing, pushing and reporting
an edit."""

from __future__ import annotations

import argparse
from pathlib import Path

from reconciler.cli import intent_edits, intent_push
from reconciler.cli.remote_options import add_remote_arguments, add_repo_argument, local_repo


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    add_repo_argument(parser, "a working clone of the fleet repository: the edit is made there")
    parser.add_argument(
        "--message", "-m", default="", metavar="TEXT", help="why: goes into the commit message"
    )
    parser.add_argument(
        "--commit", action="store_true", help="commit the edited file (git author: you)"
    )
    parser.add_argument(
        "--push",
        action="store_true",
        help="fetch first, commit and push to the branch this clone tracks; when the "
        "daemon (or anyone) pushed in between, replay the commit on the new tip and push "
        f"again, up to {intent_push.PUSH_TRIES} times. The edit touches only the rollout "
        "file, which the daemon never writes, so the replay cannot conflict with it",
    )
    add_remote_arguments(parser)


def prepare(
    args: argparse.Namespace, what: str = "a rollout file"
) -> tuple[Path, intent_push.Upstream | None]:
    """The clone's root, brought up to date first with ``--push`` so the
    edit is made against the newest status (``what``: the file it edits)."""
    verb = args.verb or "this verb"
    where = local_repo(args.repo, verb, f"edits {what} in a working clone")
    root = intent_edits.find_root(Path(where))
    if not args.push:
        return root, None
    up = intent_push.upstream(root, args.ssh_key, args.known_hosts)
    intent_push.catch_up(root, up)
    return root, up


def finish(
    edit: intent_edits.Edit,
    message: str,
    commit: bool,
    up: intent_push.Upstream | None = None,
) -> int:
    """Write the edit, commit it (and push it, given ``up``) if asked, and
    tell the person what happens next."""
    commit = commit or up is not None
    for note in edit.notes:
        print(f"note: {note}")
    if not edit.changed:
        print(f"{edit.rollout.relpath}: nothing to change")
        return 0
    if commit:
        intent_edits.check_committable(edit)
    intent_edits.write_edit(edit)
    for change in edit.changes:
        print(f"{edit.rollout.relpath}: {change}")
    if commit:
        commit_id = intent_edits.commit_edit(edit, message)
        if up is not None:
            tries = intent_push.push(edit.rollout.root, up, edit.rollout.relpath)
            commit_id = intent_edits.run_git(edit.rollout.root, "rev-parse", "HEAD").strip()
            again = f" (after {tries - 1} replay{'s' if tries != 2 else ''})" if tries > 1 else ""
            print(
                f"pushed {commit_id[:12]} to {up.remote}/{up.branch}{again}: "
                f"{edit.verb} {edit.rollout.name}"
            )
            print("next: the daemon acts on it at its next pass")
            return 0
        print(f"committed {commit_id[:12]}: {edit.verb} {edit.rollout.name}")
        print("next: push it (or open a pull request); the daemon acts on the merged branch")
    else:
        print(
            f"next: commit and push it, e.g. git commit -m '{edit.verb} {edit.rollout.name}: "
            f"WHY' -- {edit.rollout.relpath}"
        )
    return 0
