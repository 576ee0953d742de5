"""``reconciler backups NODE [--repo PATH_OR_URL] [--branch main]``: the
backups a node's agent keeps, newest first, read from the agent itself.

The agent's address comes from ``nodes/NODE.yaml`` in the branch's
committed tree (as the daemon sees it). Reading backups needs no key, so
this is a plain GET with httpx rather than the daemon's signing
``AgentClient``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import httpx

from reconciler import documents
from reconciler.commands import add_remote_arguments
from reconciler.commands.status import open_branch
from reconciler.errors import AgentError, ReconcilerError, StoreError
from reconciler.observations import Backup

HELP = "list a node's backups (newest first), from its agent"

TIMEOUT = 10.0
_FIELDS = ("backupId", "runtime", "createdAt", "jobId", "rollout", "provider", "model")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node", metavar="NODE", help="the node (nodes/NODE.yaml)")
    parser.add_argument(
        "--repo",
        metavar="PATH_OR_URL",
        default=".",
        help="a working clone, a bare repository or a remote URL (default: .)",
    )
    parser.add_argument("--branch", default="main", help="the branch the daemon tracks")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    add_remote_arguments(parser)


def run(args: argparse.Namespace) -> int:
    agent = agent_address(
        args.repo, args.branch, args.node, ssh_key=args.ssh_key, known_hosts=args.known_hosts
    )
    backups = fetch_backups(agent, args.node)
    if args.format == "json":
        records = [{k: getattr(b, _attr(k)) for k in _FIELDS} for b in backups]
        sys.stdout.write(json.dumps(records, indent=2) + "\n")
    else:
        sys.stdout.write(render_table(backups, args.node, agent))
    return 0


def agent_address(
    location: str,
    branch: str,
    node: str,
    *,
    ssh_key: Path | None = None,
    known_hosts: Path | None = None,
) -> str:
    """``spec.agent`` of ``nodes/NODE.yaml`` on the branch."""
    source = open_branch(location, branch, ssh_key=ssh_key, known_hosts=known_hosts)
    tip = source.refresh()
    if tip is None:
        raise StoreError(f"branch {branch!r} not found in {source.label}")
    path = f"{documents.NODES_DIR}/{node}.yaml"
    data = source.read(tip, path)
    if data is None:
        known = sorted(
            p.removeprefix("nodes/").removesuffix(".yaml")
            for p in source.reader.files(tip, documents.NODES_DIR)
            if p.endswith(".yaml")
        )
        raise ReconcilerError(
            f"no node named {node!r} on {branch}: {path} does not exist",
            hint=f"nodes: {', '.join(known) or 'none'}",
        )
    parsed = documents.parse_file(path, data)
    if parsed.node is None:
        problems = "; ".join(str(p) for p in parsed.problems) or "not a valid node"
        raise ReconcilerError(f"{path} on {branch} is invalid: {problems}")
    return parsed.node.agent


def fetch_backups(agent: str, node: str) -> list[Backup]:
    url = f"{agent.rstrip('/')}/v1/nodes/{node}/backups"
    try:
        answer = httpx.get(url, timeout=TIMEOUT, headers={"User-Agent": "reconciler-cli"})
    except httpx.HTTPError as exc:
        raise AgentError(
            f"cannot reach the agent of {node} at {agent}: {exc}",
            hint="is the agent running and reachable from here?",
        ) from exc
    if answer.status_code != 200:
        raise AgentError(
            f"the agent of {node} at {agent} answered {answer.status_code}: {_error_text(answer)}",
            hint="check that spec.agent of the node file points at this node's agent",
        )
    try:
        data = answer.json()
        backups = [Backup(**{_attr(k): str(item[k]) for k in _FIELDS}) for item in data]
    except (ValueError, TypeError, KeyError) as exc:
        raise AgentError(
            f"the agent of {node} at {agent} sent a backup list we cannot read"
        ) from exc
    # Newest first, as the agent promises; sorting keeps that true for any agent.
    return sorted(backups, key=lambda b: b.created_at, reverse=True)


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


def _attr(field: str) -> str:
    return {"backupId": "backup_id", "createdAt": "created_at", "jobId": "job_id"}.get(field, field)


def _error_text(answer: httpx.Response) -> str:
    try:
        body: Any = answer.json()
    except ValueError:
        return answer.text[:200]
    if isinstance(body, dict) and "error" in body:
        return f"{body.get('error')}: {body.get('message', '')}"
    return str(body)[:200]
