"""``reconciler pause|resume|abort NAME``: edit the rollout file in a working
tree, keeping its comments and layout; optionally commit the edit."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

from reconciler.cli import intent_edits
from reconciler.spec.errors import UsageError

HELP = "pause, resume or abort a rollout by editing its file (then commit and push)"

HELP_BY_VERB = {
    "pause": "set spec.paused: true: nothing new is decided until a resume",
    "resume": "lift the pause and answer the current hold with a fresh resumeRequest",
    "abort": "set spec.abort: true: the rollout ends for good",
}


def add_arguments_for(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.description = HELP_BY_VERB.get(verb, HELP)
    parser.add_argument("name", metavar="NAME", help="the rollout (rollouts/NAME.yaml)")
    add_common_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_arguments_for("pause", parser)


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--repo",
        metavar="DIR",
        type=Path,
        default=Path("."),
        help="a working clone of the fleet repository (default: the current directory)",
    )
    parser.add_argument(
        "--message", "-m", default="", metavar="TEXT", help="why: goes into the commit message"
    )
    parser.add_argument(
        "--commit", action="store_true", help="commit the edited file (git author: you)"
    )


def run(args: argparse.Namespace) -> int:
    root = intent_edits.find_root(args.repo)
    if args.verb == "pause":
        edit = intent_edits.pause(root, args.name)
    elif args.verb == "abort":
        edit = intent_edits.abort(root, args.name)
    elif args.verb == "resume":
        who = intent_edits.operator_name(root)
        edit = intent_edits.resume(
            root, args.name, now=datetime.now(UTC), who=who, message=args.message
        )
    else:
        raise UsageError(f"unknown intent {args.verb!r}")
    return finish(edit, args.message, args.commit)


def finish(edit: intent_edits.Edit, message: str, commit: bool) -> int:
    """Write the edit, commit it if asked, and tell the person what happens next."""
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
        print(f"committed {commit_id[:12]}: {edit.verb} {edit.rollout.name}")
        print("next: push it (or open a pull request); the daemon acts on the merged branch")
    else:
        print(
            f"next: commit and push it, e.g. git commit -m '{edit.verb} {edit.rollout.name}: "
            f"WHY' -- {edit.rollout.relpath}"
        )
    return 0
