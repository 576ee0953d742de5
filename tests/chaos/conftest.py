"""Shared fixtures of the chaos tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from . import scenarios


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    """How the crash scenario's rollout ends when nothing crashes."""
    root: Path = tmp_path_factory.mktemp("reference")
    return scenarios.crash_reference(root)
