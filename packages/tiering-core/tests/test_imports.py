"""The tree's shape: no import cycle between tiering modules (function-level imports included), no oversized module.

The graph is read from the source files (AST), not from ``sys.modules``, so an
import inside a function counts as much as one at the top of a module: a cycle
through a function-level import (``factory`` -> ``spec`` -> ``factory``) only
waits for the first call to bite. What is not an edge:

- an import under ``if TYPE_CHECKING:`` (never runs);
- the implicit import of a parent package (``import tiering.core.transfer.plan``
  runs ``tiering/core/__init__.py`` first; Python always finishes a parent's
  ``__init__`` before its children, so that edge cannot deadlock or see a
  half-built module: it is how packages work, not a design cycle);
- a module named by a string (entry points, ``Registry.register``): resolved by
  name at run time, after every module has finished importing.

``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
MAX_LINES = 400


def source_modules() -> dict[str, Path]:
    """Every ``tiering.*`` module of every package in the repository, by dotted name."""
    modules: dict[str, Path] = {}
    for src in sorted(REPO.glob("packages/tiering-*/src")):
        for path in sorted(src.rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement anywhere in ``tree`` (functions, classes, try blocks), except under TYPE_CHECKING."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the tiering modules it imports (see the module docstring for what counts)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base_parts = name.split(".")
                    if not is_package:
                        base_parts.pop()
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
                ]
            for target in targets:
                # ``import a.b.c`` binds and runs ``a.b.c``; take the deepest tiering module named
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(components)


def test_the_graph_sees_every_package_and_function_level_imports():
    modules = source_modules()
    assert {"tiering.core", "tiering.core.factory", "tiering.example", "tiering.fs", "tiering.s3"} <= set(modules)
    graph = import_graph(modules)
    # function-level: the stack builder imports the torch transfer path inside build_handlers,
    # and the transfer package its torch modules inside __getattr__
    assert "tiering.core.transfer" in graph["tiering.core.runtime.stack"]
    assert "tiering.core.transfer.handler" in graph["tiering.core.transfer"]
    # a backend imports core's modules
    assert "tiering.core.base" in graph["tiering.example.tier"]


def test_cycle_detection_finds_a_function_level_cycle(tmp_path):
    pkg = tmp_path / "tiering" / "demo"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tiering.demo import c\n")
    (pkg / "b.py").write_text("def f():\n    from tiering.demo.c import g\n    return g\n")
    (pkg / "c.py").write_text("from . import b\ndef g():\n    pass\n")
    modules = {
        "tiering.demo": pkg / "__init__.py",
        "tiering.demo.a": pkg / "a.py",
        "tiering.demo.b": pkg / "b.py",
        "tiering.demo.c": pkg / "c.py",
    }
    graph = import_graph(modules)
    assert graph["tiering.demo.a"] == set()  # TYPE_CHECKING only
    assert graph["tiering.demo.b"] == {"tiering.demo.c"}
    assert graph["tiering.demo.c"] == {"tiering.demo.b"}
    assert find_cycles(graph) == [["tiering.demo.b", "tiering.demo.c"]]


def test_no_import_cycles():
    cycles = find_cycles(import_graph(source_modules()))
    assert cycles == [], "import cycles (function-level imports included): " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


def test_no_module_over_400_lines():
    oversized = {
        name: n for name, path in source_modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert oversized == {}, f"modules over {MAX_LINES} lines: {oversized}"


def test_the_registry_imports_no_tiering_module():
    # Name resolution sits below every user of it (the spec included): its base classes and registered
    # classes are named by import path, so no factory needs splitting to dodge a cycle.
    assert import_graph(source_modules())["tiering.core.registry"] == set()
