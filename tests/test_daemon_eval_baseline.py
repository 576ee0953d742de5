"""Eval baselines end to end: the daemon, a real bare repository and the
simulated fleet as a real process on 127.0.0.1, whose nodes answer an eval
job with the model they serve (``"MODEL says: PROMPT"``). The last node
answers first; no apply is sent before its answers are recorded; every
apply carries them; a failed or unreachable baseline node holds the
rollout ``eval_baseline_failed`` until a resume asks again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reconciler.spec.rollout_status import from_record
from reconciler.text import status_text
from tests.kit.documents import rollout_yaml
from tests.kit.fleets import FleetKit

THREE = {f"gpu-{i}": {"role": "gpu"} for i in range(1, 4)}
NAMES = "names: [gpu-1, gpu-2, gpu-3]\n"
SUITE = """\
apiVersion: reconciler/v1
kind: EvalSuite
metadata: {name: golden}
spec:
  cases:
    - name: same
      prompt: "Say hello"
      expect: {matchesBaseline: true}
    - name: close
      prompt: "Summarise the returns policy"
      expect: {matchesBaseline: {minSimilarity: 0.9}}
"""
EVALS = "{evals: [{name: golden, suite: golden, url: 'http://127.0.0.1:8080'}]}"


def files(**spec: Any) -> dict[str, str]:
    spec.setdefault("selector", {"role": "gpu"})
    spec.setdefault("live", True)
    spec.setdefault("onFailure", "pause")
    spec.setdefault("health", EVALS)
    return {"evals/golden.yaml": SUITE, "rollouts/llama.yaml": rollout_yaml("llama", **spec)}


def phase(*phases: str) -> Any:
    return lambda s: s.get("llama", {}).get("phase") in phases


def held_for(reason: str) -> Any:
    return lambda s: (s.get("llama", {}).get("hold") or {}).get("reason") == reason


def accepted(kit: FleetKit) -> list[tuple[str, str]]:
    """(node, job kind) of every job the simulated fleet accepted, in order."""
    journal = kit.root / "sim" / "state" / "sim-journal.jsonl"
    if not journal.exists():
        journal = next((kit.root / "sim").rglob("sim-journal.jsonl"))
    events = [json.loads(line) for line in journal.read_text().splitlines() if line]
    return [(e["node"], e["payload"]["kind"]) for e in events if e["e"] == "accept"]


def test_the_baseline_is_recorded_before_the_first_apply_and_every_apply_carries_it(
    tmp_path: Path,
) -> None:
    kit = FleetKit.create(tmp_path, THREE)
    try:
        kit.push(files())
        done = kit.run_until(kit.daemon(), phase("completed"), timeout=60)
        order = accepted(kit)
        stats = kit.fleet.stats()
    finally:
        kit.close()

    status = done["llama"]
    [job] = status["evalBaselineJobs"]
    assert (job["node"], job["state"], job["attempt"]) == ("gpu-3", "recorded", 1)
    assert status["evalBaseline"] == {
        "golden": {
            "node": "gpu-3",
            "jobId": job["jobId"],
            "answers": {
                "same": "base-model says: Say hello",
                "close": "base-model says: Summarise the returns policy",
            },
        }
    }
    assert order[0] == ("gpu-3", "eval")
    assert [kind for _, kind in order[1:]] == ["apply", "apply", "apply"]
    assert stats["maxExecuted"] == 1 and stats["maxPayloadVariants"] == 1
    shown = status_text.render_detail(from_record(status), from_record(status).started_at)
    assert "golden baseline from gpu-3" in shown


def test_a_failed_baseline_holds_and_a_resume_sends_it_again(tmp_path: Path) -> None:
    kit = FleetKit.create(
        tmp_path,
        THREE,
        behaviour="default: succeed\nnodes:\n  gpu-3: {action: fail, error: 'runtime down'}\n",
    )
    try:
        kit.push(files())
        daemon = kit.daemon()
        held = kit.run_until(daemon, held_for("eval_baseline_failed"), timeout=60)
        before = accepted(kit)
        kit.fleet.set_behaviour(NAMES + "default: succeed\n")
        kit.push(files(resumeRequest='"runtime back"'))
        done = kit.run_until(daemon, phase("completed"), timeout=60)
    finally:
        kit.close()

    hold = held["llama"]["hold"]
    assert hold["nodes"] == ["gpu-3"] and "eval job failed: runtime down" in hold["message"]
    assert before == [("gpu-3", "eval")]  # nothing applied while held
    jobs = done["llama"]["evalBaselineJobs"]
    assert [(j["attempt"], j["state"]) for j in jobs] == [(2, "recorded")]
    assert done["llama"]["evalBaseline"]["golden"]["jobId"] == jobs[0]["jobId"]


def test_an_unreachable_baseline_node_holds_after_the_health_timeout(tmp_path: Path) -> None:
    behaviour = "default: succeed\nnodes:\n  gpu-3: unreachable\n"
    kit = FleetKit.create(tmp_path, THREE, behaviour=behaviour)
    try:
        kit.push(files(healthTimeout="2s"))
        held = kit.run_until(kit.daemon(), held_for("eval_baseline_failed"), timeout=60)
        order = accepted(kit)
    finally:
        kit.close()

    hold = held["llama"]["hold"]
    assert hold["nodes"] == ["gpu-3"] and "agent unreachable for 2s or more" in hold["message"]
    assert order == []
    assert {n["state"] for n in held["llama"]["nodes"]} == {"pending"}


def test_a_new_daemon_sends_the_same_eval_job_and_it_runs_once(tmp_path: Path) -> None:
    behaviour = "default: succeed\nnodes:\n  gpu-3: {action: succeed, delay: 1.5}\n"
    kit = FleetKit.create(tmp_path, THREE, behaviour=behaviour)
    try:
        kit.push(files())
        kit.run_until(kit.daemon(), lambda s: "evalBaselineJobs" in s.get("llama", {}))
        done = kit.run_until(kit.daemon(), phase("completed"), timeout=60)
        stats = kit.fleet.stats()
    finally:
        kit.close()

    [job] = done["llama"]["evalBaselineJobs"]
    assert job["attempt"] == 1 and stats["executed"][job["jobId"]] == 1
    assert stats["maxPayloadVariants"] == 1
