"""Documents with keys missing: every example document a person might start
from, with keys dropped, gives problems with places, never an exception; and
the artifact rules never index a key a document lacks, whether the schema
rejected the document or allowed it."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from reconciler.spec import artifact_rules
from reconciler.spec.documents import assemble, parse_file

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "example-repo"
FENCE = re.compile(r"^```ya?ml\n(.*?)^```", re.M | re.S)
BASE_SPEC = {
    "target": {"runtime": "hermes", "provider": "ollama", "model": "llama3.1-8b"},
    "nodeIds": ["gpu-a1"],
}

_yaml = YAML(typ="safe", pure=True)
_yaml.default_flow_style = False  # a flow mapping cannot hold vllm:num_requests_running plain


def _load(text: str) -> Any:
    return _yaml.load(text)


def _dump(doc: Any) -> bytes:
    out = io.StringIO()
    _yaml.dump(doc, out)
    return out.getvalue().encode()


def _from_docs_block(text: str) -> tuple[str, dict[str, Any]] | None:
    """A docs YAML block as the whole document it is part of: a rollout's
    ``spec:`` over a small valid rollout, a settings ``spec:`` as settings."""
    try:
        doc = _load(text)
    except Exception:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("spec"), dict):
        return None
    kind = doc.get("kind") or ("Settings" if "# reconciler.yaml" in text else "Rollout")
    if kind == "Node":
        return "nodes/gpu-a1.yaml", doc
    if kind == "Settings":
        return "reconciler.yaml", {"apiVersion": "reconciler/v1", "kind": "Settings", **doc}
    spec = {**BASE_SPEC, **doc["spec"]}
    if "selector" in spec:
        del spec["nodeIds"]
    target = {**BASE_SPEC["target"], **spec["target"]}
    return "rollouts/x.yaml", {
        "apiVersion": "reconciler/v1",
        "kind": "Rollout",
        "metadata": {"name": "x"},
        "spec": {**spec, "target": target},
    }


def example_documents() -> list[tuple[str, dict[str, Any]]]:
    """The example repository's documents and the documents of the docs'
    YAML examples."""
    found = [
        (path.relative_to(EXAMPLE).as_posix(), _load(path.read_text()))
        for path in sorted(EXAMPLE.glob("*.yaml")) + sorted(EXAMPLE.glob("*/*.yaml"))
        if path.parent.name in ("nodes", "rollouts") or path.name == "reconciler.yaml"
    ]
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in FENCE.findall(page.read_text()):
            document = _from_docs_block(block)
            if document is not None:
                found.append(document)
    return found


EXAMPLES = example_documents()


def key_paths(node: Any, where: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every mapping key and list item in ``node``, as paths."""
    out: list[tuple[str | int, ...]] = []
    if isinstance(node, dict):
        items: Any = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return out
    for key, value in items:
        out.append((*where, key))
        out.extend(key_paths(value, (*where, key)))
    return out


def without(doc: Any, path: tuple[str | int, ...]) -> Any:
    """``doc`` with the key or item at ``path`` removed (a copy)."""
    head, *rest = path
    if isinstance(doc, dict):
        copy: Any = dict(doc)
    else:
        copy = list(doc)
    if rest:
        copy[head] = without(copy[head], tuple(rest))
    else:
        del copy[head]
    return copy


def test_the_examples_cover_drain_warm_up_artifacts_and_approval_rules() -> None:
    text = repr(EXAMPLES)
    for field in ("'drain'", "'warmup'", "'artifacts'", "'approvalRules'", "'spreadBy'"):
        assert field in text


@st.composite
def an_example_with_keys_dropped(draw: st.DrawFn) -> tuple[str, bytes]:
    path, doc = draw(st.sampled_from(EXAMPLES))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = key_paths(doc)
        if not paths:
            break
        # deep keys first: most of a document's required keys are nested
        doc = without(doc, draw(st.sampled_from(sorted(paths, key=len, reverse=True))))
    return path, _dump(doc)


@settings(max_examples=400, deadline=None)
@given(an_example_with_keys_dropped())
def test_an_example_with_keys_dropped_gives_problems_with_places_never_an_exception(
    example: tuple[str, bytes],
) -> None:
    path, data = example
    node = (EXAMPLE / "nodes" / "gpu-a1.yaml").read_bytes()
    files = {"nodes/gpu-a1.yaml": node, path: data}

    documents = assemble(parse_file(name, body) for name, body in files.items())

    for problem in documents.problems:
        assert problem.message


def test_every_single_key_dropped_from_every_example_never_raises() -> None:
    raised = []
    for path, doc in EXAMPLES:
        for dropped in key_paths(doc):
            try:
                parse_file(path, _dump(without(doc, dropped)))
            except Exception as exc:  # the finding is which key, not the first one
                raised.append(f"{path} without {dropped}: {exc!r}")
    assert raised == []


def test_a_form_the_rules_do_not_read_is_a_problem_not_a_key_error() -> None:
    """Even when the schema check finds nothing (here: every field passes),
    a document missing a key the rules need must not make them raise: the
    missing key becomes a problem at its field."""
    spec = {
        "target": {"runtime": "hermes", "provider": "ollama", "model": "m"},
        "live": True,
        "warmup": [{"times": 2}],
    }
    added: list[tuple[str, str]] = []

    def add(field_path: Any, message: str, *, at_key: bool = False) -> None:
        added.append((".".join(map(str, field_path)), message))

    declared = artifact_rules.read(spec, add, lambda name: True, lambda name: True)

    assert declared == artifact_rules.Declared()
    assert [field for field, _ in added] == ["spec.warmup.0.http"]
    assert "cannot read it" in added[0][1]


def test_a_drain_preset_without_url_is_read_as_its_runtime() -> None:
    spec = {
        "target": {"runtime": "hermes", "provider": "ollama", "model": "m"},
        "live": True,
        "drain": {"idle": {"runtime": "vllm", "port": 8000}},
    }
    added: list[str] = []

    declared = artifact_rules.read(
        spec, lambda path, msg, **_: added.append(msg), lambda name: True, lambda name: True
    )

    assert added == []
    assert declared.drain is not None
    assert declared.drain.idle_url == "http://127.0.0.1:8000/metrics"
