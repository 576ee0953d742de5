"""One module per verb (see ``reconciler.cli``), and the flags that every
verb reaching a remote shares (DESIGN.md section 9, "SSH remotes")."""

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
