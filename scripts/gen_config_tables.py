"""Generate the tier key tables of docs/content/configuration.md from each tier's declared config schema.

Each section between ``<!-- BEGIN GENERATED: <tier> keys -->`` and
``<!-- END GENERATED: <tier> keys -->`` is rewritten from the ``config_schema``
of the installed tier class registered under ``<tier>`` (``example``, ``fs``,
``s3``, ``redis``), or from the core's cost model keys for ``cost_model`` and
its admission keys (accepted by every tier entry) for ``admission``:
one row per key with what a valid value looks like, its
default, whether it is a credential, and its one-line description. The page
then shows the tables as they are on GitHub too (no include directive).

    python scripts/gen_config_tables.py          # rewrite the page
    python scripts/gen_config_tables.py --check  # exit 1 when the page is stale (tests/docs runs this)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "content" / "configuration.md"
SECTION = re.compile(r"(<!-- BEGIN GENERATED: (\w+) keys -->\n)(.*?)(<!-- END GENERATED: \2 keys -->)", re.S)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(key: Any) -> str:
    if key.required:
        return "required"
    value = key.default
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 600, as a config would write it, not 600.0
    return f"`{json.dumps(value)}`"


def table(tier: str) -> str:
    """The markdown table of ``tier``'s declared keys, in declaration order.

    Raises:
        SystemExit: the tier is not installed or declares no schema.
    """
    from tiering.core.factory import SecondaryTierFactory
    from tiering.core.policies.admission import admission_schema
    from tiering.core.policies.costmodel import COST_SCHEMA

    if tier in ("cost_model", "admission"):
        schema = COST_SCHEMA if tier == "cost_model" else admission_schema("any")
    else:
        schema = SecondaryTierFactory.get_class(tier).config_schema
    if schema is None:
        raise SystemExit(f"tier {tier!r} declares no config_schema: nothing to generate")
    rows = ["| key | valid values | default | meaning |", "| --- | --- | --- | --- |"]
    for key in schema.keys.values():
        said = "redact" in key.doc  # the doc already says it is a credential
        meaning = key.doc + (" (a credential: redacted from every output)" if key.secret and not said else "")
        rows.append(f"| `{key.name}` | {_cell(key.describe())} | {_default(key)} | {_cell(meaning)} |")
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    """``text`` with every generated section rewritten."""
    return SECTION.sub(lambda m: m.group(1) + table(m.group(2)) + m.group(4), text)


def main(argv: list[str] | None = None) -> int:
    """Rewrite the page, or with ``--check`` exit 1 (naming the script) when it is stale."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page differs from the schemas")
    args = parser.parse_args(argv)
    current = PAGE.read_text()
    if not SECTION.search(current):
        raise SystemExit(f"{PAGE.relative_to(REPO)}: no generated section")
    wanted = render(current)
    if args.check:
        if wanted != current:
            print(f"{PAGE.relative_to(REPO)} is stale: run python scripts/gen_config_tables.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
