"""``reconciler backups NODE [--repo PATH_OR_URL] [--branch main]``: the
backups a node's agent keeps, newest first, read from the agent itself.

The agent's address and TLS pin come from ``nodes/NODE.yaml`` in the
branch's committed tree, or with ``--allowed-signers`` in the newest
verified commit's (as the daemon sees it). Reading backups needs no key, so
this is one plain GET (``agent_client.fetch_backups``) rather than the
daemon's signing ``AgentClient``.

Agents are often reachable only from the daemon's network, not from an
operator's laptop. When the agent cannot be reached, the error says so and
what to do instead, and the command lists what the committed status files
already record about the node's backups: the first backup each rollout
took, which is what a restore puts back.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reconciler.cli.completers import complete_with, node_names
from reconciler.cli.output_format import add_format_argument, structured
from reconciler.cli.remote_options import add_branch_source_arguments
from reconciler.daemon.agent_client import fetch_backups
from reconciler.git.approval import Approver, load_allowed_signers
from reconciler.git.branch import Branch, open_branch
from reconciler.protocol.observations import BACKUP_FIELDS, Backup
from reconciler.readers.status_reader import read_snapshot
from reconciler.spec import documents
from reconciler.spec.errors import AgentError, ReconcilerError, StoreError, UsageError
from reconciler.spec.model import Node
from reconciler.spec.paths import NODES_DIR, name_in, node_path

HELP = "list a node's backups (newest first), from its agent"

TIMEOUT = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    complete_with(
        parser.add_argument("node", metavar="NODE", help="the node (nodes/NODE.yaml)"),
        node_names,
    )
    add_branch_source_arguments(parser)
    add_format_argument(
        parser,
        ("text", "json", "yaml"),
        "text: a table (default); json or yaml: one object per backup",
    )
    parser.add_argument(
        "--allowed-signers",
        type=Path,
        metavar="FILE",
        help="as the daemon run with it: read the node file from the newest verified commit, "
        "not from whatever the tip holds",
    )
    parser.add_argument(
        "--require-approvals",
        type=int,
        default=0,
        metavar="N",
        help="with --allowed-signers, as the daemon run with it: a spec commit also needs N "
        "reviewers' approvals",
    )


def run(args: argparse.Namespace) -> int:
    source = open_branch(args.repo, args.branch, ssh_key=args.ssh_key, known_hosts=args.known_hosts)
    node = node_spec(source, args.branch, args.node, _verified(source, args))
    agent = node.agent
    try:
        backups = fetch_backups(agent, args.node, TIMEOUT, pin=node.agent_cert_sha256)
    except AgentError as error:
        if not error.message.startswith("cannot reach"):
            raise
        sys.stdout.write(recorded_backups(source, args.node))
        raise ReconcilerError(
            f"{error.message} (from this machine)",
            hint="agents are often reachable only from where the daemon runs: run "
            f"reconciler backups {args.node} there (for example over ssh), with the same "
            "--repo; the first backups the status files record are listed above",
        ) from None
    if args.format != "text":
        records = [{key: getattr(b, attr) for attr, key in BACKUP_FIELDS.items()} for b in backups]
        sys.stdout.write(structured(json.dumps(records, indent=2) + "\n", args.format))
    else:
        sys.stdout.write(render_table(backups, args.node, agent))
    return 0


def _verified(source: Branch, args: argparse.Namespace) -> Approver | None:
    if args.allowed_signers is None:
        return None
    if args.require_approvals < 0:
        raise UsageError("--require-approvals must be 0 or more")
    signers = load_allowed_signers(args.allowed_signers)
    return Approver(source.reader.repository(), signers, required_approvals=args.require_approvals)


def node_spec(source: Branch, branch: str, node: str, approver: Approver | None = None) -> Node:
    """``nodes/NODE.yaml`` on the branch, as a value: with ``approver``, as
    the newest verified commit has it (an unsigned push can point an agent
    address elsewhere, as it cannot for the daemon)."""
    tip = source.refresh()
    if tip is None:
        raise StoreError(f"branch {branch!r} not found in {source.label}")
    if approver is not None:
        verified = approver.approve(tip).verified_commit
        if verified is None:
            raise ReconcilerError(
                f"no commit of {branch} verifies under --allowed-signers",
                hint="push a signed commit that changes a spec path, or check the file",
            )
        tip = verified
    path = node_path(node)
    data = source.read(tip, path)
    if data is None:
        known = sorted(
            name for p in source.reader.files(tip, NODES_DIR) if (name := name_in(NODES_DIR, p))
        )
        raise ReconcilerError(
            f"no node named {node!r} on {branch}: {path} does not exist",
            hint=f"nodes: {', '.join(known) or 'none'}",
        )
    parsed = documents.parse_file(path, data)
    if parsed.node is None:
        problems = "; ".join(str(p) for p in parsed.problems) or "not a valid node"
        raise ReconcilerError(f"{path} on {branch} is invalid: {problems}")
    return parsed.node


def recorded_backups(source: Branch, node: str) -> str:
    """What the committed status files say about ``node``'s backups: per
    rollout, the first backup (what a restore puts back) and the latest."""
    try:
        snapshot = read_snapshot(source)
    except ReconcilerError:
        return ""
    rows = []
    for name, status in sorted(snapshot.statuses.items()):
        for record in status.nodes:
            if record.name == node and (record.first_backup_id or record.backup_id):
                rows.append(
                    (name, record.first_backup_id or "-", record.backup_id or "-", record.state)
                )
    if not rows:
        return f"{node}: the status files record no backup of it\n"
    header = ("ROLLOUT", "FIRST BACKUP", "LATEST BACKUP", "STATE")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    return (
        f"{node}: backups recorded in the status files (the first is what a restore puts back)\n"
        + "\n".join(lines)
        + "\n"
    )


def render_table(backups: list[Backup], node: str, agent: str) -> str:
    if not backups:
        return f"{node} ({agent}) keeps no backups\n"
    rows = [
        (b.backup_id, b.runtime, b.created_at, b.job_id, b.rollout, f"{b.provider}/{b.model}")
        for b in backups
    ]
    header = ("BACKUP", "RUNTIME", "CREATED", "JOB", "ROLLOUT", "PROVIDER/MODEL")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    count = f"{len(backups)} backup{'s' if len(backups) != 1 else ''}"
    return f"{node} ({agent}): {count}, newest first\n" + "\n".join(lines) + "\n"
