"""``reconciler rollback NAME (--nodes A,B | --all)``: write a
``rollbackRequest`` with a fresh id into the rollout file, keeping its
comments and layout; optionally commit it."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from reconciler.cli import intent_edits
from reconciler.cli.intent_verbs import add_common_arguments, finish, prepare
from reconciler.spec.errors import UsageError

HELP = "ask the daemon to restore nodes from this rollout's backups (live rollouts only)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the rollout (rollouts/NAME.yaml)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--nodes", metavar="A,B", help="comma-separated node names of this rollout")
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
