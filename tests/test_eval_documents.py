"""Eval suites (evals/NAME.yaml) and a rollout's health.evals: what
validation refuses and where it says so, the suite frozen at start by the
digest of its file, what a live apply carries, and what plan shows."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from reconciler.engine.queries import apply_job
from reconciler.protocol.job_payload import build_payload, payload_problems
from reconciler.spec import documents
from reconciler.spec.rollout_status import NodeRecord, freeze, from_record, to_record
from reconciler.text import plan
from tests.kit.documents import make_status, node_yaml, rollout_yaml
from tests.kit.fleets import FleetKit

SUITE = """\
apiVersion: reconciler/v1
kind: EvalSuite
metadata: {name: golden}
spec:
  request: {maxTokens: 16, seed: 1}
  cases:
    - name: capital
      prompt: "The capital of France is"
      expect: {contains: "Paris"}
    - name: refund
      prompt: "Reply with the refund as JSON"
      expect:
        jsonSchema: {type: object, required: [amount]}
      maxSeconds: 5
"""
EVALS = "[{name: golden, suite: golden, url: 'http://127.0.0.1:8080', minPassRate: 50%}]"
DRAIN = '{idle: {url: "http://127.0.0.1:8000/metrics", metric: inflight}}'
NODES = {f"nodes/gpu-{i}.yaml": node_yaml(f"gpu-{i}", labels="{role: gpu}") for i in (1, 2)}


def rollout(**spec: Any) -> str:
    spec.setdefault("selector", {"role": "gpu"})
    spec.setdefault("live", True)
    spec.setdefault("health", f"{{evals: {EVALS}}}")
    return rollout_yaml("llama", **spec)


def problems(files: dict[str, str]) -> list[str]:
    docs = documents.assemble(
        documents.parse_file(path, text.encode()) for path, text in {**NODES, **files}.items()
    )
    return [str(p) for p in docs.problems]


def test_a_valid_suite_and_rollout_validate_and_join() -> None:
    docs = documents.assemble(
        documents.parse_file(p, t.encode())
        for p, t in {**NODES, "evals/golden.yaml": SUITE, "rollouts/llama.yaml": rollout()}.items()
    )

    assert docs.problems == ()
    [golden] = docs.rollouts["llama"].evals
    assert golden.suite is not None
    assert golden.suite.sha256 == hashlib.sha256(SUITE.encode()).hexdigest()
    assert [c.name for c in golden.suite.cases] == ["capital", "refund"]
    assert golden.min_pass_rate == 50.0 and golden.timeout == 300


def test_each_broken_case_is_reported_at_its_line() -> None:
    broken = SUITE + (
        "    - name: bad-regex\n"  # line 15
        "      prompt: x\n"
        "      expect: {regex: '(unclosed'}\n"
        "    - name: bad-schema\n"
        "      prompt: y\n"
        "      expect:\n"
        "        jsonSchema: {type: objet}\n"  # line 21
        "    - name: both\n"
        "      prompt: z\n"
        "      messages: [{role: user, content: hi}]\n"  # line 24
        "      expect: {equals: a}\n"
        "    - name: two\n"
        "      prompt: z\n"
        "      expect: {equals: a, contains: b}\n"  # line 28
        "    - name: capital\n"  # line 29
        "      prompt: z\n"
        "      expect: {contains: a}\n"
    )

    found = problems({"evals/golden.yaml": broken})

    assert any(p.startswith("evals/golden.yaml:17:") and "does not compile" in p for p in found)
    assert any(
        p.startswith("evals/golden.yaml:21:") and "JSON Schema (2020-12)" in p for p in found
    )
    assert any(p.startswith("evals/golden.yaml:24:") and "not both" in p for p in found)
    assert any(
        p.startswith("evals/golden.yaml:28:") and "exactly one expectation" in p for p in found
    )
    assert any(p.startswith("evals/golden.yaml:29:") and "used twice" in p for p in found)


def test_a_chat_suite_needs_messages_and_a_completions_suite_a_prompt() -> None:
    chat = SUITE.replace("spec:\n", "spec:\n  api: chat\n")

    found = problems({"evals/golden.yaml": chat})

    assert sum("with api: chat every case needs messages" in p for p in found) == 2


def test_matches_baseline_is_accepted_as_true_or_a_least_similarity() -> None:
    same = SUITE.replace('expect: {contains: "Paris"}', "expect: {matchesBaseline: true}")
    close = SUITE.replace(
        'expect: {contains: "Paris"}', "expect: {matchesBaseline: {minSimilarity: 0.9}}"
    )
    wrong = SUITE.replace(
        'expect: {contains: "Paris"}', "expect: {matchesBaseline: {minSimilarity: 1.5}}"
    )

    assert problems({"evals/golden.yaml": same}) == []
    assert problems({"evals/golden.yaml": close}) == []
    assert any(p.startswith("evals/golden.yaml:9:") for p in problems({"evals/golden.yaml": wrong}))


def test_a_rollouts_evals_need_a_suite_live_a_rate_within_bounds_and_their_own_names() -> None:
    missing = problems({"rollouts/llama.yaml": rollout()})
    dry = problems({"evals/golden.yaml": SUITE, "rollouts/llama.yaml": rollout(live=False)})
    over = problems(
        {
            "evals/golden.yaml": SUITE,
            "rollouts/llama.yaml": rollout(health=f"{{evals: {EVALS.replace('50%', '101%')}}}"),
        }
    )
    twice = problems(
        {
            "evals/golden.yaml": SUITE,
            "rollouts/llama.yaml": rollout(
                health="{checks: [{name: golden, tcp: {host: 127.0.0.1, port: 8080}}], "
                f"evals: {EVALS}}}"
            ),
        }
    )

    assert any('no valid eval suite named "golden"' in p for p in missing)
    assert any("evals run on the node during a live apply: set live: true" in p for p in dry)
    assert any("101% is outside 0% to 100%" in p for p in over)
    assert any("already used by a check, comparison or eval" in p for p in twice)


def test_the_frozen_suite_round_trips_and_a_live_apply_carries_it_whole() -> None:
    docs = documents.assemble(
        documents.parse_file(p, t.encode())
        for p, t in {**NODES, "evals/golden.yaml": SUITE, "rollouts/llama.yaml": rollout()}.items()
    )
    frozen = freeze(docs.rollouts["llama"])

    status = replace(make_status("llama", "running", [("gpu-1", 1, "dispatched")]), frozen=frozen)
    assert from_record(to_record(status)).frozen == frozen
    node = NodeRecord(
        name="gpu-1", batch=1, state="dispatched", job_id="j-1", attempt=1, source_commit="a" * 40
    )
    payload = build_payload(apply_job("llama", frozen, node), datetime(2026, 12, 7, tzinfo=UTC))

    [carried] = payload["evals"]
    assert carried["suiteSha256"] == hashlib.sha256(SUITE.encode()).hexdigest()
    assert carried["minPassRate"] == 50.0 and carried["timeout"] == 300
    assert carried["request"] == {"maxTokens": 16, "temperature": 0.0, "seed": 1}
    assert carried["cases"][1] == {
        "name": "refund",
        "prompt": "Reply with the refund as JSON",
        "expect": {"jsonSchema": {"type": "object", "required": ["amount"]}},
        "maxSeconds": 5.0,
    }
    assert payload_problems(payload) == []
    carried["cases"][0]["expect"] = {}
    assert payload_problems(payload) != []


def test_plan_shows_each_eval_and_warns_without_drain() -> None:
    now = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    head = {**NODES, "evals/golden.yaml": SUITE}

    def planned(text: str) -> str:
        files = {**head, "rollouts/llama.yaml": text}
        result = plan.make_plan(
            plan.Tree("a" * 40, {p: t.encode() for p, t in head.items()}),
            plan.Tree("b" * 40, {p: t.encode() for p, t in files.items()}),
            {},
            now=now,
        )
        return plan.render_text(result)

    bare, drained = planned(rollout()), planned(rollout(drain=DRAIN))

    line = "eval golden: suite golden (2 cases), minimum pass rate 50%, baseline 1 node"
    assert line in bare and line in drained
    assert "cannot keep a failed model from users" in bare
    assert "cannot keep a failed model from users" not in drained


def test_plan_shows_each_evals_baseline_nodes() -> None:
    now = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    suite = SUITE.replace('expect: {contains: "Paris"}', "expect: {matchesBaseline: true}")
    head = {**NODES, "evals/golden.yaml": suite}
    two = EVALS.replace("minPassRate: 50%", "minPassRate: 50%, baseline: {count: 2}")
    files = {**head, "rollouts/llama.yaml": rollout(health=f"{{evals: {two}}}")}

    result = plan.make_plan(
        plan.Tree("a" * 40, {p: t.encode() for p, t in head.items()}),
        plan.Tree("b" * 40, {p: t.encode() for p, t in files.items()}),
        {},
        now=now,
    )

    assert (
        "eval golden: suite golden (2 cases), minimum pass rate 50%, baseline 2 nodes; "
        "baseline nodes: gpu-1, gpu-2" in plan.render_text(result)
    )


def test_a_suite_edited_while_a_rollout_runs_changes_nothing_for_it(tmp_path: Path) -> None:
    nodes = {"gpu-1": {"role": "gpu"}, "gpu-2": {"role": "gpu"}}
    kit = FleetKit.create(tmp_path, nodes, behaviour="default: {action: succeed, delay: 0.5}\n")
    try:
        kit.push({"evals/golden.yaml": SUITE, "rollouts/llama.yaml": rollout()})
        daemon = kit.daemon()
        kit.run_until(daemon, lambda s: s.get("llama", {}).get("phase") == "running")
        edited = SUITE.replace("Paris", "Lyon")
        kit.push({"evals/golden.yaml": edited}, "Edit the suite while llama runs")
        done = kit.run_until(
            daemon, lambda s: s.get("llama", {}).get("phase") == "completed", timeout=60
        )
    finally:
        kit.close()

    [frozen] = done["llama"]["frozen"]["evals"]
    assert frozen["suiteSha256"] == hashlib.sha256(SUITE.encode()).hexdigest()
    assert frozen["cases"][0]["expect"] == {"contains": "Paris"}
