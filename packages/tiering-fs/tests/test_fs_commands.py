"""tiering ls / stat / gc / verify on an fs root: core's inspector conformance suite, plus what is fs-specific."""

import os
import time
from pathlib import Path

import pytest

from tiering.core.cli import main
from tiering.core.inspection import BlockInfo
from tiering.core.testing import InspectorConformanceTests


class TestFsInspector(InspectorConformanceTests):
    @pytest.fixture
    def tier_config(self, tmp_path):
        return {"type": "fs", "root": str(tmp_path / "kv")}

    def corrupt_block(self, tier_config, digest, block: BlockInfo, how):
        path = Path(block.name)
        if how == "flip":
            data = bytearray(path.read_bytes())
            data[10] ^= 0xFF  # a payload byte (the payload comes first)
            path.write_bytes(bytes(data))
        else:
            os.truncate(path, 50)

    def plant_foreign(self, tier_config):
        path = Path(tier_config["root"]) / "notes.txt"
        path.write_text("not ours")
        return str(path)

    def age_blocks(self, tier_config, digest, blocks, age_s):
        past = time.time() - age_s
        for block in blocks:
            os.utime(block.name, (past, past))

    # -- fs-specific ---------------------------------------------------------------------------
    def test_gc_leaves_no_empty_shard_directory_and_keeps_files_beside_blocks(self, tier_config, tmp_path, capsys):
        digest, _ = self.populate(tier_config, "r1", n=6)
        old, _ = self.populate(tier_config, "r0", n=3)
        root = Path(tier_config["root"])
        (root / old / "operator-note.txt").write_text("mine")
        path = self.write_config(tmp_path, self.stack_config(tier_config))
        assert self.run(["gc", path, "--namespace", old], capsys)[0] == 0
        assert (root / old / "operator-note.txt").read_text() == "mine"  # foreign, left alone
        assert self.run(["gc", path, "--to-bytes", "0"], capsys)[0] == 0
        shard_dirs = [d for d in (root / digest).iterdir() if d.is_dir()]
        assert shard_dirs == []  # gc removes the shard directories it empties

    def test_gc_never_tears_a_block_being_read(self, tier_config, tmp_path, capsys):
        digest, _ = self.populate(tier_config, "r1", n=3)
        victim = Path(next(iter(self.inspector(tier_config).blocks(digest))).name)
        expected = victim.read_bytes()
        with open(victim, "rb") as reader:
            head = reader.read(100)
            path = self.write_config(tmp_path, self.stack_config(tier_config))
            assert self.run(["gc", path, "--to-bytes", "0"], capsys)[0] == 0
            assert not victim.exists()
            assert head + reader.read() == expected  # the open reader still sees the whole block

    def test_temporaries_are_neither_blocks_nor_foreign(self, tier_config):
        digest, keys = self.populate(tier_config, "r1", n=2)
        shard = Path(tier_config["root"]) / digest / "ab"
        shard.mkdir(exist_ok=True)
        temp = shard / f"{'cd' * 32}.kvb.tmp.somehost.123.0badc0de.1"
        temp.write_bytes(b"x")
        inspector = self.inspector(tier_config)
        assert sorted(b.key for b in inspector.blocks(digest)) == sorted(keys)
        assert str(temp) not in list(inspector.foreign())


def _write_config(tmp_path, config):
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_commands_fail_clearly_on_unreachable_root_or_bad_config(tmp_path, capsys):
    missing = {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{"type": "fs", "root": str(tmp_path / "nope")}]}
    for command in ("ls", "gc", "verify"):
        argv = [command, _write_config(tmp_path, missing)] + (["--to-bytes", "0"] if command == "gc" else [])
        assert main(argv) == 2
        assert "does not exist" in capsys.readouterr().err
    no_tiers = {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": []}
    assert main(["ls", _write_config(tmp_path, no_tiers)]) == 2
    assert "no persistent secondary tier" in capsys.readouterr().err


def test_verify_on_a_root_without_namespace_says_nothing_was_found(tmp_path, capsys):
    (tmp_path / "kv").mkdir()
    config = {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{"type": "fs", "root": str(tmp_path / "kv")}]}
    assert main(["verify", _write_config(tmp_path, config)]) == 0
    assert capsys.readouterr().out == (
        f"secondary_tiers[0] fs at {tmp_path / 'kv'}: no namespace found, nothing to verify (see `tiering ls`)\n"
    )
