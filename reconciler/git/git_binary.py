"""The ``git`` binary, for the commands that act in a person's working clone
(``init``, the intent verbs, the demo) the way the person would, with their
identity and hooks. The daemon never uses it: it goes through ``gitstore``."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from reconciler.spec.errors import ReconcilerError


def run_git(cwd: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    """``git -C CWD ARGS``; its stdout, or a ReconcilerError saying what failed."""
    try:
        result = subprocess.run(
            ["git", "-C", str(cwd), *args],
            capture_output=True,
            text=True,
            check=False,
            env=dict(env) if env is not None else None,
        )
    except OSError as exc:
        raise ReconcilerError(f"cannot run git: {exc}", hint="install git") from exc
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()
        hint = ""
        if "tell me who you are" in detail or "user.email" in detail:
            hint = (
                'set your identity: git config --global user.name "Your Name"; '
                "git config --global user.email you@example.com"
            )
        raise ReconcilerError(f"git {args[0]} failed in {cwd}: {detail}", hint=hint)
    return result.stdout
