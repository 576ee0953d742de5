"""The JSON Schemas (2020-12) of every document kind, found where the
package is installed, with validators built once.

``schemas/NAME.schema.json`` is the single source of truth for a document's
shape. Two checkers are built from it, once per process:

- ``validator(name)``: a prebuilt ``Draft202012Validator``, the authority,
  used to explain what is wrong;
- ``fast_check(name)``: a predicate compiled from the same schema for the
  keywords our schemas use. It answers "valid?" about ten times faster, so
  the common case (a valid document) never pays for jsonschema; anything it
  rejects is handed to ``validator`` for the words. A test checks that both
  agree on valid and broken documents.

Must not: read documents, or know what a field means (that is ``documents``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
from jsonschema.protocols import Validator  # type: ignore[import-untyped]

_PACKAGE = Path(__file__).resolve().parent.parent  # reconciler/
# Installed wheel: force-included as reconciler/schemas. Editable install or
# a source checkout: the repository's top-level schemas/.
_CANDIDATE_DIRS = (_PACKAGE / "schemas", _PACKAGE.parent / "schemas")

Check = Callable[[Any], bool]


def schema_dir() -> Path:
    """The directory holding ``*.schema.json``."""
    for directory in _CANDIDATE_DIRS:
        if directory.is_dir() and any(directory.glob("*.schema.json")):
            return directory
    raise FileNotFoundError(
        "reconciler's schemas are missing: looked in " + ", ".join(map(str, _CANDIDATE_DIRS))
    )


def schema_path(name: str) -> Path:
    """``"rollout"`` -> ``.../rollout.schema.json`` (installed or editable)."""
    path = schema_dir() / f"{name}.schema.json"
    if not path.is_file():
        raise FileNotFoundError(f"no schema named {name!r}: {path} does not exist")
    return path


@cache
def load_schema(name: str) -> Mapping[str, Any]:
    """The parsed schema; callers must not change it."""
    with schema_path(name).open(encoding="utf-8") as handle:
        schema: dict[str, Any] = json.load(handle)
    return schema


@cache
def validator(name: str) -> Validator:
    """A prebuilt 2020-12 validator for ``name``; the schema is checked once here."""
    schema = load_schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    built: Validator = jsonschema.Draft202012Validator(schema)
    return built


@cache
def fast_check(name: str) -> Check:
    """A predicate equal to ``validator(name).is_valid`` for valid documents,
    compiled from the schema. Falls back to the validator for a schema that
    uses a keyword the compiler does not know."""
    schema = load_schema(name)
    try:
        return _Compiler(schema).compile(schema)
    except _Unsupported:
        return validator(name).is_valid


# --- the compiler -----------------------------------------------------------
#
# Each schema node becomes a closure ``instance -> bool``. Only the keywords
# below are understood; an unknown one makes the whole schema fall back to
# jsonschema rather than be checked loosely. Semantics follow jsonschema's
# 2020-12 validator: booleans are not numbers, 1.0 is an integer, ``pattern``
# is ``re.search``, lengths count code points.

_ANNOTATIONS = frozenset(
    {
        "$schema",
        "$id",
        "$defs",
        "$comment",
        "title",
        "description",
        "default",
        "examples",
        "errorMessage",
        "patternErrorMessage",
        "markdownDescription",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)


class _Unsupported(Exception):
    pass


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_integer(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value) and value.is_integer()


_TYPES: dict[str, Check] = {
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": _is_number,
    "integer": _is_integer,
}


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: ``True`` is not ``1``; ``1`` is ``1.0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    return a is None and b is None


class _Compiler:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.refs: dict[str, Check] = {}

    def compile(self, schema: Any) -> Check:
        if schema is True:
            return lambda _v: True
        if schema is False:
            return lambda _v: False
        if not isinstance(schema, Mapping):
            raise _Unsupported(repr(schema))
        checks: list[Check] = []
        for keyword, arg in schema.items():
            if keyword in _ANNOTATIONS:
                continue
            method = getattr(self, "_kw_" + keyword.lstrip("$"), None)
            if method is None:
                raise _Unsupported(keyword)
            check = method(arg, schema)
            if check is not None:
                checks.append(check)
        if not checks:
            return lambda _v: True
        if len(checks) == 1:
            return checks[0]
        tup = tuple(checks)

        def every(v: Any) -> bool:
            # a plain loop: about twice as fast as all() over a generator
            for c in tup:  # noqa: SIM110
                if not c(v):
                    return False
            return True

        return every

    # Each _kw_ returns a check, or None when the keyword is handled by a
    # sibling (additionalProperties is compiled together with properties).

    def _kw_ref(self, ref: str, _schema: Mapping[str, Any]) -> Check:
        if not ref.startswith("#/"):
            raise _Unsupported(ref)
        if ref not in self.refs:
            target: Any = self.root
            for part in ref[2:].split("/"):
                target = target[part.replace("~1", "/").replace("~0", "~")]
            refs = self.refs
            # a late-bound stand-in, so a recursive $ref compiles
            refs[ref] = lambda v: refs[ref](v)
            refs[ref] = self.compile(target)
        return self.refs[ref]

    def _kw_type(self, arg: str | list[str], _schema: Mapping[str, Any]) -> Check:
        names = [arg] if isinstance(arg, str) else list(arg)
        tests = tuple(_TYPES[n] for n in names)
        if len(tests) == 1:
            return tests[0]
        return lambda v: any(t(v) for t in tests)

    def _kw_const(self, arg: Any, _schema: Mapping[str, Any]) -> Check:
        return lambda v: _equal(v, arg)

    def _kw_enum(self, arg: list[Any], _schema: Mapping[str, Any]) -> Check:
        if all(isinstance(a, str) for a in arg):
            options = frozenset(arg)
            return lambda v: isinstance(v, str) and v in options
        return lambda v: any(_equal(v, a) for a in arg)

    def _kw_pattern(self, arg: str, _schema: Mapping[str, Any]) -> Check:
        search = re.compile(arg).search
        return lambda v: not isinstance(v, str) or search(v) is not None

    def _kw_minLength(self, arg: int, _schema: Mapping[str, Any]) -> Check:
        return lambda v: not isinstance(v, str) or len(v) >= arg

    def _kw_maxLength(self, arg: int, _schema: Mapping[str, Any]) -> Check:
        return lambda v: not isinstance(v, str) or len(v) <= arg

    def _kw_minimum(self, arg: float, _schema: Mapping[str, Any]) -> Check:
        return lambda v: not _is_number(v) or v >= arg

    def _kw_maximum(self, arg: float, _schema: Mapping[str, Any]) -> Check:
        return lambda v: not _is_number(v) or v <= arg

    def _kw_minItems(self, arg: int, _schema: Mapping[str, Any]) -> Check:
        return lambda v: not isinstance(v, list) or len(v) >= arg

    def _kw_maxItems(self, arg: int, _schema: Mapping[str, Any]) -> Check:
        return lambda v: not isinstance(v, list) or len(v) <= arg

    def _kw_minProperties(self, arg: int, _schema: Mapping[str, Any]) -> Check:
        return lambda v: not isinstance(v, dict) or len(v) >= arg

    def _kw_maxProperties(self, arg: int, _schema: Mapping[str, Any]) -> Check:
        return lambda v: not isinstance(v, dict) or len(v) <= arg

    def _kw_uniqueItems(self, arg: bool, _schema: Mapping[str, Any]) -> Check | None:
        if not arg:
            return None

        def unique(v: Any) -> bool:
            if not isinstance(v, list):
                return True
            for i, a in enumerate(v):
                for b in v[i + 1 :]:
                    if _equal(a, b):
                        return False
            return True

        return unique

    def _kw_items(self, arg: Any, _schema: Mapping[str, Any]) -> Check:
        item = self.compile(arg)
        return lambda v: not isinstance(v, list) or all(item(x) for x in v)

    def _kw_required(self, arg: list[str], _schema: Mapping[str, Any]) -> Check:
        names = tuple(arg)

        def required(v: Any) -> bool:
            if isinstance(v, dict):
                for n in names:
                    if n not in v:
                        return False
            return True

        return required

    def _kw_properties(self, arg: Mapping[str, Any], schema: Mapping[str, Any]) -> Check:
        props = {key: self.compile(sub) for key, sub in arg.items()}
        extra = schema.get("additionalProperties", True)
        if extra is True:
            return lambda v: (
                not isinstance(v, dict) or all(props[k](x) for k, x in v.items() if k in props)
            )
        other = self.compile(extra)

        def check(v: Any) -> bool:
            if not isinstance(v, dict):
                return True
            for k, x in v.items():
                prop = props.get(k)
                if prop is None:
                    if not other(x):
                        return False
                elif not prop(x):
                    return False
            return True

        return check

    def _kw_additionalProperties(self, arg: Any, schema: Mapping[str, Any]) -> Check | None:
        if "properties" in schema:
            return None
        if "patternProperties" in schema:
            raise _Unsupported("patternProperties")
        other = self.compile(arg)
        return lambda v: not isinstance(v, dict) or all(other(x) for x in v.values())

    def _kw_propertyNames(self, arg: Any, _schema: Mapping[str, Any]) -> Check:
        name = self.compile(arg)
        return lambda v: not isinstance(v, dict) or all(name(k) for k in v)

    def _kw_oneOf(self, arg: list[Any], _schema: Mapping[str, Any]) -> Check:
        subs = tuple(self.compile(s) for s in arg)
        return lambda v: sum(1 for s in subs if s(v)) == 1

    def _kw_anyOf(self, arg: list[Any], _schema: Mapping[str, Any]) -> Check:
        subs = tuple(self.compile(s) for s in arg)
        return lambda v: any(s(v) for s in subs)

    def _kw_allOf(self, arg: list[Any], _schema: Mapping[str, Any]) -> Check:
        subs = tuple(self.compile(s) for s in arg)
        return lambda v: all(s(v) for s in subs)

    def _kw_not(self, arg: Any, _schema: Mapping[str, Any]) -> Check:
        sub = self.compile(arg)
        return lambda v: not sub(v)
