"""The example fleet repository shipped with reconciler: what ``init`` seeds
a new repository from and what the demo starts with."""

from __future__ import annotations

from pathlib import Path

from reconciler.spec.errors import ReconcilerError
from reconciler.spec.paths import NODES_DIR, ROLLOUTS_DIR

_HERE = Path(__file__).resolve().parents[1]  # reconciler/
# Installed wheel: force-included as reconciler/example-repo. Editable
# install or a source checkout: the repository's top-level example-repo/.
_CANDIDATE_DIRS = (_HERE / "example-repo", _HERE.parent / "example-repo")


def example_dir() -> Path:
    """The example fleet repository shipped with reconciler."""
    for directory in _CANDIDATE_DIRS:
        if (directory / ROLLOUTS_DIR).is_dir() or (directory / NODES_DIR).is_dir():
            return directory
    raise ReconcilerError(
        "reconciler's example repository is missing: looked in "
        + ", ".join(map(str, _CANDIDATE_DIRS)),
        hint="reinstall reconciler",
    )
