"""A live apply's evals on the node (docs/evals.md): each case of each
suite the signed job carries is sent, in order, to the runtime's
OpenAI-compatible route, and its first choice's text judged against the
case's expectation. The outcome is one result per eval (kept in the signed
job record) and, for the job, whether every eval reached its minimum pass
rate within its timeout.

Only the node itself is asked (loopback or one of its own addresses), as
for warm-up. Must not: write configs or run commands (``live_switch`` and
``job_runner`` decide what a failure puts back).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]
from rapidfuzz import fuzz

from reconciler.node.probes import ProbeFailed, own_addresses
from reconciler.protocol.job_view import EvalSuite

ROUTES = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
ANSWER_LIMIT = 2000  # characters of an answer kept in the job record
WORDS_LIMIT = 200  # characters of expected and got in the failure message


@dataclass(frozen=True)
class CaseResult:
    name: str
    ok: bool
    answer: str
    detail: str
    seconds: float
    expected: str

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "answer": self.answer[:ANSWER_LIMIT],
            "detail": self.detail,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class EvalResult:
    name: str
    suite_sha256: str
    min_pass_rate: float
    cases: tuple[CaseResult, ...]
    total: int
    timed_out: bool = False

    @property
    def passed(self) -> int:
        return sum(1 for c in self.cases if c.ok)

    @property
    def pass_rate(self) -> float:
        return round(100.0 * self.passed / self.total, 2) if self.total else 100.0

    @property
    def held(self) -> bool:
        return not self.timed_out and self.pass_rate >= self.min_pass_rate

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "suiteSha256": self.suite_sha256,
            "passed": self.passed,
            "total": self.total,
            "passRate": self.pass_rate,
            "cases": [c.record() for c in self.cases],
        }

    def failure_words(self) -> str:
        """``golden: 1 of 2 cases held (50%; minimum 100%); capital expected
        contains "Paris", got 'Lyon'``: expected and got cut at 200 characters."""
        said = (
            f"{self.name}: {self.passed} of {self.total} cases held "
            f"({self.pass_rate:g}%; minimum {self.min_pass_rate:g}%)"
        )
        if self.timed_out:
            said += "; the suite ran past its timeout"
        for case in self.cases:
            if not case.ok:
                said += (
                    f"; {case.name} expected {_cut(case.expected)}, "
                    f"got {repr(_cut(case.answer)) if case.answer else case.detail}"
                )
        return said


def _cut(text: str) -> str:
    return text if len(text) <= WORDS_LIMIT else text[:WORDS_LIMIT] + "..."


def run_evals(evals: Sequence[EvalSuite]) -> list[EvalResult]:
    """Every eval of a live apply, in order."""
    with httpx.Client(verify=False) as client:  # the node's own runtime, as for warm-up
        return [_run_one(client, e) for e in evals]


def run_baseline(evals: Sequence[EvalSuite]) -> list[EvalResult]:
    """The matchesBaseline cases of each eval, in order, against the
    runtime as it serves: a case holds when it got an answer (within
    ``maxSeconds``), which is what an eval job records."""
    only = [
        replace(e, cases=tuple(c for c in e.cases if "matchesBaseline" in c["expect"]))
        for e in evals
    ]
    with httpx.Client(verify=False) as client:
        return [_run_one(client, e, _answered) for e in only if e.cases]


def _answered(case: Mapping[str, Any], text: str) -> tuple[bool, str]:
    return True, "baseline answer"


def failure(results: Sequence[EvalResult]) -> str | None:
    """``eval_failed: ...`` naming each eval that did not hold, or None."""
    failed = [r for r in results if not r.held]
    if not failed:
        return None
    return "eval_failed: " + "; ".join(r.failure_words() for r in failed)


Judge = Callable[[Mapping[str, Any], str], tuple[bool, str]]


def _run_one(client: httpx.Client, spec: EvalSuite, judged: Judge | None = None) -> EvalResult:
    deadline = time.monotonic() + spec.timeout
    url = spec.url.rstrip("/") + ROUTES[spec.api]
    cases: list[CaseResult] = []
    timed_out = False
    local = _local_problem(url)
    for case in spec.cases:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        if local:
            cases.append(CaseResult(case["name"], False, "", local, 0.0, _expected(case)))
            continue
        cases.append(_run_case(client, url, spec, case, left, judged or judge))
    return EvalResult(
        spec.name,
        spec.suite_sha256,
        spec.min_pass_rate,
        tuple(cases),
        len(spec.cases),
        timed_out or time.monotonic() > deadline,
    )


def _local_problem(url: str) -> str:
    parts = httpx.URL(url)
    try:
        own_addresses(parts.host, parts.port or (443 if parts.scheme == "https" else 80))
    except ProbeFailed as exc:
        return str(exc)
    return ""


def _run_case(
    client: httpx.Client,
    url: str,
    spec: EvalSuite,
    case: Mapping[str, Any],
    left: float,
    judged: Judge,
) -> CaseResult:
    limit = min(left, float(case.get("maxSeconds", left)))
    body = _request_body(spec, case)
    expected = _expected(case)
    started = time.monotonic()
    try:
        answer = client.post(url, json=body, timeout=limit)
    except httpx.TimeoutException:
        seconds = time.monotonic() - started
        return CaseResult(
            case["name"], False, "", f"no answer within {limit:g}s", seconds, expected
        )
    except httpx.HTTPError as exc:
        seconds = time.monotonic() - started
        return CaseResult(case["name"], False, "", f"request failed: {exc}", seconds, expected)
    seconds = time.monotonic() - started
    if answer.status_code != 200:
        detail = f"answered HTTP {answer.status_code}"
        return CaseResult(case["name"], False, "", detail, seconds, expected)
    text = _first_choice(answer, spec.api)
    if text is None:
        detail = "the answer is not an OpenAI-compatible completion (no choices[0] text)"
        return CaseResult(case["name"], False, "", detail, seconds, expected)
    if "maxSeconds" in case and seconds > case["maxSeconds"]:
        detail = f"answered in {seconds:.2f}s, more than maxSeconds {case['maxSeconds']:g}"
        return CaseResult(case["name"], False, text, detail, seconds, expected)
    try:
        ok, detail = judged(case, text)
    except (re.error, SchemaError) as exc:  # validate refuses both; a case that errors fails
        ok, detail = False, f"the expectation cannot be judged: {exc}"
    return CaseResult(case["name"], ok, text, detail, seconds, expected)


def _request_body(spec: EvalSuite, case: Mapping[str, Any]) -> dict[str, Any]:
    request = spec.request
    body: dict[str, Any] = {
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
    }
    if request.seed is not None:
        body["seed"] = request.seed
    if spec.api == "chat":
        body["messages"] = case["messages"]
    else:
        body["prompt"] = case["prompt"]
    return body


def _first_choice(answer: httpx.Response, api: str) -> str | None:
    try:
        choice = answer.json()["choices"][0]
        text = choice["message"]["content"] if api == "chat" else choice["text"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return text if isinstance(text, str) else None


def _expected(case: Mapping[str, Any]) -> str:
    [(kind, value)] = case["expect"].items()
    return f"{kind} {json.dumps(value, ensure_ascii=False)}"


def judge(case: Mapping[str, Any], text: str) -> tuple[bool, str]:
    """Whether ``text`` meets the case's expectation, and why not."""
    [(kind, value)] = case["expect"].items()
    stripped = text.strip()
    if kind == "equals":
        return stripped == value.strip(), "" if stripped == value.strip() else "not equal"
    if kind == "contains":
        return (value in text), "" if value in text else "not contained"
    if kind == "notContains":
        return (value not in text), "" if value not in text else "contained"
    if kind == "regex":
        found = re.search(value, text) is not None
        return found, "" if found else "no match"
    if kind == "jsonSchema":
        return _judge_json(value, stripped)
    return _judge_baseline(value, stripped, case.get("baselineAnswer"))


def _judge_json(schema: Any, stripped: str) -> tuple[bool, str]:
    try:
        document = json.loads(stripped)
    except ValueError as exc:
        return False, f"not JSON: {exc}"
    error = next(iter(Draft202012Validator(schema).iter_errors(document)), None)
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the top"
        return False, f"does not meet the schema at {where}: {error.message}"
    return True, ""


def _judge_baseline(value: Any, stripped: str, baseline: Any) -> tuple[bool, str]:
    if not isinstance(baseline, str):
        return False, "no baseline answer in the job"
    if value is True:
        same = stripped == baseline.strip()
        return same, "" if same else "differs from the baseline answer"
    similarity = fuzz.ratio(stripped, baseline.strip()) / 100
    least = float(value["minSimilarity"])
    if similarity >= least:
        return True, f"similarity {similarity:.2f}"
    return False, f"similarity {similarity:.2f} to the baseline answer, below {least:g}"
