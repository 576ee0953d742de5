"""``reconciler rollback NAME (--nodes A,B | --all)``: write a
``rollbackRequest`` with a fresh id into the rollout file, keeping its
comments and layout; optionally commit it."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from reconciler.cli import intent_edits
from reconciler.cli.completers import complete_with, node_list, rollout_names
from reconciler.cli.intent_verbs import add_common_arguments, finish, prepare
from reconciler.spec.errors import UsageError

HELP = "ask the daemon to restore nodes from this rollout's backups (live rollouts only)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    complete_with(
        parser.add_argument("name", metavar="NAME", help="the rollout (rollouts/NAME.yaml)"),
        rollout_names,
    )
    which = parser.add_mutually_exclusive_group(required=True)
    complete_with(
        which.add_argument(
            "--nodes", metavar="A,B", help="comma-separated node names of this rollout"
        ),
        node_list,
    )
    which.add_argument("--all", action="store_true", help="every node this rollout changed")
    add_common_arguments(parser)


def run(args: argparse.Namespace) -> int:
    nodes: list[str] | None = None
    if not args.all:
        nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
        if not nodes:
            raise UsageError("--nodes needs at least one node name, e.g. --nodes gpu-a1,gpu-a2")
    root, up = prepare(args)
    edit = intent_edits.rollback(root, args.name, nodes, now=datetime.now(UTC))
    return finish(edit, args.message, args.commit, up)
