"""A small filesystem that really fills up: a tmpfs of a given size,
mounted for one test where this machine lets it (as root), unmounted after.
Where mounting is not allowed the test is skipped, saying why."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """``where``, created, with a tmpfs of ``size`` (such as ``256k``) on it."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
