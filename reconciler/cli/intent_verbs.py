"""What the intent verbs (``pause``, ``resume``, ``abort``, ``rollback``)
share: their common options, and writing, committing and reporting an edit."""

from __future__ import annotations

import argparse
from pathlib import Path

from reconciler.cli import intent_edits


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
