"""Sources and docs name no tracker ids and no path outside the repository.

A reader of the repository cannot resolve "C13", "issue 23", "fault kind 10",
"seed 000", "#24" or "../shared/cases": comments, docstrings and docs say what
the code guards against instead. Test names keep their case ids (tests are not
scanned), and so may the CHANGELOGs (history).
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED_SUFFIXES = {".py", ".c", ".h", ".md", ".yml"}
VENDORED = {"xxhash.h", "xxh_x86dispatch.c"}  # third-party sources, kept as released upstream
C_STANDARDS = {"C89", "C90", "C99", "C11", "C17", "C18", "C23"}  # C language versions, not case ids

# Matched over a whole file: a reference may be wrapped across two lines ("issue\n17").
FORBIDDEN = {
    "a case id": re.compile(r"\b[Cc]ases?\s+C\d{2}\b|\bC\d{2}\b"),
    "an issue number": re.compile(r"\b[Ii]ssues?\s+#?\d+|\bthe\s+issue's\b"),
    "a tracker number": re.compile(r"(?<![\w&/])#\d+\b"),
    "a fault kind number": re.compile(r"\b(?:fault\s+)?kinds?\s+\d+\b"),
    "a seed number": re.compile(r"\b[Ss]eeds?\s+\d{3}\b"),
    "a path outside the repository": re.compile(r"\.\./shared\b|\bshared/(?:design|cases)\b"),
}


def scanned_files() -> list[Path]:
    roots = [*sorted((ROOT / "packages").glob("*/src")), ROOT / "docs", *sorted(ROOT.glob("packages/*/README.md"))]
    files = [ROOT / "README.md"]
    for root in roots:
        candidates = [root] if root.is_file() else sorted(root.rglob("*"))
        files += [
            path
            for path in candidates
            if path.is_file()
            and path.suffix in SCANNED_SUFFIXES
            and path.name not in VENDORED
            and path.name != "CHANGELOG.md"
        ]
    return files


def references(text: str) -> list[tuple[int, str, str]]:
    """``(line number, what, matched text)`` of every tracker id or outside path in ``text``."""
    found = []
    for what, pattern in FORBIDDEN.items():
        for match in pattern.finditer(text):
            if what == "a case id" and match.group(0) in C_STANDARDS:
                continue
            found.append((text.count("\n", 0, match.start()) + 1, what, match.group(0)))
    return sorted(found)


def test_the_scan_covers_sources_and_docs():
    names = {path.relative_to(ROOT).as_posix() for path in scanned_files()}
    assert "packages/tiering-core/src/tiering/core/store/pool.py" in names
    assert "docs/content/vllm.md" in names and "README.md" in names
    assert not any(name.endswith("CHANGELOG.md") or name.endswith("xxhash.h") for name in names)


@pytest.mark.parametrize(
    "text",
    [
        "# guards against case C21 (the cap)",
        "see C13 for the details",
        "fixed in issue 23",
        "which of issue\n17's targets",
        "in the issue's run",
        "as asked in #24",
        "a fault kind 10 block",
        "replayed with seed 000",
        "per ../shared/cases/README.md",
        "the vocabulary of shared/design/architecture.md",
    ],
)
def test_each_kind_of_reference_is_caught(text):
    assert references(text), text


@pytest.mark.parametrize(
    "text",
    [
        "needs a C99 compiler; C11 atomics",
        "the 2 MiB blocks of 16 kinds",
        "a seed of 0 gives the same workload",
        "[KV events](#kv-events-a-router-can-trust)",
        "&#39; is an HTML entity",
        "https://github.com/asmjit/asmjit/issues/78",
    ],
)
def test_ordinary_text_passes(text):
    assert not references(text), references(text)


def test_sources_and_docs_name_no_tracker_ids_or_outside_paths():
    bad = [
        f"{path.relative_to(ROOT)}:{number}: {what} {matched!r}"
        for path in scanned_files()
        for number, what, matched in references(path.read_text(encoding="utf-8"))
    ]
    assert not bad, "say what the code guards against instead:\n" + "\n".join(bad)
