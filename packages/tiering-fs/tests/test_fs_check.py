"""``tiering check --probe`` and the inspection commands on fs roots: warnings, and nothing created."""

import json
import shutil

from tiering.core.cli import main


def _config(tmp_path, **entry):
    path = tmp_path / "config.json"
    tier = {"type": "fs", "root": str(tmp_path / "kv"), **entry}
    path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "block_bytes": 4096, "secondary_tiers": [tier]}))
    return str(path)


def test_probe_warns_when_capacity_exceeds_the_free_disk(tmp_path, capsys):
    free = shutil.disk_usage(tmp_path).free
    assert main(["check", _config(tmp_path, capacity_bytes=free * 4), "--probe"]) == 0
    out = capsys.readouterr().out
    assert f"warning: secondary_tiers[0].capacity_bytes: {free * 4} bytes" in out
    assert f"free at {tmp_path / 'kv'}; stores will fail once the disk is full" in out
    assert "config ok" in out
    assert not (tmp_path / "kv").exists()


def test_probe_does_not_warn_when_capacity_fits(tmp_path, capsys):
    assert main(["check", _config(tmp_path, capacity_bytes=1 << 20), "--probe"]) == 0
    assert "warning" not in capsys.readouterr().out


def test_capacity_with_a_unit_reaches_the_tier_as_bytes(tmp_path, capsys):
    from tiering.core import TieringOffloadingSpec

    entry = {"type": "fs", "root": str(tmp_path / "kv"), "capacity_bytes": "256MiB"}
    spec = TieringOffloadingSpec({"cpu_bytes_to_use": "1MiB", "block_bytes": "16KiB", "secondary_tiers": [entry]})
    manager = spec.get_manager()
    try:
        assert manager.secondary_tiers[0].stats()["capacity_bytes"] == 256 << 20
    finally:
        manager.shutdown()
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"cpu_bytes_to_use": "1MiB", "secondary_tiers": [entry]}))
    assert main(["check", str(path), "--probe"]) == 0
    assert main(["ls", str(path)]) == 0
