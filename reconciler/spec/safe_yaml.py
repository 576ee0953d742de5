"""Safe YAML at the edge: bytes in, plain data out (and back, for the files
the daemon writes).

Loading reads the C parser's events (libyaml through ruamel.yaml.clib) and
builds plain values itself, which is both the safety check and the fast
path (ruamel's Python constructor and resolver cost several times more than
the C parser). What a document can contain:

- one document per file, at most ``MAX_BYTES``, UTF-8 only (a BOM is fine);
- mappings with text keys, sequences, and scalars resolved by the YAML 1.2
  core schema: null, true/false, integers, floats; everything else is text,
  so an unquoted ``2026-12-01T09:00:00Z`` stays text and ``on`` is text;
- no anchors or aliases (no alias bombs), no tags except ``!!str``, no
  duplicate keys, nesting at most ``MAX_DEPTH`` deep.

Anything else raises ``YamlProblem`` whose ``problem`` names file, line,
column and field path. Line numbers of a value are looked up only when
someone has a problem to report (``locate``), by walking the events again.

Must not: know what documents mean (that is ``documents``), read files.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from typing import Any

import ruamel.yaml.main
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    DocumentEndEvent,
    DocumentStartEvent,
    Event,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
    StreamStartEvent,
)
from ruamel.yaml.reader import ReaderError

from reconciler.spec.model import Problem

MAX_BYTES = 1024 * 1024
MAX_DEPTH = 64
_MAX_NUMBER_DIGITS = 100

_CParser: Any = getattr(ruamel.yaml.main, "CParser", None)
_CEmitter: Any = getattr(ruamel.yaml.main, "CEmitter", None)


class YamlProblem(Exception):
    """A file that is not the YAML we accept; ``problem`` says where and why."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


# --- the parser -------------------------------------------------------------


def _c_parser_works() -> bool:
    """True when the compiled libyaml parser is importable and really parses:
    the ``[libyaml]`` extra has been seen to leave ruamel silently pure."""
    if _CParser is None:
        return False
    try:
        parser = _CParser("probe: [1]\n")
        return type(parser.get_event()) is StreamStartEvent
    except Exception:
        return False


C_LOADER = _c_parser_works()


def loader_warning() -> str | None:
    """A line for stderr when YAML is read by the slow pure-Python parser."""
    if C_LOADER:
        return None
    return (
        "warning: ruamel.yaml.clib's C parser is not available; reading YAML with the "
        "pure-Python parser, about four times slower (pip install ruamel.yaml.clib)"
    )


def _event_source(text: str) -> Callable[[], Any]:
    if C_LOADER:
        get_event: Callable[[], Any] = _CParser(text).get_event
        return get_event
    events = ruamel.yaml.YAML(typ="safe", pure=True).parse(text)
    return lambda: next(events)


# --- scalars: the YAML 1.2 core schema ---------------------------------------

_INT10 = re.compile(r"[-+]?[0-9]+")
_INT8 = re.compile(r"0o[0-7]+")
_INT16 = re.compile(r"0x[0-9a-fA-F]+")
_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
_INF = re.compile(r"[-+]?\.(?:inf|Inf|INF)")
_NAN = re.compile(r"\.(?:nan|NaN|NAN)")
_WORDS: dict[str, Any] = {
    "~": None,
    "null": None,
    "Null": None,
    "NULL": None,
    "true": True,
    "True": True,
    "TRUE": True,
    "false": False,
    "False": False,
    "FALSE": False,
}
_NUMBER_START = frozenset("-+.0123456789")


class _TooLong(ValueError):
    pass


def resolve_plain(text: str) -> Any:
    """The value of a plain (unquoted) scalar under the YAML 1.2 core schema."""
    if not text:
        return None
    first = text[0]
    if first in _NUMBER_START:
        if _INT10.fullmatch(text):
            if len(text) > _MAX_NUMBER_DIGITS:
                raise _TooLong(text)
            return int(text, 10)
        if _INT8.fullmatch(text) or _INT16.fullmatch(text):
            # Same bound as decimals: a 0x literal of thousands of digits
            # becomes an int whose repr() (in jsonschema's messages) raises.
            if len(text) > _MAX_NUMBER_DIGITS:
                raise _TooLong(text)
            return int(text[2:], 8 if text[1] == "o" else 16)
        if _FLOAT.fullmatch(text):
            if len(text) > _MAX_NUMBER_DIGITS:
                raise _TooLong(text)
            return float(text)
        if _INF.fullmatch(text):
            return -math.inf if first == "-" else math.inf
        if _NAN.fullmatch(text):
            return math.nan
        return text
    if first in "nNtTfF~":
        return _WORDS.get(text, text)
    return text


_STR_TAGS = frozenset({"!", "tag:yaml.org,2002:str"})
_MAP_TAGS = frozenset({"!", "tag:yaml.org,2002:map"})
_SEQ_TAGS = frozenset({"!", "tag:yaml.org,2002:seq"})


def _short_tag(tag: str) -> str:
    return "!!" + tag[len("tag:yaml.org,2002:") :] if tag.startswith("tag:yaml.org,2002:") else tag


# --- loading ----------------------------------------------------------------

_NO_KEY = object()


def format_field(field_path: Sequence[str | int]) -> str:
    """``["spec", "nodeIds", 2]`` -> ``spec.nodeIds[2]``."""
    out = ""
    for part in field_path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out:
            out += "." + part
        else:
            out = part
    return out


def _problem(path: str, text: str, mark: Any, message: str, *, key: bool = False) -> YamlProblem:
    line = mark.line + 1 if mark is not None else 0
    column = mark.column + 1 if mark is not None else 0
    field = format_field(_path_at(text, mark, key)) if mark is not None else ""
    return YamlProblem(Problem(path, line, column, field, message))


def _tagged_scalar(path: str, text: str, event: Any) -> Any:
    if event.anchor is not None:
        raise _problem(path, text, event.start_mark, _ANCHORS)
    if event.tag in _STR_TAGS:
        return event.value
    raise _problem(
        path,
        text,
        event.start_mark,
        f"tag {_short_tag(event.tag)} is not allowed: remove it and write the value "
        "as plain YAML (text in quotes)",
    )


_ANCHORS = "anchors (&name) and aliases (*name) are not allowed here: write the value out in full"


def _build(path: str, text: str) -> Any:
    """Plain values from the events of ``text``. The hot loop keeps no field
    paths: on a problem, ``_path_at`` finds the path from the position."""
    get_event = _event_source(text)
    get_event()  # StreamStart
    event = get_event()
    if type(event) is StreamEndEvent:
        return None
    outer: list[tuple[Any, bool]] = []  # enclosing (container, is_mapping)
    container: Any = None
    is_map = False
    key: Any = _NO_KEY
    root: Any = None
    while True:
        event = get_event()
        kind = type(event)
        if kind is ScalarEvent:
            if event.anchor is not None or event.tag is not None:
                value: Any = _tagged_scalar(path, text, event)
            elif event.implicit[0]:
                try:
                    value = resolve_plain(event.value)
                except _TooLong:
                    raise _too_long(path, text, event) from None
            else:
                value = event.value
            if is_map:
                if key is _NO_KEY:
                    if type(value) is not str or value in container:
                        raise _bad_key(path, text, event, value)
                    key = value
                else:
                    container[key] = value
                    key = _NO_KEY
            elif container is not None:
                container.append(value)
            else:
                root = value
                break
        elif kind is MappingEndEvent or kind is SequenceEndEvent:
            if not outer:
                break
            container, is_map = outer.pop()
        elif kind is MappingStartEvent or kind is SequenceStartEvent:
            if event.anchor is not None or (
                event.tag is not None
                and event.tag not in (_MAP_TAGS if kind is MappingStartEvent else _SEQ_TAGS)
            ):
                raise _bad_container(path, text, event)
            new: Any = {} if kind is MappingStartEvent else []
            if container is None:
                root = new
            else:
                if len(outer) + 1 >= MAX_DEPTH or (is_map and key is _NO_KEY):
                    raise _bad_nesting(path, text, event, len(outer) + 1 >= MAX_DEPTH)
                if is_map:
                    container[key] = new
                    key = _NO_KEY
                else:
                    container.append(new)
                outer.append((container, is_map))
            container = new
            is_map = kind is MappingStartEvent
        elif kind is AliasEvent:
            raise _problem(path, text, event.start_mark, _ANCHORS)
        else:  # pragma: no cover - libyaml emits nothing else inside a document
            raise _problem(path, text, event.start_mark, "unexpected YAML event")

    _end_of_only_document(path, get_event)
    return root


def _end_of_only_document(path: str, get_event: Callable[[], Any]) -> None:
    """Read the end of the document just built; a second document is a problem."""
    get_event()  # DocumentEnd
    event = get_event()
    if type(event) is DocumentStartEvent:
        raise _problem(
            path,
            "",
            event.start_mark,
            "a file holds exactly one document: remove the second '---' and what follows, "
            "or move it into its own file",
        )


# The problems ``_build`` finds, built apart from its loop (they end it).


def _too_long(path: str, text: str, event: Any) -> YamlProblem:
    return _problem(
        path,
        text,
        event.start_mark,
        f"number with {len(event.value)} characters is too long; "
        "if it is meant as text, put it in quotes",
    )


def _bad_key(path: str, text: str, event: Any, value: Any) -> YamlProblem:
    """A key that is not text, or that the mapping has already."""
    if type(value) is not str:
        shown = event.value or "(empty)"
        return _problem(
            path,
            text,
            event.start_mark,
            f"key {shown} is read as {_kind_of(value)}; keys are text: "
            f'put it in quotes, like "{shown}":',
            key=True,
        )
    first = _locate_mark(text, _path_at(text, event.start_mark, True), at_key=True)
    return _problem(
        path,
        text,
        event.start_mark,
        f'duplicate key "{value}" (first at line {first[0]}); '
        "a key may appear only once in a mapping",
        key=True,
    )


def _bad_container(path: str, text: str, event: Any) -> YamlProblem:
    """A mapping or list with an anchor or a tag that builds objects."""
    if event.anchor is not None:
        return _problem(path, text, event.start_mark, _ANCHORS)
    return _problem(
        path, text, event.start_mark, f"tag {_short_tag(event.tag)} is not allowed: remove it"
    )


def _bad_nesting(path: str, text: str, event: Any, deep: bool) -> YamlProblem:
    """A mapping or list nested too deep (``deep``), or used as a key."""
    if deep:
        return _problem(path, text, event.start_mark, f"nested more than {MAX_DEPTH} levels deep")
    return _problem(path, text, event.start_mark, "a key must be plain text, not a mapping or list")


def _kind_of(value: Any) -> str:
    if value is None:
        return "null (nothing)"
    if isinstance(value, bool):
        return f"the boolean {'true' if value else 'false'}"
    if isinstance(value, int | float):
        return "a number"
    return type(value).__name__


_SYNTAX_HINTS = (
    ("found character '\\t'", "tabs cannot indent YAML: use spaces"),
    (
        "mapping values are not allowed",
        "a ':' followed by a space inside a value needs the value in quotes, or the indentation is off",
    ),
    (
        "could not find expected ':'",
        "each key needs a ':' after it; check the indentation of this line and the one before",
    ),
    ("did not find expected key", "check the indentation: keys of one mapping must line up"),
    ("found undefined tag handle", "tags are not allowed: remove it"),
    (
        "control characters are not allowed",
        "remove the control character, or write it as an escape inside double quotes",
    ),
    (
        "found unknown escape character",
        "inside double quotes a backslash starts an escape: write \\\\ for a backslash, or use single quotes",
    ),
)


def _decode(path: str, data: bytes) -> str:
    if len(data) > MAX_BYTES:
        raise YamlProblem(
            Problem(
                path,
                0,
                0,
                "",
                f"file is larger than the limit of 1 MiB ({MAX_BYTES:,} bytes) for one "
                "document: remove what is not needed",
            )
        )
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        hint = " (it looks like UTF-16)" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise YamlProblem(
            Problem(
                path,
                line,
                column,
                "",
                f"not UTF-8: byte 0x{data[exc.start]:02x} cannot be read{hint}; save the file as UTF-8",
            )
        ) from None


def load_yaml(path: str, data: bytes) -> Any:
    """Plain data (dict/list/str/int/float/bool/None) from one YAML file.

    ``path`` is only for messages. Raises ``YamlProblem``; an empty file is
    ``None``.
    """
    text = _decode(path, data)
    try:
        return _build(path, text)
    except MarkedYAMLError as exc:
        raise YamlProblem(_syntax_problem(path, text, exc)) from None
    except ReaderError as exc:
        raise YamlProblem(_reader_problem(path, text, exc)) from None
    except YAMLError as exc:  # unmarked: should not happen with libyaml
        raise YamlProblem(Problem(path, 0, 0, "", f"not valid YAML: {exc}")) from None


def _reader_problem(path: str, text: str, exc: ReaderError) -> Problem:
    position = exc.position if isinstance(exc.position, int) else 0
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    code = exc.character if isinstance(exc.character, int) else 0
    return Problem(
        path,
        line,
        column,
        _field_at(text, line, column),
        f"character U+{code:04X} is not allowed in YAML ({exc.reason}): remove it, or "
        f"write it as the escape \\u{code:04x} inside double quotes",
    )


def _syntax_problem(path: str, text: str, exc: MarkedYAMLError) -> Problem:
    mark = exc.problem_mark or exc.context_mark
    what = (exc.problem or "").strip()
    message = f"YAML syntax error: {what}" if what else "YAML syntax error"
    if exc.context and exc.context_mark is not None and exc.problem_mark is not None:
        if exc.context_mark.line != exc.problem_mark.line:
            message += f" ({exc.context.strip()} that starts at line {exc.context_mark.line + 1})"
        else:
            message += f" ({exc.context.strip()})"
    if mark is not None and 0 <= mark.index < len(text) and text[mark.index] == "\t":
        message += "; tabs cannot indent YAML: use spaces"
    for needle, hint in _SYNTAX_HINTS:
        if needle in (exc.problem or "") or needle in str(exc):
            message += f"; {hint}"
            break
    line = mark.line + 1 if mark is not None else 0
    column = mark.column + 1 if mark is not None else 0
    # The path up to the error, from the part that did parse.
    field = _field_at(text, line, column)
    return Problem(path, line, column, field, message)


def _path_at(text: str, mark: Any, key: bool) -> list[str | int]:
    """The field path of the key (``key``) or the value that starts at
    ``mark`` (the innermost, when several start there); [] if none does.

    Linear in the text before ``mark``: the walk stops once it is past the
    position, and the path is built only for a match (a 1 MiB file of
    ``[`` costs one pass, not one path per bracket)."""
    if not text:
        return []
    where = (mark.line, mark.column)
    best: list[str | int] = []
    try:
        for stack, key_mark, value_mark in _walk(text):
            here = key_mark if value_mark is None else value_mark
            at = (here.line, here.column)
            if at > where:
                break
            if (value_mark is None) != key or at != where:
                continue
            best = _path_of(stack)
            if key:
                break
    except YAMLError:
        pass
    return best


def _field_at(text: str, line: int, column: int) -> str:
    """The field path of the last key that starts before (line, column).

    Two linear walks: the first finds which key that is (by its number
    among the keys), the second stops at it and builds its path once."""
    last = -1
    try:
        keys = 0
        for _, key_mark, value_mark in _walk(text):
            here = key_mark if value_mark is None else value_mark
            if here is not None and (here.line + 1, here.column + 1) > (line, column):
                break
            if key_mark is None or value_mark is not None:
                continue
            last = keys
            keys += 1
    except YAMLError:
        pass
    if last < 0:
        return ""
    try:
        keys = 0
        for stack, key_mark, value_mark in _walk(text):
            if key_mark is None or value_mark is not None:
                continue
            if keys == last:
                return format_field(_path_of(stack))
            keys += 1
    except YAMLError:
        pass
    return ""


# --- locating ---------------------------------------------------------------


def _path_of(stack: list[list[Any]]) -> list[str | int]:
    return [entry[1] for entry in stack]


def _walk(text: str) -> Iterator[tuple[list[list[Any]], Any, Any]]:
    """Every key as (stack, key mark, None) and every value as (stack, key
    mark or None, value start mark), in document order. Stops where the
    document breaks (the parser raises). ``stack`` is the walk's own live
    state: ``_path_of(stack)`` is the field path at that moment. Building
    the path on every event made deep nesting cost quadratic time."""
    get_event = _event_source(text)
    # path entries: for mappings the current key, for sequences the index
    stack: list[list[Any]] = []  # [is_mapping, key_or_index, expecting_key, key_mark]
    while True:
        event = get_event()
        kind = type(event)
        if kind is StreamEndEvent:
            return
        if kind in (StreamStartEvent, DocumentStartEvent, DocumentEndEvent):
            continue
        if kind is MappingEndEvent or kind is SequenceEndEvent:
            stack.pop()
            if stack:
                _advance(stack)
            continue
        if stack and stack[-1][0] and stack[-1][2]:
            # a key
            if kind is not ScalarEvent:
                return  # complex keys: give up
            stack[-1][1] = event.value
            stack[-1][2] = False
            stack[-1][3] = event.start_mark
            yield stack, event.start_mark, None
            continue
        key_mark = stack[-1][3] if stack and stack[-1][0] else None
        yield stack, key_mark, event.start_mark
        if kind is MappingStartEvent:
            stack.append([True, None, True, None])
        elif kind is SequenceStartEvent:
            stack.append([False, 0, False, None])
        elif stack:
            _advance(stack)


def _advance(stack: list[list[Any]]) -> None:
    top = stack[-1]
    if top[0]:
        top[2] = True
    else:
        top[1] += 1


def _locate_mark(
    text: str, field_path: Sequence[str | int], *, at_key: bool = False
) -> tuple[int, int]:
    want = list(field_path)
    best = (1, 1)
    best_len = -1
    try:
        for stack, key_mark, value_mark in _walk(text):
            if value_mark is None:
                continue
            n = len(stack)
            if n > len(want) or n <= best_len:
                continue
            found = _path_of(stack)
            if found != want[:n]:
                continue
            mark = value_mark
            if key_mark is not None and (
                at_key or (n < len(want)) or key_mark.line != value_mark.line
            ):
                mark = key_mark
            best = (mark.line + 1, mark.column + 1)
            best_len = n
            if n == len(want):
                break
    except YAMLError:
        pass
    return best


def locate(
    path: str, data: bytes, field_path: Sequence[str | int], *, at_key: bool = False
) -> tuple[int, int]:
    """1-based (line, column) of the value at ``field_path`` in the file, or
    of its nearest parent that exists. A value on the line of its key is
    located at the value, a block mapping or list at its key; ``at_key``
    always gives the key (for "unknown field" messages). (1, 1) when the
    file cannot be read at all."""
    try:
        text = _decode(path, data)
    except YamlProblem:
        return (1, 1)
    return _locate_mark(text, field_path, at_key=at_key)


def source_text(data: bytes, line: int, column: int) -> str:
    """The plain scalar as written at (line, column), 1-based, for messages
    that quote what the person typed (``010`` rather than the number 10)."""
    try:
        text = _decode("", data)
    except YamlProblem:
        return ""
    lines = text.splitlines()
    if not 1 <= line <= len(lines):
        return ""
    rest = lines[line - 1][column - 1 :]
    match = re.match(r"[^,\]\}#]*", rest)
    token = match.group(0) if match else rest
    return token.split(" #")[0].strip()


# --- dumping ----------------------------------------------------------------

# Text that a YAML 1.1 reader (PyYAML, many tools) would read as something
# else is quoted too, so status files mean the same to every reader.
_YAML11_SPECIAL = re.compile(
    r"(?:y|Y|yes|Yes|YES|n|N|no|No|NO|on|On|ON|off|Off|OFF"
    r"|[-+]?0[0-7_]+|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?"
    r"|[-+]?(?:[0-9][0-9_]*)?\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?[0-9][0-9_]*"
    r"|[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}.*|<<|=)"
)


def _plain_is_safe(text: str) -> bool:
    try:
        resolved = resolve_plain(text)
    except _TooLong:
        return False
    return resolved == text and type(resolved) is str and not _YAML11_SPECIAL.fullmatch(text)


@lru_cache(maxsize=8192)
def _scalar(text: str) -> ScalarEvent:
    # Cached: status files repeat the same keys and states thousands of times,
    # and an event is plain data the emitter only reads.
    if "\n" in text and text.strip() and not text[0].isspace():
        return ScalarEvent(None, None, (False, True), text, style="|")
    return ScalarEvent(None, None, (_plain_is_safe(text), True), text)


@lru_cache(maxsize=4096)
def _number(text: str) -> ScalarEvent:
    return ScalarEvent(None, None, (True, False), text)


_NULL = ScalarEvent(None, None, (True, False), "null")
_TRUE = ScalarEvent(None, None, (True, False), "true")
_FALSE = ScalarEvent(None, None, (True, False), "false")
_MAPPING_END = MappingEndEvent()
_SEQUENCE_END = SequenceEndEvent()
_DONE = object()


def _emit_value(value: Any, emit: Callable[[Event], None], stack: list[tuple[Any, bool]]) -> None:
    kind = type(value)
    if kind is str:
        emit(_scalar(value))
    elif value is None:
        emit(_NULL)
    elif kind is bool:
        emit(_TRUE if value else _FALSE)
    elif kind is int:
        emit(_number(str(value)))
    elif kind is float:
        emit(_number(_float_text(value)))
    elif isinstance(value, dict):
        emit(MappingStartEvent(None, None, True, flow_style=not value))
        stack.append((iter(value.items()), True))
    elif isinstance(value, list | tuple):
        emit(SequenceStartEvent(None, None, True, flow_style=not value))
        stack.append((iter(value), False))
    elif isinstance(value, str):  # a str subclass
        emit(_scalar(str(value)))
    elif isinstance(value, bool):
        emit(_TRUE if value else _FALSE)
    elif isinstance(value, int | float):
        _emit_value(int(value) if isinstance(value, int) else float(value), emit, stack)
    else:
        raise TypeError(f"cannot write {type(value).__name__} to YAML: {value!r}")


def _float_text(value: float) -> str:
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    return repr(value)


def _emit_document(data: Any, emit: Callable[[Event], None]) -> None:
    emit(StreamStartEvent())
    emit(DocumentStartEvent(explicit=False))
    stack: list[tuple[Any, bool]] = []
    _emit_value(data, emit, stack)
    while stack:
        items, is_map = stack[-1]
        item: Any = next(items, _DONE)
        if item is _DONE:
            stack.pop()
            emit(_MAPPING_END if is_map else _SEQUENCE_END)
        elif is_map:
            key, value = item
            if not isinstance(key, str):
                raise TypeError(f"mapping keys must be str, got {type(key).__name__}: {key!r}")
            emit(_scalar(str(key)))
            _emit_value(value, emit, stack)
        else:
            _emit_value(item, emit, stack)
    emit(DocumentEndEvent(explicit=False))
    emit(StreamEndEvent())


def dump_yaml(data: Any) -> bytes:
    """Block-style YAML for ``data`` (dict/list/tuple/str/int/float/bool/None),
    key order kept, no tags, deterministic. Text that would read back as
    another type (``"010"``, ``"true"``, ``"2026-01-01"``, ``"yes"``) is
    quoted; multi-line text is a literal block. Loads back equal with
    ``load_yaml``."""
    if type(data) is dict and data:
        lines: list[str] = []
        try:
            _write_mapping(data, 0, "", lines)
        except _Unusual:
            pass
        else:
            return "".join(lines).encode("utf-8")
    return _dump_with_emitter(data)


# --- the same text, written directly ------------------------------------------
#
# Status files are most of what the daemon writes (thousands of node records
# a pass), and driving the emitter event by event cost more than the rest of
# writing them. For the shapes status files have (block mappings and
# sequences, one-line text, ints, floats, booleans, nulls) the text is
# written here, byte for byte what the emitter writes: each distinct string
# is rendered once by the emitter itself and cached, and a number is the
# plain text ``_emit_value`` hands the emitter, which writes it unchanged.
# Anything else (multi-line or very long text, odd keys) goes to the
# emitter whole.

_SURELY_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+/-]*")
# Values that differ in every node record and would each cost an emitter run:
# signatures (base64, ``=`` padded), key ids (``SHA256:...``), and answer
# times with fractions of a second, which the emitter quotes as it quotes
# every time. tests/test_safe_yaml.py pins both against the emitter.
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+/=-]*(?::[A-Za-z0-9_.@+/=-]+)*")
_QUOTED_TIME = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?Z"
)
_MAX_SCALAR = 512  # longer text is left to the emitter (line width, simple keys)
_LINE_BREAK = re.compile("[\n\r\x85\u2028\u2029]")  # YAML's line breaks: indented by context


class _Unusual(Exception):
    """The data has a shape the direct writer leaves to the emitter."""


def _emitted_line(key: Any, value: Any) -> str:
    """The emitter's text for the one-entry document ``{key: value}``."""
    text = _dump_with_emitter({key: value}).decode("utf-8")
    if text.count("\n") != 1:
        raise _Unusual
    return text[:-1]


@lru_cache(maxsize=65536)
def _value_text(text: str) -> str:
    if len(text) > _MAX_SCALAR or _LINE_BREAK.search(text):
        raise _Unusual
    if _QUOTED_TIME.fullmatch(text):
        return f"'{text}'"
    if _PLAIN_VALUE.fullmatch(text) and _plain_is_safe(text):
        return text
    line = _emitted_line("k", text)
    if not line.startswith("k: "):
        raise _Unusual
    return line[3:]


@lru_cache(maxsize=4096)
def _key_text(text: str) -> str:
    if len(text) > _MAX_SCALAR or _LINE_BREAK.search(text):
        raise _Unusual
    if _SURELY_PLAIN.fullmatch(text) and _plain_is_safe(text):
        return text
    line = _emitted_line(text, 0)
    if not line.endswith(": 0"):
        raise _Unusual
    return line[:-3]


def _scalar_text(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return _value_text(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    if kind is float:
        return _float_text(value)
    if (kind is dict or kind is list or kind is tuple) and not value:
        return "[]" if kind is not dict else "{}"
    raise _Unusual


def _write_mapping(data: dict[Any, Any], indent: int, lead: str, out: list[str]) -> None:
    """``data`` as block mapping lines at ``indent``; the first key goes on
    the current line after ``lead`` (``"- "`` in a sequence)."""
    pad = " " * indent
    append = out.append
    for key, value in data.items():
        if type(key) is not str:
            raise _Unusual
        head = f"{lead}{_key_text(key)}:"
        lead = pad
        kind = type(value)
        if kind is str:
            append(f"{head} {_value_text(value)}\n")
        elif value is None:
            append(f"{head} null\n")
        elif kind is dict and value:
            append(head + "\n")
            _write_mapping(value, indent + 2, " " * (indent + 2), out)
        elif (kind is list or kind is tuple) and value:
            append(head + "\n")
            _write_sequence(value, indent, pad, out)  # indentless, as the emitter writes it
        else:
            append(f"{head} {_scalar_text(value)}\n")


def _write_sequence(items: Sequence[Any], indent: int, lead: str, out: list[str]) -> None:
    pad = " " * indent
    for item in items:
        head = f"{lead}- "
        lead = pad
        kind = type(item)
        if kind is dict and item:
            _write_mapping(item, indent + 2, head, out)
        elif (kind is list or kind is tuple) and item:
            _write_sequence(item, indent + 2, head, out)
        else:
            out.append(f"{head}{_scalar_text(item)}\n")


def entry_text(item: Any) -> str | None:
    """The text ``dump_yaml`` writes for ``item`` as one entry of the
    sequence under a top-level key (``- name: a\n  batch: 1\n``); None for
    a shape it leaves to the emitter (the whole document then goes there)."""
    lines: list[str] = []
    try:
        _write_sequence((item,), 0, "", lines)
    except _Unusual:
        return None
    return "".join(lines)


def dump_yaml_entries(data: Any, key: str, entries: Sequence[str | None]) -> bytes:
    """``dump_yaml(data)``, byte for byte, with the sequence under the
    top-level ``key`` written from ``entries``: each entry's ``entry_text``,
    kept from an earlier write (a status file's node records, mostly the
    same from one write to the next). The caller vouches that they are the
    texts of ``data[key]``'s items; any entry None, or anything else the
    direct writer leaves to the emitter, and the whole is ``dump_yaml``'s."""
    value = data.get(key) if type(data) is dict else None
    texts = [text for text in entries if text is not None]
    if (
        (type(value) is list or type(value) is tuple)
        and value
        and len(texts) == len(entries) == len(value)
    ):
        lines: list[str] = []
        try:
            for name, item in data.items():
                if name == key:
                    lines.append(f"{_key_text(key)}:\n")
                    lines.extend(texts)
                else:
                    _write_mapping({name: item}, 0, "", lines)
        except _Unusual:
            pass
        else:
            return "".join(lines).encode("utf-8")
    return dump_yaml(data)


def _dump_with_emitter(data: Any) -> bytes:
    stream = io.StringIO()
    emitter: Any
    if _CEmitter is not None:
        emitter = _CEmitter(stream, width=4096, allow_unicode=True)
    else:
        emitter = ruamel.yaml.emitter.Emitter(stream, width=4096, allow_unicode=True)
    try:
        _emit_document(data, emitter.emit)
    finally:
        dispose = getattr(emitter, "dispose", None)
        if dispose is not None:
            dispose()
    return stream.getvalue().encode("utf-8")
