"""The architecture page describes the tree as it is, and the tree keeps the microkernel's rules."""

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "packages" / "tiering-core" / "src" / "tiering" / "core"
DISTRIBUTIONS = sorted(p.name.removeprefix("tiering-") for p in (REPO / "packages").iterdir())
DISTRIBUTIONS.remove("core")
TOOLS = ("cli", "testing")
"""Distributions of tools (the command, the test suites): every other one is a tier or an engine adapter."""
BACKENDS = [d for d in DISTRIBUTIONS if d not in TOOLS]


def test_architecture_page_is_generated_from_the_tree():
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_architecture.py"), "--check"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr


def _code_strings(path):
    """String constants of a module that are not docstrings."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_core_names_no_backend():
    """Core asks installed tiers (entry points, medium, default_local_config); it never branches on a backend's name.

    The deprecated shims at the adapters' old paths name their new homes (they are nothing but that name).
    """
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {value!r}"
        for path in sorted(CORE.rglob("*.py"))
        if "testing" not in path.parts and path.name != "testing.py" and not _is_shim(path)
        for line, value in _code_strings(path)
        if value in BACKENDS
        or value in {f"tiering.{b}" for b in BACKENDS}
        or value in {f"tiering-{b}" for b in BACKENDS}
    ]
    assert offenders == []


def _is_shim(path):
    return "from tiering.core._moved import" in path.read_text()


def test_backends_import_core_only():
    """A tier or an adapter imports only core (and, in its test fixtures, the test suites); a tool only core too."""
    for backend in DISTRIBUTIONS:
        src = REPO / "packages" / f"tiering-{backend}" / "src"
        for path in src.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and not node.level
                    else []
                )
                for name in names:
                    if name.startswith("tiering."):
                        allowed = ("core", backend, "testing") if path.name == "testing.py" else ("core", backend)
                        assert name.split(".")[1] in allowed, f"{path.relative_to(REPO)} imports {name}"
