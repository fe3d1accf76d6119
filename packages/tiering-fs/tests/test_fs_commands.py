"""tiering ls / stat / gc / verify on an fs root."""

import json
import os
import time

import pytest

from tiering.core import TieringOffloadingSpec
from tiering.core.bench import Replayer, synthetic_chat
from tiering.core.cli import main
from tiering.fs.layout import TRAILER_BYTES


def populate(root, revision="r1", requests=40):
    config = {
        "cpu_bytes_to_use": 8 * 4096,
        "block_bytes": 4096,
        "block_size": 64,
        "model_revision": revision,
        "secondary_tiers": [{"type": "fs", "root": str(root)}],
    }
    manager = TieringOffloadingSpec(config).get_manager()
    try:
        Replayer(manager, ["0:fs"]).run(synthetic_chat(requests, 64, conversations=3, system_prompt_tokens=256))
    finally:
        manager.shutdown()
    return config


def write_config(tmp_path, config):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def block_files(root):
    return sorted(p for p in root.rglob("*.kvb"))


@pytest.fixture
def root(tmp_path):
    return tmp_path / "kv"


def test_ls_lists_namespaces_fields_counts_and_foreign(tmp_path, root, capsys):
    config = populate(root, "r1")
    populate(root, "r2", requests=10)
    (root / "notes.txt").write_text("not ours")
    assert main(["ls", write_config(tmp_path, config), "--json"]) == 0
    (tier,) = json.loads(capsys.readouterr().out)
    revisions = {ns["fields"]["revision"]: ns for ns in tier["namespaces"]}
    assert set(revisions) == {"r1", "r2"}
    for ns in tier["namespaces"]:
        files = list((root / ns["digest"]).rglob("*.kvb"))
        assert ns["blocks"] == len(files) > 0
        assert ns["bytes"] == sum(f.stat().st_size for f in files) == ns["blocks"] * (4096 + TRAILER_BYTES)
        assert ns["oldest"] <= ns["newest"]
    assert tier["foreign"] == [str(root / "notes.txt")]


def test_gc_namespace_removes_only_that_namespace_and_no_foreign_file(tmp_path, root, capsys):
    config = populate(root, "r1")
    old = TieringOffloadingSpec({**config, "model_revision": "r0"}).namespace.digest
    populate(root, "r0", requests=10)
    keep = TieringOffloadingSpec(config).namespace.digest
    kept_before = len(list((root / keep).rglob("*.kvb")))
    (root / old / "operator-note.txt").write_text("mine")
    (root / "other.bin").write_bytes(b"x")
    path = write_config(tmp_path, config)
    assert main(["gc", path, "--namespace", old, "--dry-run"]) == 0
    assert "would remove namespace" in capsys.readouterr().out
    assert list((root / old).rglob("*.kvb"))  # dry run removed nothing
    assert main(["gc", path, "--namespace", old]) == 0
    out = capsys.readouterr().out
    assert f"removed namespace {old}" in out and "left 2 foreign entries alone" in out
    assert not list((root / old).rglob("*.kvb")) and not (root / old / "namespace.json").exists()
    assert (root / old / "operator-note.txt").read_text() == "mine"
    assert (root / "other.bin").exists()
    assert len(list((root / keep).rglob("*.kvb"))) == kept_before


def test_gc_older_than_and_to_bytes(tmp_path, root, capsys):
    config = populate(root)
    files = block_files(root)
    old = files[: len(files) // 2]
    past = time.time() - 3 * 86400
    for f in old:
        os.utime(f, (past, past))
    path = write_config(tmp_path, config)
    assert main(["gc", path, "--older-than", "2d"]) == 0
    assert sorted(block_files(root)) == sorted(files[len(files) // 2 :])
    size = 4096 + TRAILER_BYTES
    assert main(["gc", path, "--to-bytes", str(5 * size)]) == 0
    assert len(block_files(root)) == 5
    shard_dirs = [d for d in root.rglob("*") if d.is_dir() and d.parent.parent != root.parent]
    assert all(any(d.iterdir()) for d in shard_dirs)  # no empty shard directory is left behind
    assert main(["gc", path, "--older-than", "soon"]) == 2
    assert "duration 'soon'" in capsys.readouterr().err


def test_gc_never_tears_a_block_being_read(tmp_path, root):
    config = populate(root)
    victim = block_files(root)[0]
    expected = victim.read_bytes()
    with open(victim, "rb") as reader:
        head = reader.read(100)
        assert main(["gc", write_config(tmp_path, config), "--to-bytes", "0"]) == 0
        assert not victim.exists()
        assert head + reader.read() == expected  # the open reader still sees the whole block


def test_verify_finds_planted_corruption_and_removes_it(tmp_path, root, capsys):
    config = populate(root)
    files = block_files(root)
    flipped, truncated = files[0], files[1]
    data = bytearray(flipped.read_bytes())
    data[10] ^= 0xFF  # a payload byte (the payload comes first)
    flipped.write_bytes(bytes(data))
    os.truncate(truncated, 50)
    path = write_config(tmp_path, config)
    assert main(["verify", path]) == 1
    out = capsys.readouterr().out
    assert f"CORRUPT {flipped}: checksum" in out and f"CORRUPT {truncated}: truncated" in out
    assert f"{len(files)} checked, {len(files) - 2} sound, 2 corrupt" in out
    assert flipped.exists()  # report only without --remove
    assert main(["verify", path, "--remove"]) == 1
    assert not flipped.exists() and not truncated.exists()
    assert main(["verify", path, "--sample", "3"]) == 0
    assert "3 checked, 3 sound, 0 corrupt" in capsys.readouterr().out


def test_stat_reports_resident_blocks_after_the_scan(tmp_path, root, capsys):
    config = populate(root)
    assert main(["stat", write_config(tmp_path, config), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (tier,) = report["tiers"]
    assert tier["stats"]["resident_blocks"] == len(block_files(root))
    assert report["namespace"] == TieringOffloadingSpec(config).namespace.digest


def test_commands_fail_clearly_on_unreachable_root_or_bad_config(tmp_path, capsys):
    missing = {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{"type": "fs", "root": str(tmp_path / "nope")}]}
    for command in ("ls", "gc", "verify"):
        argv = [command, write_config(tmp_path, missing)] + (["--to-bytes", "0"] if command == "gc" else [])
        assert main(argv) == 2
        assert "does not exist" in capsys.readouterr().err
    no_tiers = {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": []}
    assert main(["ls", write_config(tmp_path, no_tiers)]) == 2
    assert "no persistent secondary tier" in capsys.readouterr().err
