"""The rules of an eval suite file (``evals/NAME.yaml``) that its schema
cannot say, each reported at its field: case names unique, the input
matching ``api``, exactly one expectation, a regex that compiles, a JSON
Schema that is valid 2020-12; and those of a rollout's ``health.evals``.

Kept apart from ``evals`` (the values), which the engine imports: this
module uses ``re`` and jsonschema. Must not: read files.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]

from reconciler.spec.evals import EXPECTATIONS, parse_percent
from reconciler.spec.health import http_url_problem
from reconciler.spec.safe_yaml import format_field
from reconciler.spec.slot_port import url_to_check

Add = Callable[[Sequence[str | int], str], None]


def suite_problems(spec: Mapping[str, Any], add: Add, ok: Callable[[str], bool]) -> None:
    """The rules of one suite the schema cannot say, each at its field:
    case names unique, the input matching ``api``, one expectation, a regex
    that compiles, a JSON Schema that is valid 2020-12."""
    api = spec.get("api", "completions")
    cases = spec.get("cases")
    if not isinstance(cases, list):
        return
    seen: set[str] = set()
    for index, case in enumerate(cases):
        if not isinstance(case, dict):
            continue
        where: list[str | int] = ["spec", "cases", index]
        name = case.get("name")
        if isinstance(name, str):
            if name in seen:
                add([*where, "name"], f"case name {name!r} is used twice: give each case its own")
            seen.add(name)
        _input_problems(case, api, where, add)
        expect = case.get("expect")
        if isinstance(expect, dict) and ok(format_field([*where, "expect"])):
            _expect_problems(expect, [*where, "expect"], add)


def _input_problems(case: Mapping[str, Any], api: Any, where: list[str | int], add: Add) -> None:
    has_prompt, has_messages = "prompt" in case, "messages" in case
    if has_prompt and has_messages:
        add([*where, "messages"], "give prompt or messages, not both")
    elif api == "chat" and not has_messages:
        add(where, "with api: chat every case needs messages: [{role: user, content: ...}]")
    elif api != "chat" and not has_prompt:
        add(
            where, "with api: completions (the default) every case needs a prompt; or set api: chat"
        )
    elif api == "chat" and has_prompt:
        add([*where, "prompt"], "with api: chat a case gives messages, not prompt")


def _expect_problems(expect: Mapping[str, Any], where: list[str | int], add: Add) -> None:
    kinds = [k for k in EXPECTATIONS if k in expect]
    if len(kinds) != 1:
        add(where, f"give exactly one expectation: one of {', '.join(EXPECTATIONS)}")
        return
    kind = kinds[0]
    value = expect[kind]
    if kind == "regex" and isinstance(value, str):
        try:
            re.compile(value)
        except re.error as exc:
            add([*where, "regex"], f"the regular expression does not compile: {exc}")
    elif kind == "jsonSchema":
        try:
            Draft202012Validator.check_schema(value)
        except SchemaError as exc:
            add(
                [*where, "jsonSchema", *exc.path],
                f"not a valid JSON Schema (2020-12): {exc.message}",
            )


def rollout_problems(
    health: Mapping[str, Any],
    live: bool,
    standby: bool,
    add: Add,
    ok: Callable[[str], bool],
    duration: Callable[[list[str | int], Any], Any],
) -> None:
    """A rollout's ``health.evals``: live rollouts only; names unique among
    checks, comparisons and evals; a pass rate within 0-100%; a URL on the
    node itself; a timeout that parses."""
    if not live:
        # At the first entry's name, so the entries' own problems still show.
        add(
            ["spec", "health", "evals", 0, "name"],
            "evals run on the node during a live apply: set live: true, or remove evals",
        )
    taken = {
        c["name"]
        for key in ("checks", "compare")
        for c in health.get(key) or ()
        if isinstance(c, dict) and isinstance(c.get("name"), str)
    }
    for index, entry in enumerate(health["evals"]):
        if not isinstance(entry, dict):
            continue
        where: list[str | int] = ["spec", "health", "evals", index]
        name = entry.get("name")
        if isinstance(name, str):
            if name in taken:
                add(
                    [*where, "name"],
                    f"the name {name!r} is already used by a check, comparison or eval of "
                    "this rollout: give each its own name",
                )
            taken.add(name)
        rate = entry.get("minPassRate")
        if isinstance(rate, str) and ok(format_field([*where, "minPassRate"])):
            try:
                parse_percent(rate)
            except ValueError as exc:
                add([*where, "minPassRate"], str(exc))
        duration([*where, "timeout"], entry.get("timeout"))
        url = entry.get("url")
        if isinstance(url, str) and ok(format_field([*where, "url"])):
            checked, problem = url_to_check(url, standby)
            problem = problem or http_url_problem(checked)
            if problem:
                add([*where, "url"], problem)
