"""The out-of-tree guide's smallest block-store backend (a directory of files), run as the guide prints it.

The python block that defines ``DirTier`` is written to ``my_dir_tier.py`` (the name the guide tells the reader
to save it under) and imported from there; the conformance suite runs on it capped and uncapped, and the
tests below check what makes it a real persistent tier: restart reuse, the cap, damaged blocks refused.
"""

import atexit
import errno
import importlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tiering.core.factory import create_secondary_tier
from tiering.core.format import HEADER_SIZE
from tiering.core.primary import allocate_host_buffer
from tiering.testing import TierConformanceTests
from tiering.testing.harness import load_blocks, make_key, make_spec, store_blocks

DOCS = Path(__file__).resolve().parents[4] / "docs" / "content"
GUIDE = DOCS / "out-of-tree.md"
TEXT = GUIDE.read_text()
SOURCE = next(b for b in re.findall(r"^```python\n(.*?)^```", TEXT, re.S | re.M) if "class DirTier(IndexedTier)" in b)
BB = 4096
STORED = BB + HEADER_SIZE


def _import_guide_module():
    """``my_dir_tier.py`` written from the guide into a directory of its own, imported as a user would."""
    folder = tempfile.mkdtemp(prefix="guide-dir-tier-")
    atexit.register(shutil.rmtree, folder, True)
    Path(folder, "my_dir_tier.py").write_text(SOURCE)
    sys.path.insert(0, folder)
    try:
        return importlib.import_module("my_dir_tier")
    finally:
        sys.path.remove(folder)


my_dir_tier = _import_guide_module()


def test_the_heading_states_the_samples_line_count_and_it_is_under_80():
    lines = len(SOURCE.splitlines())
    assert lines < 80
    assert f"\n## A persistent tier in {lines} lines\n" in TEXT
    links = re.findall(r"out-of-tree\.md#(a-persistent-tier-in-[^)]*)", (DOCS / "toolkit.md").read_text())
    assert links == [f"a-persistent-tier-in-{lines}-lines"]  # the link follows the heading


class TestGuideDirTierConformance(TierConformanceTests):
    @pytest.fixture
    def tier_config(self, tmp_path):
        return {"type": "DirTier", "module_path": "my_dir_tier", "root": str(tmp_path / "kv")}


class TestGuideDirTierCappedConformance(TierConformanceTests):
    @pytest.fixture
    def tier_config(self, tmp_path):
        cap = 8 * (self.block_bytes + HEADER_SIZE)  # fewer than the suite stores: it evicts on the way
        return {"type": "DirTier", "module_path": "my_dir_tier", "root": str(tmp_path / "kv"), "capacity_bytes": cap}


@pytest.fixture
def open_tier(tmp_path):
    """Opens guide tiers on one root (as a restarted process would); every one is shut down at the end."""
    tiers = []

    def _open(**config):
        spec, view = make_spec(block_bytes=BB, num_blocks=8), allocate_host_buffer(8, BB)
        tier = my_dir_tier.DirTier(spec, view, "DirTier", root=str(tmp_path), **config)
        tiers.append(tier)
        assert tier.wait_for_scan(10)
        return tier, view

    yield _open
    for tier in tiers:
        tier.shutdown()


def files(tier):
    """Names in the tier's namespace directory."""
    return sorted(os.listdir(tier.blocks.location))


def test_the_guides_config_entry_builds_the_tier(tmp_path):
    entry = re.search(r'`(\{"type": "DirTier".*?\})`', TEXT.replace("\n", " "), re.S).group(1)
    config = json.loads(entry)
    config["root"] = str(tmp_path)
    spec = make_spec(block_bytes=BB, num_blocks=8)
    tier = create_secondary_tier(config, allocate_host_buffer(8, BB), spec)
    try:
        assert type(tier).__name__ == "DirTier" and tier.capacity_bytes == 10 * 2**30
        assert tier.blocks.location == os.path.join(str(tmp_path), spec.namespace.digest)
    finally:
        tier.shutdown()


def test_a_restart_serves_the_blocks_on_disk(open_tier):
    tier, view = open_tier()
    keys = [make_key(i, b"restart") for i in range(5)]
    assert store_blocks(tier, view, keys)
    tier.shutdown()
    again, view = open_tier(capacity_bytes=8 * STORED)
    assert again.stats()["resident_blocks"] == 5  # indexed by the start-up scan, before any lookup
    assert all(again.lookup(k, None) for k in keys)
    assert load_blocks(again, view, keys)  # every byte checked


def test_the_cap_evicts_the_least_recently_used_files(open_tier):
    tier, view = open_tier(capacity_bytes=4 * STORED)
    keys = [make_key(i, b"cap") for i in range(6)]
    for key in keys[:4]:  # one job each: the LRU order is the order of the keys
        assert store_blocks(tier, view, [key])
    assert load_blocks(tier, view, keys[:1])  # key 0 used again: keys 1 and 2 are the oldest now
    for key in keys[4:]:
        assert store_blocks(tier, view, [key])
    assert files(tier) == sorted(k.hex() for k in [keys[0], keys[3], keys[4], keys[5]])
    stats = tier.stats()
    assert stats["resident_bytes"] == 4 * STORED and stats["evictions"] == 2
    tier.shutdown()
    smaller, _ = open_tier(capacity_bytes=2 * STORED)  # a restart with a smaller cap evicts down to it
    assert len(files(smaller)) == 2 and smaller.stats()["resident_bytes"] == 2 * STORED


@pytest.mark.parametrize(
    ("damage", "cause"),
    [("flip", "checksum"), ("truncate", "truncated"), ("other key", "foreign")],
)
def test_a_damaged_block_is_refused_and_removed(open_tier, damage, cause):
    tier, view = open_tier()
    key, other = make_key(1, b"damage"), make_key(2, b"damage")
    assert store_blocks(tier, view, [key, other])
    path = tier.blocks.path(key)
    data = bytearray(Path(path).read_bytes())
    if damage == "flip":
        data[HEADER_SIZE + 10] ^= 0xFF
    elif damage == "truncate":
        data = data[: HEADER_SIZE + 100]
    else:
        data = bytearray(Path(tier.blocks.path(other)).read_bytes())  # the right size, another key's block
    Path(path).write_bytes(data)
    assert not load_blocks(tier, view, [key], slots=[3])
    stats = tier.stats()
    assert stats[f"load_failed_{cause}"] == 1 and stats["bad_blocks_removed"] == 1
    assert not os.path.exists(path) and tier.lookup(key, None) is False
    assert load_blocks(tier, view, [other])  # the sound block is still served


def test_a_failed_write_leaves_no_temporary_and_strays_do_not_stop_the_scan(open_tier, monkeypatch):
    tier, view = open_tier()
    kept = make_key(1, b"stray")
    assert store_blocks(tier, view, [kept])

    def fails(src, dst):
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as patch:
        patch.setattr(my_dir_tier.os, "replace", fails)
        assert not store_blocks(tier, view, [make_key(2, b"stray")])
    assert tier.stats()["store_failed_io_error"] == 1
    assert files(tier) == [kept.hex()]  # no temporary left behind
    Path(tier.blocks.location, "notes.txt").write_text("not a block")
    Path(tier.blocks.location, "tmpabcdefgh.tmp").write_bytes(b"x" * 10)  # a killed writer's temporary
    tier.shutdown()
    again, view = open_tier()
    assert again.stats()["resident_blocks"] == 1 and again.stats()["scans"] == 1
    assert load_blocks(again, view, [kept])
