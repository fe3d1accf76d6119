"""Generate the package/module section of docs/content/architecture.md from the source tree.

The section between the ``<!-- BEGIN GENERATED -->`` and ``<!-- END GENERATED -->``
markers is rewritten from what is really there: one Mermaid diagram of the
distributions, their modules (a subpackage counts as one node) and the imports
that cross a distribution, then one table per distribution listing each module,
its size in lines and what it owns (the first sentence of its docstring).

    python scripts/gen_architecture.py          # rewrite the page
    python scripts/gen_architecture.py --check  # exit 1 when the page is stale (tests/docs runs this)
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "content" / "architecture.md"
BEGIN, END = "<!-- BEGIN GENERATED -->", "<!-- END GENERATED -->"


def distributions() -> list[tuple[str, Path]]:
    """(distribution name, ``src/tiering/<x>`` directory) for every package, core first."""
    found = [(p.name, next((p / "src" / "tiering").iterdir())) for p in sorted((REPO / "packages").iterdir())]
    return sorted(found, key=lambda d: (d[0] != "tiering-core", d[0]))


def module_name(root: Path, path: Path) -> str:
    """Dotted module name of *path* under the distribution's ``tiering/<x>`` directory."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return "tiering." + ".".join(parts)


def summary(path: Path) -> str:
    """First sentence of the module docstring (a missing docstring is an error: every module says what it owns)."""
    doc = ast.get_docstring(ast.parse(path.read_text()))
    if not doc:
        raise SystemExit(f"{path.relative_to(REPO)}: module has no docstring")
    first = doc.strip().split("\n\n")[0].replace("\n", " ")
    return first.split(". ")[0].rstrip(".").replace("|", "\\|")


def imports(path: Path, name: str) -> set[str]:
    """Every ``tiering.*`` module *path* imports, at any depth (function-level imports included)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("tiering."))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base]) if base else ".".join(up)
            if base.startswith("tiering."):
                out.add(base)
    return out


def node_of(name: str) -> str:
    """Diagram node of a module: ``tiering.<x>.<first part>`` (a subpackage is one node)."""
    return ".".join(name.split(".")[:3])


def render() -> str:
    """The generated section (without the markers)."""
    dists = distributions()
    lines = ["```mermaid", "flowchart LR"]
    edges: set[tuple[str, str]] = set()
    tables: list[str] = []
    owner: dict[str, str] = {}
    for dist, root in dists:
        for path in sorted(root.rglob("*.py")):
            owner[node_of(module_name(root, path))] = dist
    for dist, root in dists:
        nodes = sorted({node_of(module_name(root, p)) for p in root.rglob("*.py")})
        lines.append(f'  subgraph {dist.replace("-", "_")}["{dist}"]')
        lines.extend(f'    {n.replace(".", "_")}["{n.removeprefix("tiering.")}"]' for n in nodes if n.count(".") == 2)
        lines.append("  end")
        rows = ["| module | lines | owns |", "| --- | ---: | --- |"]
        for path in sorted(root.rglob("*.py")):
            name = module_name(root, path)
            rows.append(f"| `{name}` | {len(path.read_text().splitlines())} | {summary(path)} |")
            for target in imports(path, name):
                src, dst = node_of(name), node_of(target)
                if dst in owner and owner[dst] != dist and src.count(".") == 2 and dst.count(".") == 2:
                    edges.add((src, dst))
        tables.append(f"### {dist}\n\n" + "\n".join(rows))
    lines.extend(f"  {a.replace('.', '_')} --> {b.replace('.', '_')}" for a, b in sorted(edges))
    lines.append("```")
    intro = (
        "The diagram shows each distribution's modules (a subpackage is one box) and every import that "
        "crosses a distribution: backends depend on core, never on each other, and core names no backend."
    )
    return "\n\n".join([intro, "\n".join(lines), *tables])


def main() -> int:
    """Rewrite the page, or with ``--check`` report whether it is stale."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs from the tree")
    args = parser.parse_args()
    text = PAGE.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    new = f"{head}{BEGIN}\n{render()}\n{END}{tail}"
    if args.check:
        if new != text:
            print(f"{PAGE.relative_to(REPO)} is stale: run python scripts/gen_architecture.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
