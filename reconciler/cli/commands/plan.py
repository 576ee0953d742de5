"""``reconciler plan [--repo DIR] [--base REV] [--head REV] [--format
text|markdown|json]``: what merging HEAD (or --head) into the base would do,
computed by the engine (``reconciler.views.plan``). Exit 1 when head has invalid
documents.

Reads committed trees with pygit2 (no checkout, working tree edits do not
count); the statuses come from base's ``status/``, or from the status
branch when ``reconciler.yaml`` names one.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

import pygit2

from reconciler.cli.commands.status import Branch, RepoReader, read_statuses
from reconciler.git.store import discover_repository
from reconciler.spec import documents
from reconciler.spec.errors import ReconcilerError
from reconciler.spec.rollout_status import RolloutStatus
from reconciler.views import plan

HELP = "show what merging a change would do: new rollouts, intents, refused changes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--repo", metavar="DIR", default=".", help="the fleet repository (default: .)"
    )
    parser.add_argument(
        "--base",
        metavar="REV",
        help="what the change merges into (default: the merge-base of HEAD and main)",
    )
    parser.add_argument("--head", metavar="REV", default="HEAD", help="the change (default HEAD)")
    parser.add_argument("--format", choices=("text", "markdown", "json"), default="text")


def run(args: argparse.Namespace) -> int:
    repo = open_repository(args.repo)
    head = resolve(repo, args.head)
    base = resolve(repo, args.base) if args.base else default_base(repo, head)
    base_tree = plan.Tree(str(base.id), document_files(repo, base))
    head_tree = plan.Tree(str(head.id), document_files(repo, head))
    statuses = base_statuses(repo, base, args.repo)
    result = plan.make_plan(
        base_tree,
        head_tree,
        statuses,
        now=datetime.now(UTC).replace(microsecond=0),
        author=f"{head.author.name} <{head.author.email}>",
    )
    render = {
        "text": plan.render_text,
        "markdown": plan.render_markdown,
        "json": plan.render_json,
    }[args.format]
    sys.stdout.write(render(result))
    return 0 if result.ok else 1


def open_repository(location: str) -> pygit2.Repository:
    return discover_repository(location, "pass --repo with a fleet repository")


def resolve(repo: pygit2.Repository, rev: str) -> pygit2.Commit:
    try:
        commit = repo.revparse_single(rev).peel(pygit2.Commit)
    except (KeyError, ValueError, pygit2.GitError, pygit2.InvalidSpecError) as exc:
        raise ReconcilerError(
            f"no commit {rev!r} in {repo.workdir or repo.path}",
            hint="pass a branch, tag or commit id (for a pull request: --base origin/main)",
        ) from exc
    assert isinstance(commit, pygit2.Commit)
    return commit


def default_base(repo: pygit2.Repository, head: pygit2.Commit) -> pygit2.Commit:
    """The merge-base of head and main (local, else origin's)."""
    for name in ("refs/heads/main", "refs/remotes/origin/main"):
        ref = repo.references.get(name)
        if ref is None:
            continue
        main = ref.peel(pygit2.Commit)
        base_id = repo.merge_base(head.id, main.id)
        found = repo[base_id] if base_id is not None else main
        assert isinstance(found, pygit2.Commit)
        return found
    raise ReconcilerError(
        "no main branch to compare with", hint="pass --base REV, e.g. --base origin/main"
    )


def document_files(repo: pygit2.Repository, commit: pygit2.Commit) -> dict[str, bytes]:
    """Every file of the commit the documents loader reads (settings,
    nodes/, rollouts/, stray top-level YAML), by path."""
    files: dict[str, bytes] = {}
    pending: list[tuple[str, pygit2.Tree]] = [("", commit.tree)]
    while pending:
        prefix, tree = pending.pop()
        for entry in tree:
            path = f"{prefix}{entry.name}"
            if entry.type_str == "tree":
                if path.split("/")[0] in (documents.NODES_DIR, documents.ROLLOUTS_DIR):
                    sub = repo[entry.id]
                    assert isinstance(sub, pygit2.Tree)
                    pending.append((path + "/", sub))
            elif entry.type_str == "blob" and documents.is_document_path(path):
                blob = repo[entry.id]
                assert isinstance(blob, pygit2.Blob)
                files[path] = bytes(blob.data)
    return files


def base_statuses(
    repo: pygit2.Repository, base: pygit2.Commit, location: str
) -> dict[str, RolloutStatus]:
    source = Branch(RepoReader(repo, location), "", location)
    commit = str(base.id)
    settings = documents.parse_file(
        documents.SETTINGS_PATH, source.read(commit, documents.SETTINGS_PATH) or b""
    ).settings
    other = settings.status_branch if settings is not None else None
    if other:
        tip = None
        for name in (f"refs/heads/{other}", f"refs/remotes/origin/{other}"):
            ref = repo.references.get(name)
            if ref is not None:
                tip = str(ref.peel(pygit2.Commit).id)
                break
        if tip is None:
            print(
                f"warning: status branch {other!r} not found: planning as if nothing had "
                "a status yet",
                file=sys.stderr,
            )
            return {}
        commit = tip
    snapshot = read_statuses(source, commit)
    for problem in snapshot.problems:
        print(f"warning: {problem}", file=sys.stderr)
    return snapshot.statuses
