"""The flags that every verb reaching a remote shares (docs/cli.md,
"SSH remotes"), kept apart from the verbs so that no verb imports another."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_remote_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ssh-key`` and ``--known-hosts``, the same on every verb that reads
    or writes a remote. There is deliberately no flag that accepts any key."""
    parser.add_argument(
        "--ssh-key",
        type=Path,
        metavar="FILE",
        help="SSH private key for a remote (or RECONCILER_SSH_KEY; default: the SSH agent)",
    )
    parser.add_argument(
        "--known-hosts",
        type=Path,
        metavar="FILE",
        help="the SSH server's host key must match an entry here (default ~/.ssh/known_hosts)",
    )


def add_branch_source_arguments(parser: argparse.ArgumentParser) -> None:
    """``--repo``, ``--branch`` and the remote flags of the verbs that read
    what the daemon committed (``status``, ``fleet``, ``backups``)."""
    parser.add_argument(
        "--repo",
        metavar="PATH_OR_URL",
        default=".",
        help="a bare repository, a working clone or a remote URL (default: .)",
    )
    parser.add_argument("--branch", default="main", help="the branch the daemon tracks")
    add_remote_arguments(parser)
