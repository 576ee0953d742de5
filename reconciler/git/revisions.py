"""Revisions a person names on the command line (``HEAD``, ``origin/main``,
a commit id, a branch), resolved to commits of a local repository, with
errors that say what to pass instead."""

from __future__ import annotations

from pathlib import Path

import pygit2

from reconciler.git.store import discover_repository
from reconciler.spec.errors import ReconcilerError, StoreError, UsageError

_LOOKUP_ERRORS = (KeyError, ValueError, pygit2.GitError, pygit2.InvalidSpecError)


def open_repository(location: str, hint: str) -> pygit2.Repository:
    """The repository at or above ``location``; ``hint`` says what to pass instead."""
    return discover_repository(location, hint)


def open_local_repository(where: str) -> pygit2.Repository:
    """A local repository, for ``verify``: a URL or a missing repository is a
    usage error (exit 2), since exit 1 means "refused"."""
    if "://" in where or where.startswith("git@"):
        raise UsageError(
            f"verify reads a local repository, not {where}",
            "clone or fetch it and pass the local path with --repo",
        )
    try:
        return discover_repository(where, "pass the fleet repository with --repo")
    except StoreError as exc:
        raise UsageError(exc.message, exc.hint) from None


def upstream_locations(repo: pygit2.Repository) -> tuple[str, ...]:
    """Where a clone came from: its remotes' URLs, ``origin`` first, a local
    path made absolute against the clone as git reads it, so that it names
    the repository a daemon on this machine may serve."""
    base = Path(repo.workdir or repo.path)
    remotes = sorted(repo.remotes, key=lambda r: r.name != "origin")
    found: list[str] = []
    for remote in remotes:
        url = remote.url or ""
        if url.startswith("file://"):
            url = url[len("file://") :]
        if url and "://" not in url and ":" not in url.split("/")[0]:
            url = str((base / url).resolve())
        if url:
            found.append(url)
    return tuple(found)


def commit_of(repo: pygit2.Repository, rev: str) -> pygit2.Commit | None:
    """The one revision resolver: the commit ``rev`` (a branch, tag, commit
    id, ``HEAD``, ``origin/main``, a full ref) names, or None."""
    try:
        commit = repo.revparse_single(rev).peel(pygit2.Commit)
    except _LOOKUP_ERRORS:
        return None
    return commit if isinstance(commit, pygit2.Commit) else None


def first_branch_tip(repo: pygit2.Repository, refs: tuple[str, ...]) -> str | None:
    """The commit of the first of ``refs`` that exists."""
    for name in refs:
        ref = repo.references.get(name)
        if ref is not None:
            return str(ref.peel(pygit2.Commit).id)
    return None


def resolve(repo: pygit2.Repository, rev: str) -> pygit2.Commit:
    """The commit ``rev`` names, for ``plan``."""
    commit = commit_of(repo, rev)
    if commit is None:
        raise ReconcilerError(
            f"no commit {rev!r} in {repo.workdir or repo.path}",
            hint="pass a branch, tag or commit id (for a pull request: --base origin/main)",
        )
    return commit


def resolve_or_branch_tip(repo: pygit2.Repository, rev: str | None, branch: str) -> tuple[str, str]:
    """(label, commit id) of ``rev``, or of ``branch``'s tip when no ``rev``,
    for ``verify``; an unknown one is a usage error."""
    commit = commit_of(repo, rev if rev is not None else f"refs/heads/{branch}")
    if commit is None:
        if rev is None:
            raise UsageError(
                f"branch {branch} does not exist in {repo.path}", "pass --branch or a REV"
            )
        raise UsageError(f"{rev} is not a commit in {repo.path}", "pass a commit or ref")
    return (rev if rev is not None else branch), str(commit.id)


def newest_spec_commit(
    repo: pygit2.Repository, rev: str, limit: int = 10_000
) -> tuple[pygit2.Commit, list[pygit2.Commit]]:
    """The newest commit at or before ``rev``, by first parent, that changes
    the spec (rollouts/, nodes/ or reconciler.yaml, as the daemon judges a
    spec commit), and the newer commits passed over on the way (the daemon's
    status commits, say); ``approve`` signs that one. Refused when there is
    none within ``limit`` commits."""
    from reconciler.git.approval import is_spec_commit

    commit: pygit2.Commit | None = resolve(repo, rev)
    passed: list[pygit2.Commit] = []
    while commit is not None and len(passed) < limit:
        if is_spec_commit(repo, commit):
            return commit, passed
        passed.append(commit)
        commit = commit.parents[0] if commit.parent_ids else None
    raise ReconcilerError(
        f"no spec commit at or before {rev}: "
        + (
            f"the {len(passed)} commit(s) from {str(passed[0].id)[:12]} back change no "
            "rollout, node or reconciler.yaml"
            if passed
            else "nothing to approve"
        ),
        hint="approve the commit that changes rollouts/, nodes/ or reconciler.yaml "
        "(git log --first-parent -- rollouts nodes reconciler.yaml)",
    )


def upstream_tip(repo: pygit2.Repository) -> str | None:
    """The commit of the checked-out branch's upstream (``origin/main`` for a
    ``main`` that tracks it), or None: detached, bare, or no upstream."""
    if repo.is_bare or repo.head_is_unborn or repo.head_is_detached:
        return None
    try:
        branch = repo.branches.local.get(repo.head.shorthand)
        upstream = branch.upstream if branch is not None else None
    except (KeyError, ValueError, pygit2.GitError):
        return None
    return str(upstream.peel(pygit2.Commit).id) if upstream is not None else None


def default_base(repo: pygit2.Repository, head: pygit2.Commit) -> pygit2.Commit:
    """The merge-base of head and the current branch's upstream when it has
    one (so unpushed commits on ``main`` are the change), else of head and
    main (local, else origin's)."""
    main_id = upstream_tip(repo) or first_branch_tip(
        repo, ("refs/heads/main", "refs/remotes/origin/main")
    )
    if main_id is not None:
        main = repo[main_id]
        base_id = repo.merge_base(head.id, main.id)
        found = repo[base_id] if base_id is not None else main
        assert isinstance(found, pygit2.Commit)
        return found
    raise ReconcilerError(
        "no main branch to compare with", hint="pass --base REV, e.g. --base origin/main"
    )


def describe_commit(repo: pygit2.Repository, commit_id: str, short: int = 12) -> str:
    """``<id> "<summary>" by <name> <email>``, one line for a person."""
    commit = repo[commit_id].peel(pygit2.Commit)
    summary = commit.message.split("\n", 1)[0].strip()
    return f'{commit_id[:short]} "{summary}" by {commit.author.name} <{commit.author.email}>'
