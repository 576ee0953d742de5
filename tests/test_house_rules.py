"""House rules of ``reconciler/`` that a reader relies on: no import circle
between its modules, no function over 80 lines, no class over 500.

The size rules carry a list of the functions and classes over the bar
today, all in parts other changes are reworking (the daemon's loop, the
agent, the SSH signature verifier). The list may only shrink: an entry
that is no longer over the bar fails here until it is removed, and no
entry may be added."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import grimp

PACKAGE = Path(__file__).resolve().parent.parent / "reconciler"
FUNCTION_LINES = 80
CLASS_LINES = 500

# May only shrink: remove an entry once its function or class is under the bar.
OVER_THE_BAR: frozenset[str] = frozenset()


def _definitions() -> Iterator[tuple[str, str, int]]:
    """(``path:qualname``, ``function`` or ``class``, lines) of every
    function and class under ``reconciler/``."""
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        where = path.relative_to(PACKAGE).as_posix()
        yield from _walk(tree, where, "")


def _walk(node: ast.AST, where: str, prefix: str) -> Iterator[tuple[str, str, int]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}{child.name}"
            kind = "class" if isinstance(child, ast.ClassDef) else "function"
            assert child.end_lineno is not None
            yield f"{where}:{name}", kind, child.end_lineno - child.lineno + 1
            yield from _walk(child, where, f"{name}.")
        else:
            yield from _walk(child, where, prefix)


def _over_the_bar() -> dict[str, int]:
    limits = {"function": FUNCTION_LINES, "class": CLASS_LINES}
    return {name: lines for name, kind, lines in _definitions() if lines > limits[kind]}


def test_no_function_over_80_lines_and_no_class_over_500_outside_the_shrinking_list() -> None:
    over = _over_the_bar()
    new = {name: lines for name, lines in over.items() if name not in OVER_THE_BAR}
    assert not new, (
        f"over {FUNCTION_LINES} lines (function) or {CLASS_LINES} (class): {new}; split them"
    )


def test_the_list_of_definitions_over_the_bar_only_shrinks() -> None:
    over = _over_the_bar()
    gone = sorted(OVER_THE_BAR - set(over))
    assert not gone, f"no longer over the bar: {gone}; remove them from OVER_THE_BAR"


def test_the_size_walk_sees_methods_and_nested_functions() -> None:
    names = {name for name, _, _ in _definitions()}
    assert "engine/step.py:RolloutStep.started_step" in names
    assert "engine/step.py:step_fleet" in names


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep import chain cannot reach the recursion limit.
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            module, edges = work[-1]
            for imported in edges:
                if imported not in index:
                    index[imported] = low[imported] = len(index)
                    stack.append(imported)
                    on_stack.add(imported)
                    targets = sorted(graph.find_modules_directly_imported_by(imported))
                    work.append((imported, iter(targets)))
                    break
                if imported in on_stack:
                    low[module] = min(low[module], index[imported])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_circle_between_modules_type_only_imports_included() -> None:
    graph = grimp.build_graph("reconciler")
    cycles = _cycles(graph)
    chains = [graph.find_shortest_chain(importer=cycle[1], imported=cycle[0]) for cycle in cycles]
    assert not cycles, f"modules that import each other: {cycles}; for example {chains}"


def test_the_circle_finder_finds_a_circle() -> None:
    graph = grimp.ImportGraph()
    for name in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(name)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.a")
    graph.add_import(importer="pkg.c", imported="pkg.a")
    assert _cycles(graph) == [["pkg.a", "pkg.b"]]
