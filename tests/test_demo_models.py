"""`reconciler demo --models` on three real llama-server nodes: the signed
rollouts complete, the client load during the drained rollout sees no
failed request, the rollback puts the first model back, and a model that
fails its golden prompts never serves."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from reconciler.cli.demo_models import run_models_demo
from reconciler.spec.safe_yaml import load_yaml
from tests.kit.git import git
from tests.kit.llama import llama_server_binary

pytestmark = pytest.mark.slow


def test_the_model_demo_stages_drains_under_load_rolls_back_and_refuses_by_evals(
    tmp_path: Path,
) -> None:
    llama_server_binary()  # fails naming `make llama-server` when it is not built
    out = io.StringIO()

    root = run_models_demo(tmp_path / "demo", out, interval=0.2)

    bare = root / "fleet.git"
    statuses = {
        name: load_yaml(name, git("show", f"main:status/{name}.yaml", cwd=bare).encode())
        for name in ("tiny-a", "tiny-b", "tiny-c")
    }
    assert [s["phase"] for s in statuses.values()] == ["completed", "completed", "paused"]
    assert {n["state"] for n in statuses["tiny-b"]["nodes"]} == {"rolled_back"}
    assert {n["signature"]["signer"] for n in statuses["tiny-b"]["nodes"]} == {"tiny-release"}
    held = statuses["tiny-c"]
    assert held["hold"]["reason"] == "health_failed"
    first, *others = held["nodes"]
    assert (first["name"], first["state"]) == ("gpu-1", "failed")
    assert {n["state"] for n in others} <= {"pending", "staged"}  # never applied
    assert "eval_failed" in held["nodes"][0]["error"]
    story = out.getvalue()
    load = next(line for line in story.splitlines() if "client load:" in line)
    assert " 0 failed;" in load and "answered by tiny-a" in load and "answered by tiny-b" in load
    chapters = story.split("3. Rolled back")
    assert chapters[0].count("answers from tiny-b") == 3
    rolled_back, refused = chapters[1].split("4. Golden prompts")
    assert rolled_back.count("answers from tiny-a") == 3
    assert refused.count("answers from tiny-a") == 3
    evals_load = next(line for line in refused.splitlines() if "client load:" in line)
    assert " 0 failed;" in evals_load and "tiny-c" not in evals_load
