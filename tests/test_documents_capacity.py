"""Documents: ``spreadBy`` and ``failureBudget`` (docs/capacity.md), read
when good and refused with file:line:col, the field and what to do when
bad; a bad one affects only its own rollout."""

from __future__ import annotations

import pytest

from reconciler.spec.documents import assemble, parse_file
from reconciler.spec.model import SpreadBy

SETTINGS = b"apiVersion: reconciler/v1\nkind: Settings\nspec:\n  defaults: {onFailure: observe}\n"


def rollout(name: str, body: str) -> tuple[str, bytes]:
    text = (
        "apiVersion: reconciler/v1\nkind: Rollout\n"
        f"metadata: {{name: {name}}}\nspec:\n"
        "  target: {runtime: hermes, provider: ollama, model: llama3.1-8b}\n"
        "  selector: {role: canary}\n" + body
    )
    return f"rollouts/{name}.yaml", text.encode()


def problems(body: str, *, settings: bytes | None = None) -> list[str]:
    files = [parse_file(*rollout("r", body)), parse_file(*rollout("fine", ""))]
    if settings is not None:
        files.append(parse_file("reconciler.yaml", settings))
    documents = assemble(files)
    assert "fine" in documents.rollouts  # nothing else is affected
    return [str(p) for p in documents.problems]


def test_spread_by_and_a_budget_are_read() -> None:
    parsed = parse_file(
        *rollout(
            "r",
            '  batchSize: 3\n  spreadBy: {label: zone, maxPerBatch: "50%"}\n'
            "  onFailure: observe\n  failureBudget: 2\n",
        )
    )
    assert parsed.problems == () and parsed.rollout is not None
    assert parsed.rollout.spread_by == SpreadBy("zone", "50%")
    assert parsed.rollout.failure_budget == 2


def test_a_label_that_is_not_a_label_key_is_refused() -> None:
    assert problems("  spreadBy: {label: -zone, maxPerBatch: 1}\n") == [
        "rollouts/r.yaml:7:21: spec.spreadBy.label: a label key must be 1 to 63 characters "
        "of letters, digits, '.', '_', '/' and '-', starting and ending with a letter or "
        'digit; got "-zone"'
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "must be at least 1 node, got 0"),
        ('"101%"', 'a percentage must be from "1%" to "100%", got "101%"'),
        ('"0%"', 'a percentage must be from "1%" to "100%", got "0%"'),
        ("half", 'must be a whole number of nodes or a percentage such as "10%", got "half"'),
        ("1.5", 'must be a whole number of nodes or a percentage in quotes such as "10%", got 1.5'),
    ],
)
def test_a_max_per_batch_that_is_not_a_count_or_percentage_is_refused(
    value: str, message: str
) -> None:
    (problem,) = problems(f"  spreadBy: {{label: zone, maxPerBatch: {value}}}\n")
    assert problem == f"rollouts/r.yaml:7:40: spec.spreadBy.maxPerBatch: {message}"


def test_a_budget_under_another_policy_is_refused_with_what_to_do() -> None:
    assert problems("  onFailure: pause\n  failureBudget: 1\n") == [
        "rollouts/r.yaml:8:18: spec.failureBudget: failureBudget needs onFailure: observe, "
        "which records failures and goes on; under onFailure pause every failure holds "
        "already: set onFailure: observe, or remove failureBudget"
    ]


def test_a_budget_under_the_default_policy_of_the_settings_is_refused_too() -> None:
    (problem,) = problems("  failureBudget: 1\n")
    assert problem.startswith("rollouts/r.yaml:7:18: spec.failureBudget: ")
    assert "under onFailure pause (the default of reconciler.yaml)" in problem


def test_a_budget_under_an_observe_default_of_the_settings_is_read() -> None:
    assert problems("  failureBudget: 1\n", settings=SETTINGS) == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", "must be 0 or more failed nodes, got -1"),
        ('"120%"', 'a percentage must be from "0%" to "100%", got "120%"'),
        (
            "lots",
            'must be a whole number of failed nodes or a percentage such as "10%", got "lots"',
        ),
        (
            "true",
            'must be a whole number of failed nodes or a percentage in quotes such as "10%", got True',
        ),
    ],
)
def test_a_budget_that_is_not_a_count_or_percentage_is_refused(value: str, message: str) -> None:
    (problem,) = problems(f"  onFailure: observe\n  failureBudget: {value}\n")
    assert problem == f"rollouts/r.yaml:8:18: spec.failureBudget: {message}"
