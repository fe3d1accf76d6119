"""tiering ls / stat / gc / verify on an fs root: core's inspector conformance suite, plus what is fs-specific."""

import os
import time
from pathlib import Path

import pytest

from tiering.cli.main import main
from tiering.cli.testing import InspectorConformanceTests
from tiering.core.inspection import BlockInfo


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


HOSTILE = "evil\nmodel\x1b[31m\u202etxt.exe"
"""A model name with a newline, an ANSI escape (red) and a right-to-left override."""
ESCAPED = "evil\\nmodel\\x1b[31m\\u202etxt.exe"


def _hostile_stack(tmp_path):
    """An fs root (its directory name hostile too) holding 3 blocks of a namespace whose model name is HOSTILE."""
    from tiering.core.factory import create_secondary_tier
    from tiering.core.primary import allocate_host_buffer
    from tiering.core.runtime.tiering_spec import TieringOffloadingSpec
    from tiering.testing.harness import make_key, store_blocks

    tier_config = {"type": "fs", "root": str(tmp_path / "kv\x1b[2J\u202eroot")}
    config = {"cpu_bytes_to_use": 8 * 4096, "block_bytes": 4096, "model": HOSTILE, "secondary_tiers": [tier_config]}
    spec = TieringOffloadingSpec(config)
    view = allocate_host_buffer(8, 4096)
    tier = create_secondary_tier(tier_config, view, spec)
    try:
        assert store_blocks(tier, view, [make_key(i) for i in range(3)])
    finally:
        tier.shutdown()
    return config, spec.namespace.digest


def _assert_terminal_safe(text):
    assert "\x1b" not in text and "\u202e" not in text, repr(text)


def test_c26_ls_stat_verify_escape_control_and_bidi_characters(tmp_path, capsys):
    import json

    config, digest = _hostile_stack(tmp_path)
    path = _write_config(tmp_path, config)

    assert main(["ls", path]) == 0
    out = capsys.readouterr().out
    _assert_terminal_safe(out)
    lines = out.splitlines()
    # one line for the tier, one for the namespace's figures, one for its fields: the newline did not split it
    assert len(lines) == 3, lines
    assert f"model={ESCAPED}" in lines[2]
    assert "kv\\x1b[2J\\u202eroot" in lines[0]

    assert main(["ls", path, "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["namespaces"][0]["fields"]["model"] == HOSTILE  # JSON keeps the exact string

    assert main(["stat", path]) == 0
    out = capsys.readouterr().out
    _assert_terminal_safe(out)
    assert "kv\\x1b[2J\\u202eroot" in out

    other = dict(config, model_revision="other\nrev\u202e")  # a namespace the root does not hold
    assert main(["stat", _write_config(tmp_path, other)]) == 1
    err = capsys.readouterr().err
    _assert_terminal_safe(err)
    assert f"model={ESCAPED}" in err and "revision=other\\nrev\\u202e" in err
    assert sum(line.startswith("  secondary_tiers[0]") for line in err.splitlines()) == 1

    assert main(["verify", path]) == 0
    out = capsys.readouterr().out
    _assert_terminal_safe(out)
    assert out.splitlines() == [
        f"secondary_tiers[0] fs at {tmp_path}/kv\\x1b[2J\\u202eroot: namespace {digest}: 3 checked, 3 sound, 0 corrupt"
    ]


def test_verify_on_a_root_without_namespace_says_nothing_was_found(tmp_path, capsys):
    (tmp_path / "kv").mkdir()
    config = {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{"type": "fs", "root": str(tmp_path / "kv")}]}
    assert main(["verify", _write_config(tmp_path, config)]) == 0
    assert capsys.readouterr().out == (
        f"secondary_tiers[0] fs at {tmp_path / 'kv'}: no namespace found, nothing to verify (see `tiering ls`)\n"
    )
