"""Safe YAML at the edge: what loads, what is refused and where, and the
writer's output reading back the same."""

from __future__ import annotations

import math
import time
from datetime import datetime
from typing import Any

import pytest
import ruamel.yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.spec import safe_yaml
from reconciler.spec.safe_yaml import YamlProblem, dump_yaml, load_yaml, locate


def refused(text: str | bytes) -> YamlProblem:
    data = text.encode() if isinstance(text, str) else text
    with pytest.raises(YamlProblem) as caught:
        load_yaml("f.yaml", data)
    return caught.value


def test_the_c_parser_is_in_use() -> None:
    # pyproject names ruamel.yaml.clib; a silently pure parser is 4x slower
    assert safe_yaml.C_LOADER
    assert safe_yaml.loader_warning() is None


def test_scalars_follow_the_yaml_1_2_core_schema() -> None:
    data = load_yaml(
        "f.yaml",
        b"""\
int: 010
hex: 0x1F
octal: 0o17
float: 1.5
exp: 1e3
inf: -.inf
yes: yes
on: on
null1: ~
null2:
t: true
F: False
when: 2026-12-01T09:00:00Z
date: 2026-12-01
quoted: "010"
single: 'true'
forced: !!str 42
block: |
  two
  lines
""",
    )
    assert data == {
        "int": 10,
        "hex": 31,
        "octal": 15,
        "float": 1.5,
        "exp": 1000.0,
        "inf": -math.inf,
        "yes": "yes",
        "on": "on",
        "null1": None,
        "null2": None,
        "t": True,
        "F": False,
        "when": "2026-12-01T09:00:00Z",
        "date": "2026-12-01",
        "quoted": "010",
        "single": "true",
        "forced": "42",
        "block": "two\nlines\n",
    }
    assert isinstance(data["when"], str)


def test_an_empty_file_is_none_and_a_bom_is_fine() -> None:
    assert load_yaml("f.yaml", b"") is None
    assert load_yaml("f.yaml", b"# only a comment\n") is None
    assert load_yaml("f.yaml", b"\xef\xbb\xbfa: 1\n") == {"a": 1}


def test_duplicate_keys_are_refused_with_both_lines() -> None:
    problem = refused("spec:\n  a: 1\n  b: 2\n  a: 3\n").problem
    assert (problem.path, problem.line, problem.column, problem.field) == ("f.yaml", 4, 3, "spec.a")
    assert 'duplicate key "a" (first at line 2)' in problem.message


def test_anchors_and_aliases_are_refused_even_unused() -> None:
    assert "anchors (&name) and aliases" in refused("a: &x 1\n").problem.message
    problem = refused("a: 1\nb:\n  - *x\n").problem
    # an undefined alias is a parser error; a defined one is refused by us
    assert problem.line == 3
    problem = refused("a: &x [1]\nb: *x\n").problem
    assert (problem.line, problem.column, problem.field) == (1, 4, "a")


def test_an_alias_bomb_is_refused_at_its_first_anchor() -> None:
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 30):
        lines.append(f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    problem = refused("\n".join(lines)).problem
    assert (problem.line, problem.field) == (1, "l0")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a: !!python/object/apply:os.system [echo]\n", "!!python/object/apply:os.system"),
        ("a: !!binary aGk=\n", "!!binary"),
        ("a: !!set {x}\n", "!!set"),
        ("a: !!timestamp 2026-01-01\n", "!!timestamp"),
        ("a: !include other.yaml\n", "!include"),
        ("a: !!omap [x: 1]\n", "!!omap"),
    ],
)
def test_tags_that_build_objects_are_refused(text: str, shown: str) -> None:
    problem = refused(text).problem
    assert f"tag {shown} is not allowed" in problem.message
    assert problem.field == "a"


def test_keys_must_be_text() -> None:
    problem = refused("labels:\n  010: x\n").problem
    assert problem.field == "labels.010"
    assert 'put it in quotes, like "010":' in problem.message
    assert "a key must be plain text" in refused("? [a]\n: 1\n").problem.message


def test_files_over_one_mebibyte_are_refused_whole() -> None:
    at_limit = b"a: 1\n" + b"#" * (safe_yaml.MAX_BYTES - 6) + b"\n"
    assert len(at_limit) == safe_yaml.MAX_BYTES
    assert load_yaml("f.yaml", at_limit) == {"a": 1}
    problem = refused(at_limit + b"\n").problem
    assert (problem.line, problem.column) == (0, 0)
    assert "larger than the limit of 1 MiB" in problem.message


def test_bytes_that_are_not_utf8_are_refused_where_they_are() -> None:
    problem = refused(b"a: 1\nb: caf\xe9\n").problem
    assert (problem.line, problem.column) == (2, 7)
    assert "not UTF-8: byte 0xe9" in problem.message
    assert "looks like UTF-16" in refused("a: 1\n".encode("utf-16")).problem.message


def test_control_characters_are_refused_where_they_are() -> None:
    problem = refused(b"a: 1\nb: x\x01y\n").problem
    assert (problem.line, problem.column) == (2, 5)
    assert "U+0001" in problem.message


def test_one_document_per_file() -> None:
    problem = refused("a: 1\n---\nb: 2\n").problem
    assert problem.line == 2
    assert "exactly one document" in problem.message


def test_syntax_errors_name_the_place_and_a_hint() -> None:
    problem = refused("spec:\n  nodeIds: [a, b\n  batchSize: 1\n").problem
    assert (problem.line, problem.field) == (3, "spec.nodeIds")
    assert problem.message.startswith("YAML syntax error: ")
    assert "use spaces" in refused("a:\n\tb: 1\n").problem.message
    assert "in quotes" in refused("a: b: c\n").problem.message


def test_nesting_is_capped() -> None:
    deep = "[" * (safe_yaml.MAX_DEPTH + 1) + "]" * (safe_yaml.MAX_DEPTH + 1)
    assert "nested more than" in refused(deep).problem.message
    ok = "[" * safe_yaml.MAX_DEPTH + "]" * safe_yaml.MAX_DEPTH
    load_yaml("f.yaml", ok.encode())


def test_overlong_numbers_are_refused_not_parsed() -> None:
    assert "too long" in refused("a: " + "9" * 5000 + "\n").problem.message


@pytest.mark.parametrize("literal", ["0x" + "f" * 5000, "0o" + "7" * 5000, "0x" + "1" * 99])
def test_overlong_hex_and_octal_literals_are_refused_like_decimals(literal: str) -> None:
    # jsonschema's messages repr() the int: past 4,300 digits that raises.
    problem = refused(f"a: {literal}\n").problem
    assert problem.message.startswith(f"number with {len(literal)} characters is too long")
    assert (problem.line, problem.column, problem.field) == (1, 4, "a")
    assert load_yaml("f.yaml", b"a: 0x" + b"f" * 98) == {"a": int("f" * 98, 16)}
    assert load_yaml("f.yaml", b"a: 0o17") == {"a": 15}


def test_the_error_path_is_linear_in_deep_nesting() -> None:
    # Naming the field of a problem used to rebuild the path on every event
    # of the whole text: 32k brackets took 5 s, 1 MiB over 8 minutes. The
    # bound is generous (linear takes milliseconds, bench/yaml_nesting.py has
    # the figures); it only catches the quadratic walk coming back.
    started = time.perf_counter()
    problem = refused(b"[" * (1024 * 1024)).problem
    assert time.perf_counter() - started < 30.0
    assert (problem.line, problem.column) == (1, safe_yaml.MAX_DEPTH + 1)
    assert problem.field == "[0]" * safe_yaml.MAX_DEPTH
    # within the nesting limit, an error at the very end of a MiB
    text = b"{k: [" * 30 + b"1, " * 300_000 + b"}"
    problem = refused(text).problem
    assert problem.field == ".".join(["k[0]"] * 29 + ["k"])


DOC = b"""\
apiVersion: reconciler/v1
metadata: {name: gpu-a1}
spec:
  batchSize: 0
  nodeIds:
    - gpu-a1
    - gpu-a2
  labels:
    role: canary
"""


@pytest.mark.parametrize(
    ("field_path", "at_key", "where"),
    [
        (["apiVersion"], False, (1, 13)),
        (["metadata", "name"], False, (2, 18)),
        (["metadata", "name"], True, (2, 12)),
        (["spec", "batchSize"], False, (4, 14)),
        (["spec", "nodeIds"], False, (5, 3)),  # a block list: its key
        (["spec", "nodeIds", 1], False, (7, 7)),
        (["spec", "labels", "role"], True, (9, 5)),
        (["spec", "missing"], False, (3, 1)),  # the nearest parent
        (["spec", "nodeIds", 9], False, (5, 3)),
        ([], False, (1, 1)),
    ],
)
def test_locate_finds_a_field_or_its_nearest_parent(
    field_path: list[str | int], at_key: bool, where: tuple[int, int]
) -> None:
    assert locate("f.yaml", DOC, field_path, at_key=at_key) == where


def test_locate_tolerates_a_broken_file() -> None:
    assert locate("f.yaml", b"a: [1\n", ["a"]) == (1, 4)
    assert locate("f.yaml", b"\xff", ["a"]) == (1, 1)


def test_dump_keeps_order_quotes_lookalikes_and_uses_block_style() -> None:
    text = dump_yaml(
        {
            "phase": "running",
            "code": "010",
            "flag": "true",
            "when": "2026-12-01T09:00:00Z",
            "word": "yes",
            "empty": "",
            "none": None,
            "nodes": [{"name": "gpu-a1", "attempt": 1}],
            "hold": {},
            "message": "line one\nline two\n",
        }
    ).decode()
    assert text == (
        "phase: running\n"
        "code: '010'\n"
        "flag: 'true'\n"
        "when: '2026-12-01T09:00:00Z'\n"
        "word: 'yes'\n"
        "empty: ''\n"
        "none: null\n"
        "nodes:\n"
        "- name: gpu-a1\n"
        "  attempt: 1\n"
        "hold: {}\n"
        "message: |\n"
        "  line one\n"
        "  line two\n"
    )


def test_dump_refuses_what_it_cannot_write_plainly() -> None:
    with pytest.raises(TypeError):
        dump_yaml({"a": object()})
    with pytest.raises(TypeError):
        dump_yaml({1: "a"})


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_whatever_is_dumped_loads_back_equal(value: Any) -> None:
    data = dump_yaml(value)
    assert load_yaml("f.yaml", data) == value
    assert dump_yaml(value) == data  # deterministic
    assert tags_in(data) == set()


def tags_in(data: bytes) -> set[str]:
    events = ruamel.yaml.YAML(typ="safe", pure=True).parse(data.decode())
    return {tag for event in events if (tag := getattr(event, "tag", None)) is not None}


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=False),
    st.text(max_size=30),
    st.sampled_from(["yes", "on", "010", "2026-12-01T09:00:00Z", "", " x", "a: b", "- a", "#"]),
)
_documents = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(min_size=1, max_size=12), inner, max_size=4),
    ),
    max_leaves=20,
)


@given(_documents)
@settings(max_examples=300, deadline=None)
def test_the_fast_writer_writes_what_the_emitter_writes(doc: object) -> None:
    # dump_yaml writes common block YAML itself for speed; it must be byte for
    # byte what ruamel's emitter writes, and read back as the same data.
    assert safe_yaml.dump_yaml(doc) == safe_yaml._dump_with_emitter(doc)
    if doc is not None:
        assert safe_yaml.load_yaml("x.yaml", safe_yaml.dump_yaml(doc)) == doc


@given(
    st.dictionaries(st.text(min_size=1, max_size=12), _documents, max_size=4),
    st.lists(_documents, min_size=1, max_size=5),
    st.integers(min_value=0, max_value=4),
)
@settings(max_examples=300, deadline=None)
def test_a_sequence_written_from_its_entries_texts_is_what_dump_yaml_writes(
    around: dict[str, Any], items: list[Any], at: int
) -> None:
    # Status files are written with their node records' texts kept from the
    # last write: the same bytes as writing the whole document, wherever the
    # key sits, whatever the items (those left to the emitter included).
    keys = [k for k in around if k != "nodes"]
    at = min(at, len(keys))
    doc = {k: around[k] for k in keys[:at]} | {"nodes": items} | {k: around[k] for k in keys[at:]}
    entries = [safe_yaml.entry_text(item) for item in items]
    assert safe_yaml.dump_yaml_entries(doc, "nodes", entries) == safe_yaml.dump_yaml(doc)


# Values every node record has its own of (signatures, key ids, answer times):
# written without the emitter, byte for byte as it writes them.
_token_text = st.text(
    alphabet="ABCXYZabcxyz0123456789_.@+/=:- ", min_size=1, max_size=40
) | st.sampled_from(
    [
        "TKuDPBtqIHJaeenu1zO8hmeRBKMiohB+F/hsX6IQem7XCRCKqD/DObFkS/48fHOg/4Dk74FkhWPSgvYRiQ1QDA==",
        "+KuDPBtqIHJaeenu1zO8hmeRBKMiohB+F/hsX6IQem7XCRCKqD/DObFkS/48fHOg/4Dk74FkhWPSgvYRiQ1QD==",
        "SHA256:Pyqr/Ykx7o1wJC4SOPVg3Na75PRqXrjotvNn3jdp+2Y",
        "a:",
        "a:b",
        "a: b",
        ":a",
        "1:20",
        "1:20:30",
        "=",
        "a=",
        "0x1F",
        "1e5",
        "1_000",
        "2026-12-01",
        "2026-12-01T21:26",
        "2026-12-01T21:26:52Z",
        "2026-12-01 21:26:52Z",
        "2026-12-01T21:26:52.5Z",
        "2026-12-01T21:26:52.562027Z",
        "2026-12-01T21:26:52.562027",
        "2026-12-01T21:26:52.562027+00:00",
        "yes",
        "null",
        "~",
        "true",
        "on",
    ]
)
_times = st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 1, 1)).map(
    lambda t: t.isoformat(timespec="microseconds" if t.microsecond else "seconds") + "Z"
)


@given(st.one_of(_token_text, _times))
@settings(max_examples=600, deadline=None)
def test_per_node_values_are_written_as_the_emitter_writes_them(text: str) -> None:
    doc = {"nodes": [{"evidence": {"keyId": text, "signatures": {"jobRecord": text}}}]}
    assert safe_yaml.dump_yaml(doc) == safe_yaml._dump_with_emitter(doc)
    assert safe_yaml.load_yaml("x.yaml", safe_yaml.dump_yaml(doc)) == doc


@given(st.floats() | st.sampled_from([0.004, -0.0, 1e-05, 1.5e16, 5e-324]))
@settings(max_examples=600, deadline=None)
def test_a_node_record_with_seconds_in_it_is_written_without_the_emitter(seconds: float) -> None:
    # Live applies record outOfService in seconds: a float in every node
    # record. Left to the emitter, it sent each status file there whole.
    record = {"name": "node-001", "outOfService": seconds, "timings": {"warmedAt": None}}
    assert safe_yaml.entry_text(record) is not None
    doc = {"phase": "running", "nodes": [record]}
    assert safe_yaml.dump_yaml(doc) == safe_yaml._dump_with_emitter(doc)
