"""Where people see eval baselines: ``status NAME``, the dashboard, the web
page and the attestation show each eval's baseline node and, per case,
what was expected, the node's answer, the baseline's answer and whether it
held. The statuses come from the real engine (tests/engine_world.py)."""

from __future__ import annotations

from typing import Any

from reconciler.attestations import attestation
from reconciler.spec.rollout_status import node_to_record, to_record
from reconciler.text import dashboard, status_text, web_rollout
from tests.engine_world import World
from tests.test_engine_baselines import GOLDEN, answer_baseline, world


def _ran(w: World, node: str, answers: dict[str, tuple[str, bool]]) -> None:
    """The node's apply succeeded with its evals as ``answers`` (case -> (text, held))."""
    cases = [
        {"name": c, "ok": ok, "answer": a, "detail": "" if ok else "differs", "seconds": 0.2}
        for c, (a, ok) in answers.items()
    ]
    passed = sum(1 for c in cases if c["ok"])
    result = {"name": "golden", "suiteSha256": "ab" * 32, "passed": passed, "total": len(cases),
              "passRate": round(100.0 * passed / len(cases), 2), "cases": cases}  # fmt: skip
    job = w.job(node)
    w.answer(job, "failed" if passed < len(cases) else "succeeded", evals=(result,),
             error="" if passed == len(cases) else "eval_failed: golden")  # fmt: skip


def held_world() -> World:
    """n4 gave the baseline; n1's apply failed its matchesBaseline case."""
    w = world(nodes=4, batch_size=1)
    w.step(0)
    answer_baseline(w, "n4")
    w.step(10)
    _ran(w, "n1", {"capital": (" Paris", True), "same": ("Bonjour", False),
                   "close": ("Returns within 30 days.", True)})  # fmt: skip
    w.step(20)
    assert w.hold() == "health_failed"
    return w


def test_status_shows_the_baseline_and_each_cases_baseline_answer() -> None:
    w = held_world()
    shown = status_text.render_detail(w.status(), w.now)

    assert "golden baseline from n4: recorded (eval job eval-" in shown
    assert "  same  'Hello!'" in shown
    assert "same  FAILED  'Bonjour' (differs)  baseline 'Hello!'" in shown


def test_the_dashboard_lists_the_baseline_and_the_cases() -> None:
    text = dashboard.render_dashboard({"r": held_world().status()})

    assert "## Evals" in text
    assert "- **r** `golden` baseline from n4: recorded (attempt 1)" in text
    assert "| r | n1 | golden | same | matchesBaseline true | Bonjour | Hello! | **no** |" in text


def test_the_web_page_has_a_table_per_eval_with_the_baselines_answer() -> None:
    status = held_world().status()
    record: dict[str, Any] = to_record(status)
    html = web_rollout.eval_section(record, [node_to_record(n) for n in status.nodes])

    assert "n1: golden — 2 of 3 held (66.7%); baseline from n4" in html
    assert "Bonjour" in html and "Hello!" in html


def test_the_attestation_carries_the_baseline_answers() -> None:
    w = held_world()
    w.edit(abort=True)
    w.step(30)
    status = w.status()
    statement = attestation.statement_of(status, "c" * 40)
    predicate = statement["predicate"]

    assert predicate["evalBaseline"]["golden"]["answers"]["same"] == "Hello!"
    assert attestation.predicate_problem(predicate) == ""
    assert [c["name"] for c in predicate["frozen"]["evals"][0]["cases"]] == [
        c.name
        for c in GOLDEN.suite.cases  # type: ignore[union-attr]
    ]
