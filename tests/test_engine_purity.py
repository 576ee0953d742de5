"""The engine is pure: importing it, and the reconciler modules it imports,
pulls in no Git, HTTP, file watching, event loop, clock, OS or randomness."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "reconciler"
# Every module of the engine package, and the status values it steps.
ENGINE_MODULES = [
    f"reconciler.engine.{path.stem}"
    for path in sorted((PACKAGE / "engine").glob("*.py"))
    if path.stem != "__init__"
] + ["reconciler.spec.rollout_status"]
FORBIDDEN = {"pygit2", "httpx", "watchfiles", "asyncio", "time", "os", "random", "socket"}


def reconciler_imports(module: str) -> set[str]:
    """Every reconciler module ``module`` imports, transitively, by reading source."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = PACKAGE.parent / (name.replace(".", "/") + ".py")
        if not path.exists():
            path = PACKAGE.parent / name.replace(".", "/") / "__init__.py"
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                todo += [n for n in names if n.startswith("reconciler") and _exists(n)]
            elif isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.startswith("reconciler")]
    return seen


def _exists(name: str) -> bool:
    base = PACKAGE.parent / name.replace(".", "/")
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def test_engine_modules_import_nothing_forbidden_by_source() -> None:
    modules = set().union(*(reconciler_imports(m) for m in ENGINE_MODULES))
    found: dict[str, set[str]] = {}
    for name in modules:
        path = PACKAGE.parent / (name.replace(".", "/") + ".py")
        if not path.exists():
            path = PACKAGE.parent / name.replace(".", "/") / "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                tops = {node.module.split(".")[0]}
            else:
                continue
            if tops & FORBIDDEN:
                found.setdefault(name, set()).update(tops & FORBIDDEN)
    assert not found, f"engine modules import side-effect libraries: {found}"


def test_importing_the_engine_loads_no_forbidden_module() -> None:
    # A fresh interpreter, so nothing a test runner loaded counts. Python
    # loads `os` and `time` at start-up, and stdlib helpers the engine may use
    # (dataclasses -> inspect -> os) hold on to them; so load those helpers
    # first, forget the forbidden modules, and see which come back when the
    # engine modules are imported.
    probe = "; ".join(
        [
            "import sys, dataclasses, datetime, hashlib, re, typing, collections.abc",
            f"forbidden = {sorted(FORBIDDEN)!r}",
            "[sys.modules.pop(m, None) for m in forbidden]",
            *(f"import {m}" for m in ENGINE_MODULES),
            "print(sorted(m for m in forbidden if m in sys.modules))",
        ]
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=PACKAGE.parent,
    ).stdout.strip()
    assert out == "[]", f"importing the engine loaded {out}"
