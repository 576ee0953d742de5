"""An ``eval`` job on a real agent process: it asks the runtime as it
serves for the matchesBaseline cases only, records each answer in the
signed job record, and changes nothing on the node (no config written, no
backup, no after-apply, no drain). A case without an answer fails the job.

The runtime is the OpenAI-compatible stand-in (tests/kit): an answer of
HTTP 500 on cue is a fault a real llama-server does not produce; the real
llama-server runs in tests/test_evals_llama_e2e.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from reconciler.protocol.signing import SigningKey
from reconciler.spec.evals import Eval, EvalSuite, case_from_document
from tests.kit.agents import start_agent
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.openai_stand_in import OpenAIStandIn, Reply
from tests.kit.waiting import wait_for

CONFIG = b"provider: vllm\nmodel: old\nprofile: default\n"
CASES = [
    {"name": "capital", "prompt": "The capital of France is", "expect": {"contains": "Paris"}},
    {"name": "same", "prompt": "Say hello", "expect": {"matchesBaseline": True}},
    {
        "name": "close",
        "prompt": "Summarise",
        "expect": {"matchesBaseline": {"minSimilarity": 0.9}},
    },
]


def _eval_job(url: str) -> Any:
    suite = EvalSuite("golden", "ab" * 32, tuple(case_from_document(c) for c in CASES))
    golden = Eval("golden", "golden", url, 100.0, 60, suite=suite)
    return job("eval-1", kind="eval", mode="live", node="node-a", evals=(golden,))


def _run(tmp_path: Path, replies: dict[str, Reply]) -> tuple[dict[str, Any], Any, list[str]]:
    key: SigningKey = make_key(tmp_path / "keys" / "reconciler").signing
    log = tmp_path / "commands.log"
    agent = start_agent(
        tmp_path / "node",
        "node-a",
        tmp_path / "keys" / "reconciler.pub",
        config=CONFIG,
        runtime="hermes",
        after_apply=f"/bin/sh -c 'echo after-apply >> {log}'",
    )
    try:
        with OpenAIStandIn(replies) as runtime:
            answer = httpx.post(
                f"{agent.url}/v1/nodes/node-a/jobs",
                json=envelope(_eval_job(runtime.url), key),
            )
            assert answer.status_code == 202, answer.text

            def done() -> dict[str, Any] | None:
                record: dict[str, Any] = agent.get("jobs/eval-1")
                return record if record["state"] in ("succeeded", "failed") else None

            record = wait_for(done, timeout=60, what="the eval job to finish")
            asked = [a.get("prompt", "") for a in runtime.asked]
        assert agent.get("backups") == []  # nothing was backed up: nothing was written
        return record, agent, asked
    finally:
        agent.close()


def test_an_eval_job_records_the_baseline_answers_and_changes_nothing(tmp_path: Path) -> None:
    replies = {"Say hello": Reply(" Hello!\n"), "Summarise": Reply("Returns within 30 days.")}
    record, agent, asked = _run(tmp_path, replies)

    assert record["state"] == "succeeded", record
    assert asked == ["Say hello", "Summarise"]  # the matchesBaseline cases only
    [result] = record["evals"]
    assert [(c["name"], c["ok"], c["answer"]) for c in result["cases"]] == [
        ("same", True, " Hello!\n"),
        ("close", True, "Returns within 30 days."),
    ]
    assert agent.config_bytes() == CONFIG
    assert not (tmp_path / "commands.log").exists()


def test_a_case_without_an_answer_fails_the_eval_job(tmp_path: Path) -> None:
    replies = {"Say hello": Reply("", status=500), "Summarise": Reply("Returns.")}
    record, agent, _ = _run(tmp_path, replies)

    assert record["state"] == "failed"
    assert record["error"] == "eval_baseline_failed: golden case same: answered HTTP 500"
    assert agent.config_bytes() == CONFIG
