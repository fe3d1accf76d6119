"""``tiering check --probe`` and the inspection commands on fs roots: warnings, and nothing created."""

import json
import shutil

import pytest

from tiering.cli.main import main
from tiering.fs.root import filesystem_type


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
    assert f"free at {tmp_path / 'kv'}; the tier holds no more than the disk does" in out
    assert "config ok" in out
    assert not (tmp_path / "kv").exists()


def test_probe_does_not_warn_when_capacity_fits(tmp_path, capsys):
    assert main(["check", _config(tmp_path, capacity_bytes=1 << 20), "--probe"]) == 0
    assert "warning" not in capsys.readouterr().out


def _proc_config(tmp_path):
    path = tmp_path / "config.json"
    entry = {"type": "fs", "root": "/proc", "capacity_bytes": 1 << 20}
    path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "block_bytes": 4096, "secondary_tiers": [entry]}))
    return str(path)


@pytest.mark.skipif(filesystem_type("/proc") != "proc", reason="needs Linux /proc mounted as procfs")
def test_probe_of_a_root_on_proc_says_it_stores_no_files(tmp_path, capsys):
    assert main(["check", _proc_config(tmp_path), "--probe"]) == 2
    err = capsys.readouterr().err
    assert "secondary_tiers[0].root: '/proc'" in err
    assert "it is on a 'proc' filesystem, which shows kernel state and stores no files" in err
    assert "No such file or directory" not in err


@pytest.mark.skipif(filesystem_type("/proc") != "proc", reason="needs Linux /proc mounted as procfs")
def test_opening_a_root_on_proc_says_it_stores_no_files(tmp_path):
    from tiering.core.factory import create_spec
    from tiering.fs.errors import RootNotUsableError

    with open(_proc_config(tmp_path), encoding="utf-8") as f:
        spec = create_spec(json.load(f))
    with pytest.raises(RootNotUsableError, match=r"cannot create directory '/proc/\w+': it is on a 'proc' filesystem"):
        spec.get_manager()


def test_filesystem_type_takes_the_longest_mount_point(tmp_path, monkeypatch):
    from tiering.fs import root

    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/sda1 / ext4 rw 0 0\nproc /proc proc rw 0 0\ntmp /tmp/my\\040dir tmpfs rw 0 0\n")
    monkeypatch.setattr(root, "MOUNTS", str(mounts))
    assert filesystem_type("/proc/self") == "proc"
    assert filesystem_type("/procfs") == "ext4"
    assert filesystem_type("/tmp/my dir/kv") == "tmpfs"
    monkeypatch.setattr(root, "MOUNTS", str(tmp_path / "missing"))
    assert filesystem_type("/proc") is None


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
