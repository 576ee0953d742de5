"""A live apply's evals on a real agent process: after warm-up and before
undrain it sends each case to the runtime's OpenAI-compatible route, judges
the answers, records them in the signed job record, and when a suite does
not hold puts the previous config back byte for byte, runs after-apply for
it and undrains, exactly as for a failed warm-up.

A suite that holds, a runtime that dies mid-suite and an agent SIGKILLed
during its evals run on a real llama-server serving a small generated
model; their golden answers are the model's own, asked first. A small
OpenAI-compatible stand-in (tests/kit) remains only for faults a real
llama-server does not produce on cue: an answer of HTTP 500, a text that
is not JSON where the case expects JSON, and answers slower than a case's
maxSeconds or the suite's timeout.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconciler.cli.llama_runtime import IDLE_METRICS
from reconciler.node.eval_runs import judge
from reconciler.protocol.signing import SigningKey
from reconciler.spec.artifacts import Drain
from reconciler.spec.evals import Eval, EvalSuite, case_from_document
from tests.kit.agents import RealAgent, start_agent
from tests.kit.jobs import envelope, job
from tests.kit.keys import make_key
from tests.kit.llama import LlamaServer, Models, complete, llama_server_binary, metric
from tests.kit.openai_stand_in import METRIC, OpenAIStandIn, Reply
from tests.kit.waiting import wait_for

OLD_CONFIG = b"provider: vllm\nmodel: old\nprofile: default\n"
CASES = [
    {"name": "capital", "prompt": "The capital of France is", "expect": {"contains": "Paris"}},
    {
        "name": "refund",
        "prompt": "Reply with the refund as JSON",
        "expect": {"jsonSchema": {"type": "object", "required": ["amount"]}},
    },
    {"name": "greeting", "prompt": "Say hello", "expect": {"regex": "^[Hh]ello"}},
    {"name": "quick", "prompt": "Answer fast", "expect": {"equals": "ok"}, "maxSeconds": 0.5},
]
SLOW_TOKENS = 96  # with the prompt, within a slot's 128 tokens of context
GOLDEN_PROMPTS = ("The capital of France is", "Say hello", "Once upon a time")
ALL_HOLD = {
    "The capital of France is": Reply(" Paris."),
    "Reply with the refund as JSON": Reply(' {"amount": 12} '),
    "Say hello": Reply("Hello there"),
    "Answer fast": Reply(" ok\n"),
}


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return make_key(tmp_path / "keys" / "reconciler").signing


def _suite(cases: list[dict[str, Any]] = CASES) -> EvalSuite:
    return EvalSuite("golden", "ab" * 32, tuple(case_from_document(c) for c in cases), seed=1)


def _agent(tmp_path: Path, key_dir: Path) -> tuple[RealAgent, Path]:
    """A real agent whose node-local commands write what they did, in order."""
    log = tmp_path / "commands.log"
    note = f"{os.environ.get('SHELL', '/bin/sh')} -c 'echo \"$0 $RECONCILER_MODEL\" >> {log}'"
    agent = start_agent(
        tmp_path / "node",
        "node-a",
        key_dir / "reconciler.pub",
        config=OLD_CONFIG,
        runtime="hermes",
        after_apply=note.replace("$0", "after-apply"),
        keep_port=True,
        extra=[
            "--drain-command", note.replace("$0", "drain"),
            "--undrain-command", note.replace("$0", "undrain"),
        ],
    )  # fmt: skip
    return agent, log


def _post(
    agent: RealAgent, key: SigningKey, url: str, metric: str = METRIC, **changes: Any
) -> None:
    """An apply whose drain waits for ``metric`` at ``url`` and whose suite
    is sent to ``url``."""
    settings: dict[str, Any] = {
        "node": "node-a",
        "drain": Drain(10, f"{url}/metrics", metric, 0),
        "evals": (Eval("golden", "golden", url, 100.0, 60, suite=_suite()),),
    }
    settings.update(changes)
    answer = httpx.post(
        f"{agent.url}/v1/nodes/node-a/jobs", json=envelope(job("apply-1", **settings), key)
    )
    assert answer.status_code == 202, answer.text


def _finished(agent: RealAgent) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        record: dict[str, Any] = agent.get("jobs/apply-1")
        return record if record["state"] in ("succeeded", "failed") else None

    result: dict[str, Any] = wait_for(done, timeout=60, what="the apply to finish")
    return result


def _evals_counted(agent: RealAgent) -> tuple[float, float]:
    """(passed, failed) from a scrape of the agent's /metrics, once the
    apply's evals are counted (just after its record is written)."""

    def counted() -> tuple[float, float] | None:
        text = httpx.get(f"{agent.url}/metrics", timeout=10).text
        values = {
            s.labels["outcome"]: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "reconciler_agent_evals_total"
        }
        both = (values.get("passed", 0.0), values.get("failed", 0.0))
        return both if sum(both) else None

    result: tuple[float, float] = wait_for(counted, timeout=30, what="the evals counted")
    return result


@pytest.fixture
def started(tmp_path: Path, key: SigningKey) -> Iterator[tuple[RealAgent, Path]]:
    agent, log = _agent(tmp_path, tmp_path / "keys")
    try:
        yield agent, log
    finally:
        agent.close()


def _golden_from(url: str, max_tokens: int = 64) -> list[dict[str, Any]]:
    """Cases whose expectations are the answers of the model at ``url``
    (the tiny models answer deterministic gibberish at temperature 0)."""
    said = {
        prompt: complete(url, prompt, max_tokens, seed=1)["choices"][0]["text"].strip()
        for prompt in GOLDEN_PROMPTS
    }
    capital, hello, story = (said[p] for p in GOLDEN_PROMPTS)
    return [
        {"name": "capital", "prompt": GOLDEN_PROMPTS[0], "expect": {"equals": capital}},
        {"name": "greeting", "prompt": GOLDEN_PROMPTS[1], "expect": {"contains": hello[:6]}},
        {
            "name": "story",
            "prompt": GOLDEN_PROMPTS[2],
            "expect": {"regex": "^" + re.escape(story[:4])},
        },
    ]


@pytest.fixture
def model_a(models: Models, tmp_path: Path) -> Iterator[LlamaServer]:
    with LlamaServer(llama_server_binary(), models.model(1), tmp_path / "llama.log") as server:
        yield server


@pytest.fixture
def slow_model(models: Models, tmp_path: Path) -> Iterator[LlamaServer]:
    with LlamaServer(llama_server_binary(), models.slow(1), tmp_path / "llama.log") as server:
        yield server


def test_a_suite_that_holds_lets_the_node_serve_and_records_every_case(
    started: tuple[RealAgent, Path], key: SigningKey, model_a: LlamaServer
) -> None:
    agent, log = started
    cases = _golden_from(model_a.url)
    golden = Eval("golden", "golden", model_a.url, 100.0, 60, suite=_suite(cases))
    _post(agent, key, model_a.url, IDLE_METRICS[0], evals=(golden,))
    record = _finished(agent)

    assert record["state"] == "succeeded", record
    assert b"model: llama3.1-8b" in (agent.config_bytes() or b"")
    [result] = record["evals"]
    assert (result["name"], result["passed"], result["total"], result["passRate"]) == (
        "golden", 3, 3, 100.0,
    )  # fmt: skip
    assert result["suiteSha256"] == "ab" * 32
    assert [(c["name"], c["ok"]) for c in result["cases"]] == [
        ("capital", True), ("greeting", True), ("story", True),
    ]  # fmt: skip
    assert result["cases"][0]["answer"].strip() == cases[0]["expect"]["equals"]
    assert log.read_text().split("\n")[:-1] == [
        "drain llama3.1-8b", "after-apply llama3.1-8b", "undrain llama3.1-8b",
    ]  # fmt: skip
    timings = record["timings"]
    assert timings["warmedAt"] is not None and timings["warmedAt"] <= timings["servingAt"]
    assert _evals_counted(agent) == (1, 0)


def test_an_answer_of_http_500_is_a_case_that_does_not_hold(
    started: tuple[RealAgent, Path], key: SigningKey
) -> None:
    """Stand-in: one case answers 500, which a real llama-server does not do
    on cue; the suite holds at 75% all the same."""
    agent, _ = started
    replies = {**ALL_HOLD, "Say hello": Reply(status=500)}
    with OpenAIStandIn(replies) as runtime:
        golden = Eval("golden", "golden", runtime.url, 75.0, 60, suite=_suite())
        _post(agent, key, runtime.url, evals=(golden,))
        record = _finished(agent)
        asked = runtime.asked

    assert record["state"] == "succeeded", record
    [result] = record["evals"]
    assert [(c["name"], c["ok"]) for c in result["cases"]] == [
        ("capital", True), ("refund", True), ("greeting", False), ("quick", True),
    ]  # fmt: skip
    assert result["cases"][0]["answer"] == " Paris."
    assert result["cases"][2]["detail"] == "answered HTTP 500"
    assert asked[0] == {
        "prompt": "The capital of France is", "max_tokens": 64, "temperature": 0.0, "seed": 1,
    }  # fmt: skip


def test_a_suite_below_its_minimum_fails_eval_failed_and_the_old_config_serves_again(
    started: tuple[RealAgent, Path], key: SigningKey
) -> None:
    """Stand-in: a 500, a text that is not JSON, and a case slower than its maxSeconds."""
    agent, log = started
    replies = {
        **ALL_HOLD,
        "The capital of France is": Reply(status=500),
        "Reply with the refund as JSON": Reply("Sure! The refund is 12 dollars."),
        "Answer fast": Reply("ok", delay=1.5),
    }
    with OpenAIStandIn(replies) as runtime:
        _post(agent, key, runtime.url)
        record = _finished(agent)

    assert record["state"] == "failed"
    error = record["error"]
    assert error.startswith("eval_failed: golden: 1 of 4 cases held (25%; minimum 100%)")
    assert 'capital expected contains "Paris", got answered HTTP 500' in error
    assert "refund expected jsonSchema" in error and "'Sure! The refund is 12 dollars.'" in error
    assert 'quick expected equals "ok", got no answer within 0.5s' in error
    assert error.endswith("; previous config restored, after-apply run again for it; undrained")
    assert agent.config_bytes() == OLD_CONFIG
    assert log.read_text().split("\n")[:-1] == [
        "drain llama3.1-8b", "after-apply llama3.1-8b", "after-apply old", "undrain old",
    ]  # fmt: skip
    cases = {c["name"]: c for c in record["evals"][0]["cases"]}
    assert cases["refund"]["detail"].startswith("not JSON")
    assert cases["refund"]["answer"] == "Sure! The refund is 12 dollars."
    assert _evals_counted(agent) == (0, 1)


def test_a_suite_past_its_timeout_fails_even_though_every_case_answered_held(
    started: tuple[RealAgent, Path], key: SigningKey
) -> None:
    """Stand-in: every answer takes 0.6 s, so a 1 s suite cannot finish."""
    agent, _ = started
    replies = {prompt: Reply(r.text, delay=0.6) for prompt, r in ALL_HOLD.items()}
    with OpenAIStandIn(replies) as runtime:
        cases = [c for c in CASES if c["name"] != "quick"]
        golden = Eval("golden", "golden", runtime.url, 0.0, 1, suite=_suite(cases))
        _post(agent, key, runtime.url, evals=(golden,))
        record = _finished(agent)

    assert record["state"] == "failed"
    assert "the suite ran past its timeout" in record["error"]
    assert agent.config_bytes() == OLD_CONFIG


def _slow_suite(server: LlamaServer) -> Eval:
    """Three cases of the slow model's own answers, 96 tokens each: each
    answer takes long enough for the test to act while one is computed."""
    cases = _golden_from(server.url, max_tokens=SLOW_TOKENS)
    suite = replace(_suite(cases), max_tokens=SLOW_TOKENS)
    return Eval("golden", "golden", server.url, 100.0, 120, suite=suite)


def _answering(server: LlamaServer, finished_before: float = 0) -> bool:
    """The server computes an answer, and has finished more tokens than
    ``finished_before`` (llama.cpp counts a request's tokens when it ends)."""
    done = metric(server.url, "llamacpp:tokens_predicted_total") or 0
    return done > finished_before and (metric(server.url, IDLE_METRICS[0]) or 0) >= 1


def test_a_runtime_that_dies_mid_suite_fails_the_rest_and_the_old_config_serves(
    started: tuple[RealAgent, Path], key: SigningKey, slow_model: LlamaServer
) -> None:
    """The real llama-server is SIGKILLed once the first case has been
    answered and another is being computed."""
    agent, _ = started
    golden = _slow_suite(slow_model)
    before = metric(slow_model.url, "llamacpp:tokens_predicted_total") or 0
    _post(agent, key, slow_model.url, IDLE_METRICS[0], evals=(golden,))
    wait_for(lambda: _answering(slow_model, before), timeout=60, what="a second case")
    assert slow_model.process is not None
    os.kill(slow_model.process.pid, signal.SIGKILL)
    slow_model.process.wait(10)
    record = _finished(agent)

    assert record["state"] == "failed"
    assert record["error"].startswith("eval_failed: golden: ")
    cases = record["evals"][0]["cases"]
    assert cases[0]["ok"] and not cases[-1]["ok"], cases
    failed = [c for c in cases if not c["ok"]]
    assert all(c["detail"].startswith("request failed") for c in failed), failed
    assert agent.config_bytes() == OLD_CONFIG


def test_an_agent_killed_during_its_evals_comes_back_on_the_old_config_undrained(
    started: tuple[RealAgent, Path], key: SigningKey, slow_model: LlamaServer
) -> None:
    """The agent is SIGKILLed while the real llama-server computes one of
    its cases: the new config is written and not yet evaluated."""
    agent, log = started
    golden = _slow_suite(slow_model)
    _post(agent, key, slow_model.url, IDLE_METRICS[0], evals=(golden,))
    # The config first: until the drain has seen the server idle, a request
    # the server is still counting from the suite's own making would pass
    # for a case being answered.
    wait_for(
        lambda: b"model: llama3.1-8b" in (agent.config_bytes() or b""),
        timeout=60,
        what="the new config written",
    )
    wait_for(lambda: _answering(slow_model), timeout=60, what="a case being answered")
    os.kill(agent.process.pid, signal.SIGKILL)
    agent.process.wait(10)
    agent.restart()
    record = _finished(agent)

    assert record["state"] == "failed"
    assert record["error"].startswith("eval_failed: agent restarted before the job's evals held")
    assert record["error"].endswith("after-apply run again for it; undrained")
    assert agent.config_bytes() == OLD_CONFIG
    assert log.read_text().split("\n")[:-1] == [
        "drain llama3.1-8b", "after-apply llama3.1-8b", "after-apply old", "undrain old",
    ]  # fmt: skip
    assert agent.get("heartbeat")["runtimes"][0]["model"] == "old"


@pytest.mark.parametrize(
    ("expect", "answer", "held"),
    [
        ({"equals": "ok"}, "  ok\n", True),
        ({"equals": "ok"}, "ok then", False),
        ({"contains": "Paris"}, "It is Paris.", True),
        ({"notContains": "sorry"}, "I am sorry", False),
        ({"regex": r"\d{2}"}, "costs 12", True),
        ({"jsonSchema": {"type": "object", "required": ["amount"]}}, ' {"amount": 1}\n', True),
        ({"jsonSchema": {"type": "object", "required": ["amount"]}}, '{"total": 1}', False),
        ({"matchesBaseline": True}, " same text ", True),
        ({"matchesBaseline": {"minSimilarity": 0.9}}, "same text!", True),
        ({"matchesBaseline": {"minSimilarity": 0.9}}, "other words", False),
    ],
)
def test_each_expectation_is_judged_as_written(expect: Any, answer: str, held: bool) -> None:
    case = {"name": "c", "prompt": "p", "expect": expect, "baselineAnswer": "same text"}

    assert judge(case, answer)[0] is held
