"""The schemas themselves: valid 2020-12, documented, closed, defaults equal
to the model's, found where the package is, and the compiled check agreeing
with jsonschema."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.spec import artifact_rules, artifacts, model, safe_yaml, schemas
from reconciler.spec.durations import parse_duration
from tests.corpus import cases

MINE = ("node", "rollout", "settings")
REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", MINE)
def test_each_schema_is_valid_2020_12_with_a_stable_id(name: str) -> None:
    schema = schemas.load_schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == f"https://reconciler.invalid/schemas/{name}.schema.json"


def test_schema_path_finds_the_files_of_this_checkout() -> None:
    for name in MINE:
        assert schemas.schema_path(name) == REPO / "schemas" / f"{name}.schema.json"
    with pytest.raises(FileNotFoundError):
        schemas.schema_path("nonesuch")


def test_validators_are_built_once() -> None:
    assert schemas.validator("rollout") is schemas.validator("rollout")
    assert schemas.fast_check("rollout") is schemas.fast_check("rollout")


def _properties(node: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        for key, sub in node.get("properties", {}).items():
            yield f"{where}.{key}".lstrip("."), sub
        for key, sub in node.items():
            if key == "properties":
                for name, inner in sub.items():
                    yield from _properties(inner, f"{where}.{name}".lstrip("."))
            elif key not in ("$defs", "default", "examples", "const", "enum"):
                yield from _properties(sub, where)
    elif isinstance(node, list):
        for sub in node:
            yield from _properties(sub, where)


@pytest.mark.parametrize("name", MINE)
def test_every_field_is_described_and_every_object_closed(name: str) -> None:
    schema = schemas.load_schema(name)
    for field, sub in _properties(schema):
        assert sub.get("description"), f"{name}: {field} has no description"
        if sub.get("type") == "object" and "properties" in sub:
            assert sub.get("additionalProperties") is False, f"{name}: {field} is open"
    assert schema["additionalProperties"] is False


def _default(name: str, *path: str) -> Any:
    node: Any = schemas.load_schema(name)
    for part in path:
        node = node["properties"][part]
    return node["default"]


def test_schema_defaults_equal_the_model_defaults() -> None:
    spec = model.RolloutSpec(name="x", target=model.Target("r", "p", "m"))
    rollout = ("spec",)
    assert _default("rollout", *rollout, "batchSize") == spec.batch_size
    assert parse_duration(_default("rollout", *rollout, "healthTimeout")) == spec.health_timeout
    assert _default("rollout", *rollout, "onFailure") == spec.on_failure
    assert _default("rollout", *rollout, "live") is spec.live
    assert _default("rollout", *rollout, "pauseAfter") == list(spec.pause_after)
    assert _default("rollout", *rollout, "includeMaintenance") is spec.include_maintenance
    assert _default("rollout", *rollout, "allowOverlap") is spec.allow_overlap
    assert _default("rollout", *rollout, "paused") is spec.paused
    assert _default("rollout", *rollout, "abort") is spec.abort
    assert _default("rollout", *rollout, "resumeRequest") == spec.resume_request
    assert _default("rollout", *rollout, "skipNodes") == list(spec.skip_nodes)
    assert _default("rollout", *rollout, "target", "profile") == spec.target.profile
    stage = artifacts.Stage()
    assert _default("rollout", *rollout, "stage", "ahead") == stage.ahead
    assert _default("rollout", *rollout, "stage", "maxConcurrent") == stage.max_concurrent
    assert parse_duration(_default("rollout", *rollout, "stage", "timeout")) == (
        stage.timeout_seconds
    )
    assert parse_duration(_default("rollout", *rollout, "drain", "timeout")) == (
        artifact_rules.DEFAULT_DRAIN_TIMEOUT
    )
    warmup = schemas.load_schema("rollout")["properties"]["spec"]["properties"]["warmup"]
    http = warmup["items"]["properties"]["http"]["properties"]
    default = artifacts.Warmup("http://x")
    assert http["method"]["default"] == default.method
    assert http["method"]["enum"] == list(artifacts.WARMUP_METHODS)
    assert http["body"]["default"] == default.body
    assert http["expectStatus"]["default"] == default.expect_status
    assert parse_duration(http["timeout"]["default"]) == default.timeout_seconds
    assert warmup["items"]["properties"]["times"]["default"] == default.times

    node = model.Node(name="x", agent="http://h")
    assert _default("node", "spec", "labels") == dict(node.labels)
    assert _default("node", "spec", "maintenance") is node.maintenance

    settings_ = model.Settings()
    assert parse_duration(_default("settings", "spec", "offlineAfter")) == settings_.offline_after
    defaults = ("spec", "defaults")
    assert _default("settings", *defaults, "batchSize") == settings_.defaults.batch_size
    assert (
        parse_duration(_default("settings", *defaults, "healthTimeout"))
        == settings_.defaults.health_timeout
    )
    assert _default("settings", *defaults, "onFailure") == settings_.defaults.on_failure
    assert schemas.load_schema("rollout")["$defs"]["onFailure"]["enum"] == list(
        model.ON_FAILURE_MODES
    )


# --- the compiled check agrees with jsonschema ----------------------------------------

_KIND_SCHEMA = {"Node": "node", "Rollout": "rollout", "Settings": "settings"}


def _documents() -> list[tuple[str, Any]]:
    """Every corpus and example document that is YAML at all, with its schema."""
    found: list[tuple[str, Any]] = []
    sources = [(c.path, c.data) for c in cases()]
    example = REPO / "example-repo"
    sources += [
        (p.relative_to(example).as_posix(), p.read_bytes()) for p in example.rglob("*.yaml")
    ]
    for path, data in sources:
        try:
            doc = safe_yaml.load_yaml(path, data)
        except safe_yaml.YamlProblem:
            continue
        folder = path.split("/")[0]
        name = {"nodes": "node", "rollouts": "rollout"}.get(folder)
        if path == "reconciler.yaml":
            name = "settings"
        if name:
            found.append((name, doc))
    return found


def test_the_compiled_check_agrees_on_every_corpus_and_example_document() -> None:
    documents = _documents()
    assert len(documents) > 50
    disagreements = [
        (name, doc)
        for name, doc in documents
        if schemas.fast_check(name)(doc) != schemas.validator(name).is_valid(doc)
    ]
    assert disagreements == []


GOOD_ROLLOUT = {
    "apiVersion": "reconciler/v1",
    "kind": "Rollout",
    "metadata": {"name": "llama"},
    "spec": {
        "target": {"runtime": "hermes", "provider": "ollama", "model": "m", "profile": "p"},
        "selector": {"role": "canary"},
        "batchSize": 2,
        "healthTimeout": "5m",
        "live": True,
        "onFailure": "rollback",
        "pauseAfter": [1, 2],
        "startAt": "2026-12-01T09:00:00Z",
        "skipNodes": ["a"],
        "rollbackRequest": {"id": "r1", "nodes": "all"},
    },
}

odd_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 3),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "all", "5m", "0s", "x y", "A", "a" * 64, "reconciler/v1", "Rollout"]),
    st.lists(st.sampled_from(["a", "B", 1, "a"]), max_size=3),
    st.dictionaries(
        st.sampled_from(["role", "-x", "id", "nodes"]), st.sampled_from(["v", 1]), max_size=2
    ),
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, sub in value.items():
            out += _paths(sub, (*prefix, key))
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            out += _paths(sub, (*prefix, index))
    return out


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_the_compiled_check_agrees_on_mutated_rollouts(data: st.DataObject) -> None:
    doc = copy.deepcopy(GOOD_ROLLOUT)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        path = data.draw(st.sampled_from(paths))
        parent: Any = doc
        for part in path[:-1]:
            parent = parent[part]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[data.draw(st.sampled_from(["nodeIds", "extra", "batchSize"]))] = data.draw(
                odd_values
            )
        else:
            parent[path[-1]] = data.draw(odd_values)
    expected = schemas.validator("rollout").is_valid(doc)
    assert schemas.fast_check("rollout")(doc) == expected, json.dumps(doc)
