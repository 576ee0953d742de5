"""Real Git repositories for tests, driven the way a person drives them:
the `git` binary, a clone, edit, commit, push.

Every `git` call runs with a fixed author/committer and without the user's
global or system config, so tests never depend on the machine they run on.
``OPERATOR`` is the person at the terminal (the ``identity`` fixture gives
in-process commands that identity); ``AUTHOR`` makes the commits a test
makes itself.

    bare = make_bare_repo(tmp_path, {"nodes/a.yaml": "..."})
    work = clone(bare, tmp_path / "work")
    sha = commit_and_push(work, {"rollouts/r.yaml": "...", "nodes/a.yaml": None}, "edit")
    repo = make_repo(tmp_path / "fleet", {"nodes/a.yaml": "..."})  # not bare
    git("log", "-1", "--format=%an", cwd=repo)
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

AUTHOR_NAME = "Ada Operator"
AUTHOR_EMAIL = "ada@example.com"
OPERATOR = ("Alice Operator", "alice@example.com")


def git_env(
    name: str = AUTHOR_NAME, email: str = AUTHOR_EMAIL, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """An environment for `git` that ignores global config and sets the identity."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GIT_") and k not in ("SSH_AUTH_SOCK",)
    }
    env.update(
        GIT_AUTHOR_NAME=name,
        GIT_AUTHOR_EMAIL=email,
        GIT_COMMITTER_NAME=name,
        GIT_COMMITTER_EMAIL=email,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
    )
    if extra:
        env.update(extra)
    return env


def git(
    *args: str,
    cwd: Path | str,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    input: str | None = None,
    strip: bool = True,
) -> str:
    """Run `git ARGS` in `cwd`; return stdout, stripped unless ``strip`` is
    False (a file's exact text). Raises with stderr on failure."""
    proc = subprocess.run(
        ["git", *args],
        cwd=cwd,
        env=dict(env) if env is not None else git_env(),
        capture_output=True,
        text=True,
        input=input,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"git {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}"
        )
    return proc.stdout.strip() if strip else proc.stdout


def write_files(root: Path, files: Mapping[str, str | bytes | None]) -> None:
    """Write (str or bytes) or delete (None) files below `root`."""
    for rel, content in files.items():
        path = root / rel
        if content is None:
            if path.exists():
                path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


def make_bare_repo(
    tmp_path: Path,
    files: Mapping[str, str | bytes] | None = None,
    *,
    branch: str = "main",
    name: str = "fleet.git",
    message: str = "Initial fleet",
) -> Path:
    """A bare repository at tmp_path/NAME whose `branch` holds one commit with
    `files` (a README when none are given). Returns its path."""
    bare = tmp_path / name
    git("init", "--bare", "--quiet", f"--initial-branch={branch}", str(bare), cwd=tmp_path)
    seed = tmp_path / f"{name}.seed"
    git("init", "--quiet", f"--initial-branch={branch}", str(seed), cwd=tmp_path)
    write_files(seed, files if files else {"README.md": "fleet\n"})
    git("add", "-A", cwd=seed)
    git("commit", "--quiet", "-m", message, cwd=seed)
    git("push", "--quiet", str(bare), f"{branch}:{branch}", cwd=seed)
    return bare


def make_repo(root: Path, files: Mapping[str, str | bytes | None], message: str = "fleet") -> Path:
    """A repository (with a working tree) at ``root`` on branch main, holding
    ``files`` in one commit."""
    root.mkdir(parents=True, exist_ok=True)
    git("init", "--quiet", "-b", "main", cwd=root)
    commit(root, files, message)
    return root


def clone(bare: Path | str, dest: Path, *, branch: str = "main") -> Path:
    """A working clone of `bare` at `dest`, on `branch`."""
    git("clone", "--quiet", "--branch", branch, str(bare), str(dest), cwd=Path(dest).parent)
    return dest


def commit(
    work: Path,
    files: Mapping[str, str | bytes | None],
    message: str,
    *,
    env: Mapping[str, str] | None = None,
    allow_empty: bool = False,
) -> str:
    """Write/delete `files` in the clone and commit them; returns the commit id."""
    write_files(work, files)
    git("add", "-A", cwd=work, env=env)
    args = ["commit", "--quiet", "-m", message]
    if allow_empty:
        args.append("--allow-empty")
    git(*args, cwd=work, env=env)
    return head(work)


def commit_and_push(
    work: Path,
    files: Mapping[str, str | bytes | None],
    message: str,
    *,
    branch: str = "main",
    pull: bool = True,
    env: Mapping[str, str] | None = None,
) -> str:
    """As a person does: (pull --rebase,) edit, commit, push. Returns the pushed commit id.

    With ``pull``, a push the remote refuses because the branch moved (a
    daemon's status commit landed between the pull and the push) is
    replayed on the new tip, as a person would; a push refused for any
    other reason fails."""
    if pull:
        git("pull", "--quiet", "--rebase", "origin", branch, cwd=work, env=env)
    sha = commit(work, files, message, env=env)
    for _ in range(PUSH_REPLAYS):
        pushed = subprocess.run(
            ["git", "push", "--quiet", "origin", f"HEAD:{branch}"],
            cwd=work,
            env=dict(env) if env is not None else git_env(),
            capture_output=True,
            text=True,
        )
        moved = "fetch first" in pushed.stderr or "non-fast-forward" in pushed.stderr
        if pushed.returncode == 0 or not (pull and moved):
            break
        git("pull", "--quiet", "--rebase", "origin", branch, cwd=work, env=env)
        sha = head(work)
    if pushed.returncode != 0:
        raise AssertionError(f"git push failed ({pushed.returncode}):\n{pushed.stderr}")
    return sha


PUSH_REPLAYS = 5  # a daemon commits at most a few times between a pull and a push


def head(work: Path | str, rev: str = "HEAD") -> str:
    """The commit id `rev` resolves to in the repository at `work` (bare or not)."""
    return git("rev-parse", rev, cwd=work)


def show(repo: Path | str, rev: str, path: str) -> str:
    """`git show REV:PATH` as text."""
    return git("show", f"{rev}:{path}", cwd=repo)


def ls_tree(repo: Path | str, rev: str) -> list[str]:
    """Every file path in the tree of `rev`, sorted."""
    out = git("ls-tree", "-r", "--name-only", rev, cwd=repo)
    return sorted(out.splitlines()) if out else []


def log(repo: Path | str, *args: str) -> list[str]:
    """`git log --format=%H ARGS` as a list, newest first."""
    out = git("log", "--format=%H", *args, cwd=repo)
    return out.splitlines() if out else []


def install_hook(bare: Path, name: str, script: str) -> None:
    """Install an executable hook (e.g. pre-receive) into a bare repository."""
    hook = Path(bare) / "hooks" / name
    hook.write_text("#!/bin/sh\n" + script + "\n")
    hook.chmod(0o755)
