"""The demo runs the whole product and ends with the story's phases
committed in the fleet repository it leaves behind."""

from __future__ import annotations

import io
from pathlib import Path

from reconciler.cli.demo_story import run_demo
from reconciler.spec.safe_yaml import load_yaml
from tests.kit.git import git


def test_the_demo_tells_its_story_and_leaves_the_repository(tmp_path: Path) -> None:
    out = io.StringIO()

    root = run_demo(tmp_path / "demo", out, delay=0.2, interval=0.2)

    bare = root / "fleet.git"
    phases = {}
    records = {}
    for name in ("llama-canary", "qwen-serving", "mistral-b3", "phi-serving"):
        text = git("show", f"main:status/{name}.yaml", cwd=bare)
        records[name] = load_yaml(name, text.encode())
        phases[name] = records[name]["phase"]
    assert phases == {
        "llama-canary": "completed",
        "qwen-serving": "completed",
        "mistral-b3": "completed",
        "phi-serving": "completed",
    }
    log = git("log", "--format=%an|%s", "main", cwd=bare).splitlines()
    assert "Alice Operator|resume qwen-serving: canary batch looks healthy" in log
    assert any(line.startswith("reconciler|status: mistral-b3 paused") for line in log)
    story = out.getvalue()
    assert "pause_after_batch" in story and "health_failed" in story
    assert "no space left on device" in story  # the hold names what happened
    assert str(bare) in story  # the user is told where to explore
    # The rollout with a model file: every node staged it (size and digest
    # checked) before it switched, and the demo's file server served each one.
    nodes = records["phi-serving"]["nodes"]
    assert [(n["name"], n["state"], n["stage"]["state"]) for n in nodes] == [
        (name, "succeeded", "staged") for name in ("gpu-b1", "gpu-b2", "gpu-b3", "gpu-b4")
    ]
    assert "2 staged" in story  # status phi-serving while it holds: batch 2 staged ahead
    assert "the demo's file server answered 4 GET requests" in story
