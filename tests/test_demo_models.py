"""`reconciler demo --models` on three real llama-server nodes: the signed
rollouts complete, the client load during the drained rollout sees no
failed request, the rollback puts the first model back, a model that
fails its golden prompts never serves, and the nodes switch between warm
standby slots behind their own nginx with no request failed and roll back to
the slot kept warm."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli.demo_models import run_models_demo
from reconciler.spec.safe_yaml import load_yaml
from tests.kit.git import git
from tests.kit.llama import llama_server_binary

pytestmark = pytest.mark.slow


def test_the_model_demo_stages_drains_rolls_back_refuses_by_evals_and_switches_slots(
    tmp_path: Path,
) -> None:
    llama_server_binary()  # fails naming `make llama-server` when it is not built
    out = io.StringIO()

    root = run_models_demo(tmp_path / "demo", out, interval=0.2)

    bare = root / "fleet.git"
    statuses = {
        name: load_yaml(name, git("show", f"main:status/{name}.yaml", cwd=bare).encode())
        for name in ("tiny-a", "tiny-b", "tiny-c", "standby-b", "standby-a")
    }
    phases = [s["phase"] for s in statuses.values()]
    assert phases == ["completed", "completed", "aborted", "completed", "aborted"]
    assert {n["state"] for n in statuses["tiny-b"]["nodes"]} == {"rolled_back"}
    assert {n["signature"]["signer"] for n in statuses["tiny-b"]["nodes"]} == {"tiny-release"}
    held = statuses["tiny-c"]
    assert [(t["to"], t["reason"]) for t in held["transitions"]][1:] == [
        ("paused", "health_failed"),
        ("aborted", "aborted"),  # by Alice before chapter 5
    ]
    first, *others = held["nodes"]
    assert (first["name"], first["state"]) == ("gpu-1", "failed")
    assert {n["state"] for n in others} <= {"pending", "staged"}  # never applied
    assert "eval_failed" in held["nodes"][0]["error"]
    story = out.getvalue()
    load = next(line for line in story.splitlines() if "client load:" in line)
    assert " 0 failed;" in load and "answered by tiny-a" in load and "answered by tiny-b" in load
    chapters = story.split("3. Rolled back")
    assert chapters[0].count("answers from tiny-b") == 3
    rolled_back, refused = chapters[1].split("5. A warm standby")[0].split("4. Golden prompts")
    assert rolled_back.count("answers from tiny-a") == 3
    assert refused.count("answers from tiny-a") == 3
    evals_load = next(line for line in refused.splitlines() if "client load:" in line)
    assert " 0 failed;" in evals_load and "tiny-c" not in evals_load

    assert_the_warm_standby_chapter(root, statuses, story.split("5. A warm standby")[1])


def assert_the_warm_standby_chapter(root: Path, statuses: dict[str, Any], chapter: str) -> None:
    """Both standby rollouts switched with 0 s out of service and no failed
    request through the routers; the rollback routed back to the warm slot."""
    switched = statuses["standby-b"]["nodes"] + statuses["standby-a"]["nodes"][:2]
    assert [n["outOfService"] for n in switched] == [0] * 5
    assert {n["timings"]["drainStartedAt"] for n in switched} == {None}
    load = next(line for line in chapter.splitlines() if "client load:" in line)
    assert " 0 failed;" in load and "answered by tiny-b" in load, load
    rolled, never = statuses["standby-a"]["nodes"][:2], statuses["standby-a"]["nodes"][2]
    assert [n["state"] for n in rolled] == ["rolled_back"] * 2
    assert (never["name"], never["attempt"]) == ("gpu-3", 0)
    for node in rolled:
        assert node["standby"]["releasedAt"] and node["standby"]["releaseError"] == "", node
        jobs = root / "nodes" / node["name"] / "state" / "jobs"
        restore = json.loads((jobs / f"{node['restore']['jobId']}.json").read_text())
        assert restore["standby"] == {"slot": None, "serving": "a", "warm": True}, restore
        release = json.loads((jobs / f"{node['standby']['releaseJobId']}.json").read_text())
        # the restore already stopped the slot it rolled back from
        assert release["released"] == {"slot": None, "stopped": False}, release
    took = re.findall(r"accepted to routedAt (\d+\.\d+)s, serving slot a, warm: True", chapter)
    assert len(took) == 2, chapter
    after_rollback = chapter.split("$ reconciler rollback standby-a")[1]
    assert after_rollback.count("answers from tiny-b") == 3
