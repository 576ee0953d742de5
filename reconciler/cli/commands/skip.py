"""``reconciler skip NAME NODE [NODE ...]``: give up on nodes of a rollout
by adding them to ``spec.skipNodes`` in its file, keeping comments and
layout; optionally commit (and push) the edit."""

from __future__ import annotations

import argparse

from reconciler.cli import intent_edits
from reconciler.cli.completers import complete_with, node_names, rollout_names
from reconciler.cli.intent_verbs import add_common_arguments, finish, prepare

HELP = "give up on nodes of a rollout: add them to spec.skipNodes (they become skipped)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    complete_with(
        parser.add_argument("name", metavar="NAME", help="the rollout (rollouts/NAME.yaml)"),
        rollout_names,
    )
    complete_with(
        parser.add_argument("nodes", metavar="NODE", nargs="+", help="nodes of that rollout"),
        node_names,
    )
    add_common_arguments(parser)


def run(args: argparse.Namespace) -> int:
    root, up = prepare(args)
    edit = intent_edits.skip(root, args.name, args.nodes)
    return finish(edit, args.message, args.commit, up)
