"""`reconciler demo --models` on three real llama-server nodes: the
rollouts complete, the client load during the drained rollout sees no
failed request, and the rollback puts the first model back."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from reconciler.cli.demo_models import run_models_demo
from reconciler.spec.safe_yaml import load_yaml
from tests.kit.git import git
from tests.kit.llama import llama_server_binary

pytestmark = pytest.mark.slow


def test_the_model_demo_stages_drains_under_load_and_rolls_back(tmp_path: Path) -> None:
    llama_server_binary()  # fails naming `make llama-server` when it is not built
    out = io.StringIO()

    root = run_models_demo(tmp_path / "demo", out, interval=0.2)

    bare = root / "fleet.git"
    statuses = {
        name: load_yaml(name, git("show", f"main:status/{name}.yaml", cwd=bare).encode())
        for name in ("tiny-a", "tiny-b")
    }
    assert [s["phase"] for s in statuses.values()] == ["completed", "completed"]
    assert {n["state"] for n in statuses["tiny-b"]["nodes"]} == {"rolled_back"}
    story = out.getvalue()
    load = next(line for line in story.splitlines() if "client load:" in line)
    assert " 0 failed;" in load and "answered by tiny-a" in load and "answered by tiny-b" in load
    chapters = story.split("3. Rolled back")
    assert chapters[0].count("answers from tiny-b") == 3
    assert chapters[1].count("answers from tiny-a") == 3
