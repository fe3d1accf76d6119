"""The docs' home page: an index linking every page, no claim the other pages contradict, one CI time.

Every page under docs/content is reachable from index.md (a page added without a link fails here); the
home page does not say a binding is missing that the README and that binding's page describe; every
place that quotes how long the whole CI run takes quotes the README's measured figure, with its date.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTENT = ROOT / "docs" / "content"
INDEX = CONTENT / "index.md"


def _links(text: str) -> set[str]:
    return {target.split("#", 1)[0] for target in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in target}


def test_every_page_under_docs_content_is_linked_from_the_index():
    linked = _links(INDEX.read_text(encoding="utf-8"))
    pages = {str(p.relative_to(CONTENT)) for p in CONTENT.rglob("*.md")} - {"index.md"}
    assert pages, "no pages found"
    assert sorted(pages - linked) == []
    assert sorted(t for t in linked if t.endswith(".md") and not (CONTENT / t).is_file()) == []


def test_the_index_claims_no_missing_binding_that_its_page_describes():
    text = " ".join(INDEX.read_text(encoding="utf-8").split())
    assert "there is no SGLang binding" not in text
    assert "LMCache has not been measured" not in text
    for page in ("sglang.md", "lmcache.md"):
        assert (CONTENT / page).is_file() and f"]({page})" in text


def _ci_figure() -> tuple[str, str]:
    """``(minutes, date)`` of the README's measured CI run: "took **1,976 s of steps (33 min)**" and its date."""
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    found = re.search(
        r"\((?:otherwise idle, )?(\d{4}-\d{2}-\d{2})[^)]*\) took \*\*[\d,]+ s of steps \((\d+) min\)\*\*", text
    )
    assert found, "the README's Development section no longer states the measured CI time"
    return found.group(2), found.group(1)


def test_every_quoted_ci_time_is_the_readmes_measured_figure_with_its_date():
    minutes, date = _ci_figure()
    files = [ROOT / "README.md", *sorted(CONTENT.rglob("*.md"))]
    quotes = []
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            if "whole CI run" in line or re.search(r"\.ci/run.*\b(minutes|min)\b", line):
                quotes.append((path.name, line))
    assert len(quotes) >= 2, quotes
    for name, line in quotes:
        assert f"{minutes} min on {date}" in line, f"{name}: {line}"
        assert not re.search(r"about \d+ minutes", line), f"{name}: {line}"
