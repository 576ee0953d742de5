"""``reconciler pause|resume|abort NAME``: edit the rollout file in a working
tree, keeping its comments and layout; optionally commit the edit."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from reconciler.cli import intent_edits
from reconciler.cli.completers import complete_with, rollout_names
from reconciler.cli.intent_verbs import add_common_arguments, finish, prepare
from reconciler.spec.errors import UsageError

HELP = "pause, resume or abort a rollout by editing its file (then commit and push)"

HELP_BY_VERB = {
    "pause": "set spec.paused: true: nothing new is decided until a resume",
    "resume": "lift the pause and answer the current hold with a fresh resumeRequest",
    "abort": "set spec.abort: true: the rollout ends for good",
}


def add_arguments_for(verb: str, parser: argparse.ArgumentParser) -> None:
    parser.description = HELP_BY_VERB.get(verb, HELP)
    complete_with(
        parser.add_argument("name", metavar="NAME", help="the rollout (rollouts/NAME.yaml)"),
        rollout_names,
    )
    add_common_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_arguments_for("pause", parser)


def run(args: argparse.Namespace) -> int:
    root, up = prepare(args)
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
    return finish(edit, args.message, args.commit, up)
