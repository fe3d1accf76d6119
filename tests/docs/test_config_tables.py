"""The tier key tables of the configuration page are generated from the tiers' declared schemas and up to date."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "content" / "configuration.md"


def test_configuration_page_tier_tables_match_the_schemas():
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_config_tables.py"), "--check"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr


def test_configuration_page_has_no_include_directive_left():
    """GitHub shows an include directive as a raw line where a table belongs."""
    text = PAGE.read_text()
    assert "--8<--" not in text
    for tier in ("example", "fs", "s3", "redis"):
        assert f"<!-- BEGIN GENERATED: {tier} keys -->\n| key | valid values | default | meaning |" in text
