"""Shell completion of rollout and node names (``reconciler completion``).

The names come from the fleet repository the verb being completed would
use: its ``--repo`` as typed so far, else ``RECONCILER_REPO``, else the
current directory. A working tree offers the stems of ``rollouts/*.yaml``
and ``nodes/*.yaml``; a local bare repository offers those of its
``--branch`` (default ``main``). A remote URL offers nothing: completing a
word never reaches the network. Any failure offers nothing, never an error:
the shell is waiting on every keystroke.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reconciler.cli.remote_options import repo_default
from reconciler.git.git_binary import run_git
from reconciler.spec.errors import ReconcilerError
from reconciler.spec.paths import NODES_DIR, ROLLOUTS_DIR

Completer = Callable[..., list[str]]


def names_in(parsed_args: argparse.Namespace, folder: str) -> list[str]:
    """The document names under ``folder`` of the repository the verb uses."""
    location = getattr(parsed_args, "repo", None) or repo_default() or "."
    root = Path(location).expanduser()
    try:
        if (root / folder).is_dir():
            return sorted(p.stem for p in (root / folder).glob("*.yaml") if p.is_file())
        if (root / "HEAD").is_file() and (root / "objects").is_dir():
            branch = getattr(parsed_args, "branch", None) or "main"
            listed = run_git(root, "ls-tree", "--name-only", branch, "--", f"{folder}/")
            return sorted(Path(line).stem for line in listed.splitlines() if line.endswith(".yaml"))
    except (OSError, ReconcilerError):
        pass
    return []


def rollout_names(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    return [name for name in names_in(parsed_args, ROLLOUTS_DIR) if name.startswith(prefix)]


def node_names(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """Node names, leaving out those already on the line (``skip NAME A B``)."""
    given = set(getattr(parsed_args, "nodes", None) or ())
    return [
        name
        for name in names_in(parsed_args, NODES_DIR)
        if name.startswith(prefix) and name not in given
    ]


def node_list(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """The comma-separated ``--nodes A,B``: the names typed so far, then each
    node name not among them that starts as the last one does."""
    *done, last = prefix.split(",")
    head = "".join(f"{name}," for name in done)
    return [
        head + name
        for name in names_in(parsed_args, NODES_DIR)
        if name.startswith(last) and name not in done
    ]


def complete_with(action: argparse.Action, completer: Completer) -> argparse.Action:
    """Attach ``completer`` where argcomplete looks for it."""
    action.completer = completer  # type: ignore[attr-defined]
    return action
