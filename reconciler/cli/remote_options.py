"""The flags that every verb reaching a repository shares (docs/cli.md,
"SSH remotes"): ``--repo`` with its ``RECONCILER_REPO`` default, and the SSH
flags; kept apart from the verbs so that no verb imports another."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from reconciler.spec.errors import UsageError

REPO_ENV = "RECONCILER_REPO"


def repo_default() -> str | None:
    """What ``--repo`` means when it is not given: ``RECONCILER_REPO``, if set."""
    return os.environ.get(REPO_ENV) or None


def add_repo_argument(
    parser: argparse.ArgumentParser, help: str, *, optional: bool = False
) -> None:
    """``--repo PATH_OR_URL``, defaulting to ``RECONCILER_REPO`` and then to the
    current directory (to nothing with ``optional``; ``run`` requires one)."""
    default = repo_default() or (None if optional else ".")
    parser.add_argument(
        "--repo",
        metavar="PATH_OR_URL",
        default=default,
        help=f"{help} (default: ${REPO_ENV}, else " + ("none)" if optional else ".)"),
    )


def local_repo(location: str, verb: str, why: str) -> str:
    """``location``, refused with what to do instead when it is a remote URL
    and ``verb`` needs a local repository (``why`` says what for)."""
    from reconciler.git.store import is_remote_location

    if is_remote_location(location):
        raise UsageError(
            f"{verb} {why}, and {location} is a remote URL",
            f"clone it (git clone {location}) and pass the clone with --repo",
        )
    return location


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
    add_repo_argument(parser, "a bare repository, a working clone or a remote URL")
    parser.add_argument("--branch", default="main", help="the branch the daemon tracks")
    add_remote_arguments(parser)
