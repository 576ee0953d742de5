"""The daemon reads as a frame and its steps: the pass is the fixed list
``PASS_STEPS``, each a method of ``Daemon``; no class of the daemon package
is over 500 lines and no function over 80 (the steps' work lives in the
modules named for it: reader, inputs, observer, status_files, gauges)."""

from __future__ import annotations

import ast
from pathlib import Path

import reconciler.daemon
from reconciler.daemon.loop import PASS_STEPS, Daemon

PACKAGE = Path(reconciler.daemon.__file__).parent


def sizes() -> list[tuple[str, str, str, int]]:
    found = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append((path.name, kind, node.name, length))
    return found


def test_no_class_of_the_daemon_is_over_500_lines_and_no_function_over_80() -> None:
    found = sizes()
    assert any(kind == "class" and name == "Daemon" for _, kind, name, _ in found)
    too_long = [
        (path, kind, name, length)
        for path, kind, name, length in found
        if length > (500 if kind == "class" else 80)
    ]
    assert too_long == []


def test_the_pass_is_the_fixed_list_of_steps_in_order() -> None:
    assert PASS_STEPS == ("read", "verify", "observe", "step", "fleet", "commit", "notify", "send")
    for name in PASS_STEPS:
        step = getattr(Daemon, f"_{name}")
        assert step.__doc__, name  # each says what it touches
