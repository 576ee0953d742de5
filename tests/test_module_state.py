"""No module of ``reconciler/`` keeps mutable state of its own: a cache
kept between calls belongs to an object its caller owns (the daemon's
reader, an approver), so that dropping the object drops the cache and
``run --plain`` really starts from nothing.

An AST check, so that a new module-level cache fails here rather than in
a differential test that happens to share it: a name bound at module level
to a dict, set, list or call result that some function mutates (a method
such as ``append`` or ``clear``, an item or attribute assigned or deleted),
and every ``global`` statement."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "reconciler"

MUTATORS = frozenset(
    {
        "add",
        "append",
        "appendleft",
        "clear",
        "discard",
        "extend",
        "insert",
        "move_to_end",
        "pop",
        "popitem",
        "popleft",
        "remove",
        "setdefault",
        "update",
        "__setitem__",
        "__delitem__",
    }
)
CONTAINERS = (
    ast.Dict,
    ast.Set,
    ast.List,
    ast.Call,
    ast.DictComp,
    ast.SetComp,
    ast.ListComp,
)


def _module_containers(tree: ast.Module) -> set[str]:
    """Names the module binds, at its top level, to a container or a call."""
    names: set[str] = set()
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and isinstance(statement.value, CONTAINERS):
            names.update(t.id for t in statement.targets if isinstance(t, ast.Name))
        elif (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.value, CONTAINERS)
            and isinstance(statement.target, ast.Name)
        ):
            names.add(statement.target.id)
    return names


def _root(node: ast.expr) -> str | None:
    """The name an item or attribute chain starts from (``a`` of ``a.b[c]``)."""
    while isinstance(node, ast.Subscript | ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _local_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Names a function binds itself (arguments, assignments): they shadow
    the module's."""
    args = function.args
    names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    names.update(a.arg for a in (args.vararg, args.kwarg) if a is not None)
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _mutations(function: ast.FunctionDef | ast.AsyncFunctionDef, names: set[str]) -> Iterator[str]:
    """Where ``function`` changes one of the module's ``names``."""
    watched = names - _local_names(function)
    for node in ast.walk(function):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for target in targets:
            if isinstance(target, ast.Subscript | ast.Attribute) and _root(target) in watched:
                yield f"{_root(target)} (assigned into, line {node.lineno})"
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
            and _root(node.func.value) in watched
        ):
            yield f"{_root(node.func.value)} (.{node.func.attr}(), line {node.lineno})"


def module_state() -> list[str]:
    """Every module-level mutable cache and ``global`` statement under ``reconciler/``."""
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        where = path.relative_to(PACKAGE.parent).as_posix()
        names = _module_containers(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                found.append(f"{where}:{node.lineno}: global {', '.join(node.names)}")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.extend(f"{where}: {m}" for m in _mutations(node, names))
    return found


def test_no_module_keeps_mutable_state_of_its_own() -> None:
    found = module_state()
    assert not found, (
        "module-level mutable state (keep it on an object the caller owns, such as the "
        "daemon's reader or an approver):\n" + "\n".join(found)
    )


def test_the_check_finds_a_module_cache_and_a_global() -> None:
    source = (
        "_kept: dict[str, int] = {}\n"
        "_last = None\n"
        "def f(k):\n    _kept[k] = 1\n"
        "def g(x):\n    global _last\n    _last = x\n"
        "def h(_kept):\n    _kept.clear()\n"  # an argument shadows the module's name
    )
    tree = ast.parse(source)
    names = _module_containers(tree)
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert [list(_mutations(f, names)) for f in functions] == [
        ["_kept (assigned into, line 4)"],
        [],
        [],
    ]
    assert [n.names for n in ast.walk(tree) if isinstance(n, ast.Global)] == [["_last"]]
