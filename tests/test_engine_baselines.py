"""Eval baselines through the real engine: a live rollout whose evals hold
matchesBaseline cases sends eval jobs to its last nodes first, dispatches
nothing until their answers are recorded, carries those answers in every
apply, and holds eval_baseline_failed when a baseline job fails or its node
stays unreachable; a resume asks again as a new attempt."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from reconciler.engine.baselines import GATE_RULES, OUTCOME_RULES, choose, render_gate_table
from reconciler.engine.queries import in_flight, next_wakeup
from reconciler.protocol.job_ids import job_id
from reconciler.protocol.job_payload import build_payload
from reconciler.spec import rollout_status
from reconciler.spec.evals import Eval, EvalCase, EvalSuite
from reconciler.spec.rollout_status import NodeRecord
from tests.engine_world import T0, World

STATUS_SCHEMA = json.loads(
    (Path(__file__).parent.parent / "schemas" / "rollout-status.schema.json").read_text()
)
CASES = (
    EvalCase("capital", "contains", '"Paris"', prompt="The capital of France is"),
    EvalCase("same", "matchesBaseline", "true", prompt="Say hello"),
    EvalCase("close", "matchesBaseline", '{"minSimilarity":0.9}', prompt="Summarise"),
)
GOLDEN = Eval(
    "golden", "golden", "http://127.0.0.1:8080", timeout=60,
    suite=EvalSuite("golden", "ab" * 32, CASES),
)  # fmt: skip
PLAIN = replace(GOLDEN, suite=EvalSuite("golden", "cd" * 32, CASES[:1]))  # no matchesBaseline case


def world(evals: tuple[Eval, ...] = (GOLDEN,), nodes: int = 4, **fields: Any) -> World:
    w = World(nodes)
    fields.setdefault("batch_size", 2)
    fields.setdefault("live", True)
    fields.setdefault("on_failure", "pause")
    w.rollout(evals=evals, health_timeout=120, **fields)
    return w


def answer_baseline(w: World, node: str, answers: dict[str, str] | None = None) -> None:
    """The node's eval job succeeded with ``answers`` (case -> text)."""
    given = answers or {"same": "Hello!", "close": "Returns within 30 days."}
    job = w.job(node)
    assert job.kind == "eval"
    cases = [
        {"name": c, "ok": True, "answer": a, "detail": "", "seconds": 0.1} for c, a in given.items()
    ]
    record = {"name": "golden", "suiteSha256": "ab" * 32, "passed": len(cases),
              "total": len(cases), "passRate": 100.0, "cases": cases}  # fmt: skip
    w.answer(job, "succeeded", evals=(record,))


def test_the_last_node_answers_first_and_no_batch_starts_before_its_answers_are_recorded() -> None:
    w = world()

    w.step(0)
    assert [(j.node, j.kind) for j in w.last.effects] == [("n4", "eval")]
    eval_job = w.job("n4")
    assert eval_job.job_id == job_id("r", w.status().start_commit or "", "n4", 1, "eval")
    assert eval_job.mode == "live" and eval_job.evals == (GOLDEN,)
    assert set(w.states().values()) == {"pending"}
    w.step(10)
    assert w.last.effects == ()  # waits for the answers

    answer_baseline(w, "n4")
    w.step(20)

    assert [(j.node, j.kind) for j in w.last.effects] == [("n1", "apply"), ("n2", "apply")]
    payload = build_payload(w.job("n1"), T0)
    cases = {c["name"]: c for c in payload["evals"][0]["cases"]}
    assert cases["same"]["baselineAnswer"] == "Hello!"
    assert cases["close"]["baselineAnswer"] == "Returns within 30 days."
    assert "baselineAnswer" not in cases["capital"]
    record = rollout_status.to_record(w.status())
    Draft202012Validator(STATUS_SCHEMA).validate(record)
    assert record["evalBaseline"] == {
        "golden": {
            "node": "n4",
            "jobId": eval_job.job_id,
            "answers": {"same": "Hello!", "close": "Returns within 30 days."},
        }
    }


def test_a_failed_baseline_job_holds_and_a_resume_asks_again_as_a_new_attempt() -> None:
    w = world()
    w.step(0)
    first = w.fail("n4", error="eval_baseline_failed: golden case same: answered HTTP 500")
    w.step(10)

    assert w.hold() == "eval_baseline_failed" and w.phase() == "paused"
    assert w.status().hold is not None and w.status().hold.nodes == ("n4",)
    assert "answered HTTP 500" in w.status().hold.message
    assert set(w.states().values()) == {"pending"}

    w.resume()
    w.step(20)
    again = w.job("n4")
    assert (again.kind, again.attempt) == ("eval", 2) and again.job_id != first.job_id
    assert w.hold() is None and w.phase() == "running"
    answer_baseline(w, "n4")
    w.step(30)
    assert w.sent_now() == ["n1", "n2"]


def test_a_baseline_node_unreachable_past_health_timeout_holds() -> None:
    w = world()
    w.step(0)
    w.go_offline("n4")
    w.step(60)
    assert w.hold() is None  # not yet healthTimeout
    w.step(121)

    assert w.hold() == "eval_baseline_failed"
    assert "unreachable for 2m" in (w.status().hold.message if w.status().hold else "")


def test_a_case_without_an_answer_fails_the_baseline() -> None:
    w = world()
    w.step(0)
    answer_baseline(w, "n4", {"same": "Hello!"})  # close is missing
    w.step(10)

    assert w.hold() == "eval_baseline_failed"
    assert w.sent_now() == []


def test_rollouts_without_matches_baseline_dispatch_at_once_and_record_nothing_new() -> None:
    w = world((PLAIN,))
    w.step(0)

    assert w.sent_now() == ["n1", "n2"]
    assert "evalBaseline" not in rollout_status.to_record(w.status())
    assert "evalBaselineJobs" not in rollout_status.to_record(w.status())


def test_count_and_node_ids_choose_the_baseline_nodes() -> None:
    nodes = [NodeRecord(name=f"n{i}", batch=1) for i in range(1, 6)]
    two = replace(GOLDEN, name="two", baseline_count=2)
    named = replace(GOLDEN, name="named", baseline_node_ids=("n1",))

    assert choose((two, named, PLAIN), nodes) == {"n4": ("two",), "n5": ("two",), "n1": ("named",)}
    done = [replace(n, state="succeeded") if n.name == "n5" else n for n in nodes]
    assert choose((two,), done) == {"n3": ("two",), "n4": ("two",)}


def test_a_daemon_restart_rebuilds_the_same_eval_job_from_status_alone() -> None:
    w = world()
    w.step(0)
    sent = w.job("n4")
    record = rollout_status.to_record(w.status())
    Draft202012Validator(STATUS_SCHEMA).validate(record)
    reread = rollout_status.from_record(record)

    assert reread == w.status()
    assert in_flight([reread]) == (sent,)
    assert next_wakeup([reread]) == w.status().eval_baseline[0].deadline


@pytest.mark.parametrize("stands", [r.stands for r in GATE_RULES])
def test_every_gate_rule_is_in_the_docs_table(stands: str) -> None:
    assert f"| {stands} |" in render_gate_table()
    assert len(OUTCOME_RULES) == 6
