"""Evals (docs/evals.md): golden-prompt suites (``evals/NAME.yaml``) and a
rollout's ``health.evals`` that name them, as values; the checks of a
suite the schema cannot say; and their plain-data forms: the record kept
in status (``frozen.evals``) and what a live apply job carries (``evals``).
The checks of a suite file are in ``eval_documents``.

A rollout's eval is read from its file without its suite; ``resolve``
joins the suite in (its cases and the SHA-256 of its file's bytes), so a
started rollout keeps the suite as it was at its start commit.

Pure: no IO, no clock.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from reconciler.spec.durations import format_duration, parse_duration

API_ROUTES = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
EXPECTATIONS = ("equals", "contains", "notContains", "regex", "jsonSchema", "matchesBaseline")
DEFAULT_MAX_TOKENS = 64
DEFAULT_TEMPERATURE = 0.0
DEFAULT_MIN_PASS_RATE = 100.0  # percent
DEFAULT_TIMEOUT = 300  # seconds, the whole suite on one node
DEFAULT_BASELINE_COUNT = 1


@dataclass(frozen=True)
class EvalCase:
    """One golden prompt: ``prompt`` (completions) or ``messages`` (chat),
    and one expectation, its value kept as canonical JSON so the case stays
    hashable."""

    name: str
    expect_kind: str
    expect_json: str
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    max_seconds: float | None = None

    @property
    def expect_value(self) -> Any:
        return json.loads(self.expect_json)


@dataclass(frozen=True)
class EvalSuite:
    name: str
    sha256: str  # of the file's bytes, lowercase hex
    cases: tuple[EvalCase, ...]
    api: str = "completions"
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = DEFAULT_TEMPERATURE
    seed: int | None = None


@dataclass(frozen=True)
class Eval:
    """One of a rollout's ``health.evals``; ``suite`` is None until
    ``resolve`` found the suite it names (``suite_name``)."""

    name: str
    suite_name: str
    url: str
    min_pass_rate: float = DEFAULT_MIN_PASS_RATE  # percent
    timeout: int = DEFAULT_TIMEOUT  # seconds
    baseline_count: int = DEFAULT_BASELINE_COUNT
    baseline_node_ids: tuple[str, ...] | None = None
    suite: EvalSuite | None = None

    def describe(self) -> str:
        """One line for people (plan, status)."""
        cases = len(self.suite.cases) if self.suite is not None else 0
        baseline = (
            ", ".join(self.baseline_node_ids)
            if self.baseline_node_ids
            else f"{self.baseline_count} node{'s' if self.baseline_count != 1 else ''}"
        )
        return (
            f"{self.name}: suite {self.suite_name} ({cases} case{'s' if cases != 1 else ''}), "
            f"minimum pass rate {_percent(self.min_pass_rate)}, baseline {baseline}"
        )


def _percent(value: float) -> str:
    return f"{value:g}%"


def parse_percent(text: str) -> float:
    """``"90%"`` -> 90.0; ValueError outside 0-100%."""
    value = float(text.rstrip("%"))
    if not 0 <= value <= 100:
        raise ValueError(f"{text} is outside 0% to 100%: give a share such as 90%")
    return value


# --- suite documents ------------------------------------------------------------


def suite_from_document(name: str, data: bytes, doc: Mapping[str, Any]) -> EvalSuite:
    """A suite the schema and ``suite_problems`` have checked."""
    spec = doc["spec"]
    request = spec.get("request", {})
    return EvalSuite(
        name=name,
        sha256=hashlib.sha256(data).hexdigest(),
        cases=tuple(case_from_document(c) for c in spec["cases"]),
        api=spec.get("api", "completions"),
        max_tokens=request.get("maxTokens", DEFAULT_MAX_TOKENS),
        temperature=float(request.get("temperature", DEFAULT_TEMPERATURE)),
        seed=request.get("seed"),
    )


def case_from_document(case: Mapping[str, Any]) -> EvalCase:
    [(kind, value)] = case["expect"].items()
    messages = case.get("messages")
    seconds = case.get("maxSeconds")
    return EvalCase(
        name=case["name"],
        expect_kind=kind,
        expect_json=_canonical(value),
        prompt=case.get("prompt"),
        messages=None if messages is None else tuple((m["role"], m["content"]) for m in messages),
        max_seconds=None if seconds is None else float(seconds),
    )


def case_document(case: EvalCase) -> dict[str, Any]:
    """The case as a suite file writes it (the status record and the payload)."""
    out: dict[str, Any] = {"name": case.name}
    if case.prompt is not None:
        out["prompt"] = case.prompt
    if case.messages is not None:
        out["messages"] = [{"role": r, "content": c} for r, c in case.messages]
    out["expect"] = {case.expect_kind: case.expect_value}
    if case.max_seconds is not None:
        out["maxSeconds"] = case.max_seconds
    return out


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# --- a rollout's evals ----------------------------------------------------------


def evals_from_document(entries: Sequence[Mapping[str, Any]]) -> tuple[Eval, ...]:
    """``spec.health.evals`` as checked, suites not yet resolved."""
    out = []
    for entry in entries:
        baseline = entry.get("baseline", {})
        node_ids = baseline.get("nodeIds")
        timeout = entry.get("timeout")
        out.append(
            Eval(
                name=entry["name"],
                suite_name=entry["suite"],
                url=entry["url"],
                min_pass_rate=parse_percent(entry.get("minPassRate", "100%")),
                timeout=parse_duration(timeout) if isinstance(timeout, str) else DEFAULT_TIMEOUT,
                baseline_count=baseline.get("count", DEFAULT_BASELINE_COUNT),
                baseline_node_ids=None if node_ids is None else tuple(node_ids),
            )
        )
    return tuple(out)


def resolve(evals: tuple[Eval, ...], suites: Mapping[str, EvalSuite]) -> tuple[Eval, ...]:
    """Each eval with its suite joined in (an eval naming no suite keeps None)."""
    return tuple(replace(e, suite=suites.get(e.suite_name)) for e in evals)


def uses_baseline(evals: Sequence[Eval]) -> bool:
    return any(c.expect_kind == "matchesBaseline" for e in evals if e.suite for c in e.suite.cases)


# --- records and payloads -------------------------------------------------------


def frozen_record(evals: Sequence[Eval]) -> list[dict[str, Any]]:
    """``frozen.evals``: each eval with its suite's digest and cases whole."""
    out = []
    for e in evals:
        assert e.suite is not None, "a started rollout's evals are resolved"
        baseline: dict[str, Any] = {"count": e.baseline_count}
        if e.baseline_node_ids is not None:
            baseline["nodeIds"] = list(e.baseline_node_ids)
        out.append(
            {
                "name": e.name,
                "suite": e.suite_name,
                "url": e.url,
                "minPassRate": _percent(e.min_pass_rate),
                "timeout": format_duration(e.timeout),
                "baseline": baseline,
                "suiteSha256": e.suite.sha256,
                "api": e.suite.api,
                "request": _request(e.suite),
                "cases": [case_document(c) for c in e.suite.cases],
            }
        )
    return out


def frozen_from(records: Sequence[Mapping[str, Any]]) -> tuple[Eval, ...]:
    out = []
    for r in records:
        request = r["request"]
        baseline = r["baseline"]
        node_ids = baseline.get("nodeIds")
        suite = EvalSuite(
            name=r["suite"],
            sha256=r["suiteSha256"],
            cases=tuple(case_from_document(c) for c in r["cases"]),
            api=r["api"],
            max_tokens=request["maxTokens"],
            temperature=float(request["temperature"]),
            seed=request.get("seed"),
        )
        out.append(
            Eval(
                name=r["name"],
                suite_name=r["suite"],
                url=r["url"],
                min_pass_rate=parse_percent(r["minPassRate"]),
                timeout=parse_duration(r["timeout"]),
                baseline_count=baseline["count"],
                baseline_node_ids=None if node_ids is None else tuple(node_ids),
                suite=suite,
            )
        )
    return tuple(out)


def _request(suite: EvalSuite) -> dict[str, Any]:
    request: dict[str, Any] = {"maxTokens": suite.max_tokens, "temperature": suite.temperature}
    if suite.seed is not None:
        request["seed"] = suite.seed
    return request


def to_payload(
    evals: Sequence[Eval],
    node: str,
    baseline: Sequence[tuple[str, Sequence[tuple[str, str]]]] = (),
) -> list[dict[str, Any]]:
    """What a live apply or eval job carries: ``[{name, url, minPassRate,
    timeout, api, request, suiteSha256, cases}]``, ``{node}`` replaced in
    the URL, ``minPassRate`` in percent and ``timeout`` in seconds; each
    case with an answer in ``baseline`` (eval -> case -> answer) carries
    it as ``baselineAnswer``."""
    answers = {name: dict(cases) for name, cases in baseline}
    out = []
    for e in evals:
        assert e.suite is not None
        given = answers.get(e.name, {})
        out.append(
            {
                "name": e.name,
                "url": e.url.replace("{node}", node),
                "minPassRate": e.min_pass_rate,
                "timeout": e.timeout,
                "api": e.suite.api,
                "request": _request(e.suite),
                "suiteSha256": e.suite.sha256,
                "cases": [_with_answer(case_document(c), given.get(c.name)) for c in e.suite.cases],
            }
        )
    return out


def _with_answer(case: dict[str, Any], answer: str | None) -> dict[str, Any]:
    if answer is not None and "matchesBaseline" in case["expect"]:
        case["baselineAnswer"] = answer
    return case


# --- results ----------------------------------------------------------------------


def check_outcomes(
    results: Sequence[Mapping[str, Any]], evals: Sequence[Eval]
) -> list[tuple[str, bool, str]]:
    """Each eval's result in a job record as a node check: (name, ok,
    ``3 of 4 cases held (75%; minimum 100%)``), the minimum as frozen."""
    minimum = {e.name: e.min_pass_rate for e in evals}
    out = []
    for result in results:
        least = minimum.get(result["name"], DEFAULT_MIN_PASS_RATE)
        passed, total, rate = result["passed"], result["total"], result["passRate"]
        ran = sum(1 for _ in result["cases"])
        words = f"{passed} of {total} cases held ({rate:g}%; minimum {_percent(least)})"
        if ran < total:
            words += f"; {total - ran} not run: the suite ran past its timeout"
        out.append((result["name"], ran == total and rate >= least, words))
    return out
