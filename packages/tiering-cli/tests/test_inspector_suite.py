"""The inspector conformance suite runs against a minimal persistent tier (tiering-core's tests/support/dir_tier.py)."""

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

from tiering.cli.testing import InspectorConformanceTests
from tiering.core.factory import SecondaryTierFactory

CORE_TESTS = Path(__file__).resolve().parents[2] / "tiering-core" / "tests"
_MODULE = "tiering_core_tests_dir_tier"
if _MODULE not in sys.modules:
    _spec = importlib.util.spec_from_file_location(_MODULE, CORE_TESTS / "support" / "dir_tier.py")
    assert _spec is not None and _spec.loader is not None
    sys.modules[_MODULE] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_MODULE])
if "core-test-dir" not in SecondaryTierFactory.known_names():
    SecondaryTierFactory.register("core-test-dir", _MODULE, "DirTier")


class TestDirTierInspector(InspectorConformanceTests):
    @pytest.fixture
    def tier_config(self, tmp_path):
        return {"type": "core-test-dir", "root": str(tmp_path / "kv")}

    def corrupt_block(self, tier_config, digest, block, how):
        if how == "truncate":
            os.truncate(block.name, 50)
            return
        with open(block.name, "r+b") as f:
            f.seek(-10, os.SEEK_END)
            byte = f.read(1)
            f.seek(-10, os.SEEK_END)
            f.write(bytes([byte[0] ^ 0xFF]))

    def plant_foreign(self, tier_config):
        path = os.path.join(tier_config["root"], "notes.txt")
        Path(path).write_text("not ours")
        return path

    def age_blocks(self, tier_config, digest, blocks, age_s):
        past = time.time() - age_s
        for block in blocks:
            os.utime(block.name, (past, past))
