"""Inspection commands open an fs tier read-only: no block evicted, expired, trimmed or rewritten, whatever the
config's cap, TTLs or defaults say. A test per command compares the root before and after."""

import json
import os
import time
from pathlib import Path

import pytest

from tiering.cli.main import main
from tiering.core.factory import create_spec
from tiering.core.primary import allocate_host_buffer
from tiering.fs.layout import TRAILER_BYTES
from tiering.fs.testing import BB
from tiering.testing.harness import make_key, store_blocks

STORED = BB + TRAILER_BYTES
BLOCKS = 20


def _config(tmp_path, name, **tier):
    entry = {"type": "fs", "root": str(tmp_path / "kv"), **tier}
    path = tmp_path / name
    path.write_text(json.dumps({"cpu_bytes_to_use": 32 * BB, "block_bytes": BB, "secondary_tiers": [entry]}))
    return str(path)


def snapshot(root, skip_pins=False):
    """Every file under ``root``: relative path -> (size, mtime in ns)."""
    out = {}
    for path in Path(root).rglob("*"):
        if path.is_file() and not (skip_pins and path.parent.name == "pins"):
            st = path.stat()
            out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def stocked(tmp_path):
    """A root of 20 blocks two hours old, a stale temporary and a damaged block file; a config whose cap holds 4
    blocks and whose tenants' TTL is a minute: an engine opening it would evict, expire and trim."""
    spec = create_spec(json.loads(Path(_config(tmp_path, "store.json", capacity_bytes=64 * STORED)).read_text()))
    view = allocate_host_buffer(BLOCKS, BB)
    [tier] = spec.create_secondary_tiers(view)
    try:
        assert store_blocks(tier, view, [make_key(i, b"c34") for i in range(BLOCKS)])
    finally:
        tier.shutdown()
    root = tmp_path / "kv"
    blocks = sorted(root.rglob("*.kvb"))
    assert len(blocks) == BLOCKS
    shard = blocks[0].parent
    (shard / f"{'cd' * 32}.kvb.tmp.otherhost.123.0badc0de.1").write_bytes(b"x" * 10)  # another host's, stale
    (shard / f"{shard.name}{'ef' * 31}.kvb").write_bytes(b"torn")  # a block file of the wrong size
    past = time.time() - 7200
    for path in root.rglob("*"):
        if path.is_file() and path.name != "namespace.json":
            os.utime(path, (past, past))
    config = _config(tmp_path, "inspect.json", capacity_bytes=4 * STORED, max_pinned_bytes=2 * STORED,
                     tenants={"default": {"ttl_s": 60}})  # fmt: skip
    return root, config, snapshot(root)


def test_c34_ls_changes_nothing(stocked, capsys):
    root, config, before = stocked
    assert main(["ls", config]) == 0
    assert "kv_layout=opaque" in capsys.readouterr().out
    assert snapshot(root) == before


def test_c34_stat_changes_nothing_whatever_the_cap_and_ttl(stocked, capsys):
    root, config, before = stocked
    assert main(["stat", config, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["tiers"][0]["stats"]
    assert stats["resident_blocks"] == BLOCKS  # what is there, not what a cap of 4 would leave
    assert snapshot(root) == before


def test_c34_verify_without_remove_changes_nothing(stocked, capsys):
    root, config, before = stocked
    main(["verify", config])
    capsys.readouterr()
    assert snapshot(root) == before


def test_c34_check_probe_changes_nothing(stocked, capsys):
    root, config, before = stocked
    assert main(["check", config, "--probe"]) == 0
    capsys.readouterr()
    assert snapshot(root) == before


def test_c34_pin_writes_pin_records_only(stocked, capsys):
    root, config, before = stocked
    assert main(["pin", config, "--ttl", "1h", "--keys", make_key(0, b"c34").hex()]) == 0
    capsys.readouterr()
    assert snapshot(root, skip_pins=True) == before
    added = set(snapshot(root)) - set(before)
    assert len(added) == 1 and all(Path(p).parent.name == "pins" and p.endswith(".pin") for p in added)
    assert main(["pin", config, "--ttl", "1h", "--keys", "zz"]) == 2  # a bad flag: refused, nothing touched
    capsys.readouterr()
    assert snapshot(root, skip_pins=True) == before
