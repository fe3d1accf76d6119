"""The out-of-tree guide's smallest block-store backend (a directory of files) passes the conformance suite."""

import re
import sys
import types
from pathlib import Path

import pytest

from tiering.core.testing import TierConformanceTests

GUIDE = Path(__file__).resolve().parents[4] / "docs" / "content" / "out-of-tree.md"


def _guide_module() -> types.ModuleType:
    """The guide's block-store sample (the python block that defines ``DirTier``) as module ``guide_dir_tiers``."""
    blocks = re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(), re.S | re.M)
    source = next(b for b in blocks if "class DirTier(IndexedTier)" in b)
    module = types.ModuleType("guide_dir_tiers")
    exec(compile(source, f"{GUIDE.name}:DirTier", "exec"), module.__dict__)
    return module


sys.modules.setdefault("guide_dir_tiers", _guide_module())


def test_the_guide_sample_is_small():
    source = next(b for b in re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(), re.S | re.M) if "DirTier(" in b)
    assert len(source.splitlines()) < 80


class TestGuideDirTierConformance(TierConformanceTests):
    @pytest.fixture
    def tier_config(self, tmp_path):
        return {"type": "DirTier", "module_path": "guide_dir_tiers", "root": str(tmp_path / "kv")}


class TestGuideDirTierCappedConformance(TierConformanceTests):
    @pytest.fixture
    def tier_config(self, tmp_path):
        cap = 64 * (self.block_bytes + 128)
        return {
            "type": "DirTier",
            "module_path": "guide_dir_tiers",
            "root": str(tmp_path / "kv"),
            "capacity_bytes": cap,
        }
