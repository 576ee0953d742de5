"""``reconciler validate [DIR] [--format text|github]``: check every document
of a fleet repository's working tree, as the daemon would read it.

One line per problem, ``file:line:col: field: message``, or GitHub Actions
annotations with ``--format github``. Exit 0 when clean, 1 on any problem,
2 on usage errors. ``status/`` is the daemon's and is not checked.

Warnings (exit 0 all the same): a ``nodeIds`` entry in maintenance, which
the rollout leaves out; a selector that matches no node (a typo such as
``role: servng`` leaves the rollout pending for good).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from reconciler.cli.output_format import add_format_argument
from reconciler.engine.selection import maintenance_node_ids, select_nodes
from reconciler.spec import safe_yaml
from reconciler.spec.documents import Documents, load_directory
from reconciler.spec.errors import UsageError
from reconciler.spec.model import Problem
from reconciler.spec.paths import SETTINGS_PATH, rollout_path

HELP = "check every document in a fleet repository: file:line:col: field: message"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dir",
        nargs="?",
        default=".",
        metavar="DIR",
        help="the fleet repository's working tree (default: the current directory)",
    )
    add_format_argument(
        parser,
        ("text", "github"),
        "text: one line per problem; github: GitHub Actions error annotations",
    )
    parser.add_argument(
        "--allowed-signers",
        type=Path,
        metavar="FILE",
        help="also check that every principal of spec.approvalRules is in this "
        "allowed-signers file (the one the daemon runs with)",
    )


def _escape_data(text: str) -> str:
    # GitHub's workflow-command escaping for the message part
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotation(problem: Problem, prefix: str = "", level: str = "error") -> str:
    """``::error file=...,line=...,col=...,title=...::message``; ``prefix`` is
    the path of the fleet repository inside the checked-out repository."""
    props = [f"file={_escape_property(prefix + problem.path)}"]
    if problem.line:
        props.append(f"line={problem.line}")
        props.append(f"col={problem.column}")
    title = problem.field or "document"
    props.append(f"title={_escape_property(title)}")
    message = f"{problem.field}: {problem.message}" if problem.field else problem.message
    return f"::{level} {','.join(props)}::{_escape_data(message)}"


def warnings(documents: Documents) -> list[Problem]:
    """What is valid but likely not meant: nodeIds entries left out because
    the node is in maintenance, selectors that match no node, and evals that
    run while the node already serves (no drain)."""
    found = []
    for name, spec in sorted(documents.rollouts.items()):
        if spec.selector is not None and not select_nodes(spec, documents.fleet):
            found.append(
                Problem(
                    rollout_path(name),
                    0,
                    0,
                    "spec.selector",
                    _matches_none(spec.selector, documents),
                )
            )
        for node in maintenance_node_ids(spec, documents.fleet):
            found.append(
                Problem(
                    rollout_path(name),
                    0,
                    0,
                    "spec.nodeIds",
                    f"warning: {node} is in maintenance and is left out; set "
                    "includeMaintenance: true to include it, or take it out of maintenance",
                )
            )
        if spec.evals and spec.drain is None:
            found.append(
                Problem(
                    rollout_path(name),
                    0,
                    0,
                    "spec.health.evals",
                    "warning: without drain the evals run while the node already takes "
                    "requests, so they cannot keep a failed model from users; declare drain",
                )
            )
    return found


def _matches_none(selector: tuple[tuple[str, str], ...], documents: Documents) -> str:
    """The warning for a selector no node meets, with the values each of its
    labels has in the fleet, so that a typo shows next to the right spelling."""
    wanted = ", ".join(f"{k}: {v}" for k, v in selector)
    hints = []
    for key, _ in selector:
        values = sorted({v for n in documents.fleet.nodes if (v := n.label(key)) is not None})
        hints.append(f"{key} is {', '.join(map(str, values))}" if values else f"no node has {key}")
    return (
        f"warning: the selector {{{wanted}}} matches no node, so the rollout stays pending "
        f"until one does (in nodes/: {'; '.join(hints)})"
    )


def _principals(path: Path) -> frozenset[str]:
    from reconciler.git.approval import load_allowed_signers
    from reconciler.spec.errors import ReconcilerError

    try:
        signers = load_allowed_signers(path)
    except ReconcilerError as exc:
        raise UsageError(exc.message, exc.hint) from None
    return frozenset(p for signer in signers for p in signer.principals)


def unknown_principals(
    root: Path, documents: Documents, known: frozenset[str]
) -> tuple[Problem, ...]:
    """A problem for every principal of an approval rule that the
    allowed-signers file does not list: nobody could ever approve for it."""
    found: list[Problem] = []
    data = b""
    for index, rule in enumerate(documents.settings.approval_rules):
        for at, principal in enumerate(rule.principals):
            if principal in known:
                continue
            data = data or (root / SETTINGS_PATH).read_bytes()
            where: list[str | int] = ["spec", "approvalRules", index, "principals", at]
            line, column = safe_yaml.locate(SETTINGS_PATH, data, where)
            found.append(
                Problem(
                    SETTINGS_PATH,
                    line,
                    column,
                    safe_yaml.format_field(where),
                    f"approval rule {rule.name!r}: {principal} is not in the allowed-signers "
                    "file, so no approval of theirs can count; add their key line there or "
                    "fix the spelling",
                )
            )
    return tuple(found)


def run(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    if not root.exists():
        raise UsageError(f"{root} does not exist", "give the fleet repository's directory")
    if not root.is_dir():
        raise UsageError(f"{root} is not a directory", "give the fleet repository's directory")
    warning = safe_yaml.loader_warning()
    if warning:
        print(warning, file=sys.stderr)
    documents = load_directory(root)
    if args.allowed_signers is not None:
        unknown = unknown_principals(root, documents, _principals(args.allowed_signers))
        documents = replace(documents, problems=(*documents.problems, *unknown))
    # Paths relative to where the command runs, so editors and GitHub find them.
    prefix = "" if root.resolve() == Path.cwd().resolve() else root.as_posix().rstrip("/") + "/"
    for notice in warnings(documents):
        if args.format == "github":
            print(github_annotation(notice, prefix, "warning"))
        else:
            print(replace(notice, path=prefix + notice.path), file=sys.stderr)
    for problem in documents.problems:
        if args.format == "github":
            print(github_annotation(problem, prefix))
        elif prefix:
            print(replace(problem, path=prefix + problem.path))
        else:
            print(problem)
    if documents.problems:
        count = len(documents.problems)
        files = len({p.path for p in documents.problems})
        print(
            f"{count} problem{'s' if count != 1 else ''} in {files} file{'s' if files != 1 else ''}",
            file=sys.stderr,
        )
        return 1
    rollouts = len(documents.rollouts)
    nodes = len(documents.fleet.nodes)
    # The result, like the problems, is the command's output: stdout.
    print(
        f"ok: {nodes} node{'s' if nodes != 1 else ''}, "
        f"{rollouts} rollout{'s' if rollouts != 1 else ''}"
    )
    return 0
