"""``tiering bench`` refuses, before the replay and naming the flag, an output it could not write at the end."""

import json

import pytest

from tiering.cli.bench.arguments import check_output_file, check_plot_file
from tiering.cli.main import main
from tiering.testing import requires_tier


def primary_only_config(tmp_path, block_bytes=1024, blocks=64):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"cpu_bytes_to_use": blocks * block_bytes, "block_bytes": block_bytes}))
    return str(path)


def test_a_file_that_cannot_be_created_is_refused_and_nothing_is_left(tmp_path):
    with pytest.raises(ValueError, match=r"^--json /proc/x\.json: cannot create the file: No such file or directory"):
        check_output_file("--json", "/proc/x.json")
    check_output_file("--json", str(tmp_path / "r.json"))
    assert list(tmp_path.iterdir()) == []  # the probe file is removed again


def test_an_existing_file_is_kept_as_it_is(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    check_output_file("--json", str(target))
    assert target.read_text() == "old"


@pytest.mark.parametrize("name", ["out.txt", "replay.PNGX"])
def test_a_plot_format_matplotlib_cannot_write_is_refused_before_the_replay(tmp_path, capsys, name):
    target = tmp_path / name
    argv = ["bench", "--config", primary_only_config(tmp_path), "--requests", "5", "--plot", str(target)]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert f"--plot {target}: matplotlib cannot write the format" in err
    assert "measured:" not in out + err  # nothing replayed
    assert not target.exists()


@pytest.mark.parametrize("name", ["replay.png", "replay.SVG", "replay.pdf", "replay"])
def test_plot_formats_matplotlib_writes_are_accepted(tmp_path, name):
    check_plot_file(str(tmp_path / name))


def test_a_primary_larger_than_the_memory_names_the_cpu_bytes_flag(monkeypatch, capsys):
    from tiering.core.primary import memory

    monkeypatch.setattr(memory, "machine_memory", lambda: memory.MachineMemory(24 << 30, None))
    assert main(["bench", "--block-bytes", "64MiB", "--requests", "1"]) == 2  # 1,024 blocks: 64 GiB
    out, err = capsys.readouterr()
    assert "cpu_bytes_to_use: 68719476736 bytes (64.0 GiB) is more than this machine's memory" in err
    assert "in tiering bench pass --cpu-bytes with a smaller size (e.g. --cpu-bytes 4GiB)" in err
    assert "measured:" not in out + err


def test_cpu_bytes_sets_the_primary_tier_and_overrides_the_config(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["bench", "--config", primary_only_config(tmp_path), "--requests", "3", "--cpu-bytes", "32KiB"]
    assert main([*argv, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["stack"]["primary_blocks"] == 32
    assert "--cpu-bytes 32768 overrides the config's cpu_bytes_to_use" in capsys.readouterr().err
    out.unlink()
    # the default stack (a temporary fs tier behind it where tiering-fs is installed, else the primary alone)
    assert main(["bench", "--requests", "3", "--cpu-bytes", "1MiB", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["stack"]["primary_blocks"] == 64  # of 16 KiB blocks


@requires_tier("fs")
def test_the_default_fs_cap_scales_with_the_primary_tier_so_larger_blocks_still_hit(tmp_path, monkeypatch, capsys):
    from tiering.cli.bench import stack

    # the README's real-sizes command scaled down 1,024 times (64 KiB blocks, a primary of 16 blocks), the
    # 256 MiB floor with it: 4 x the primary tier is the cap, 4 MiB, so the fs tier holds about 60 blocks
    monkeypatch.setattr(stack, "DEFAULT_BENCH_CAPACITY_BYTES", 256 << 10)
    out = tmp_path / "r.json"
    argv = ["bench", "--block-bytes", "64KiB", "--cpu-bytes", "1MiB", "--requests", "10", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["stack"]["tiers"][0]["capacity_bytes"] == 4 << 20
    assert "0:fs (capped at 4.0 MiB: the default stack's cap, max(256 MiB, 4 x the primary tier))" in (
        capsys.readouterr().out
    )
    assert report["hits"]["0:fs"] > 0  # under the floor alone (3 blocks) the fs tier served none
    assert report["bytes_loaded"]["0:fs"] == report["hits"]["0:fs"] * (64 << 10)
    assert stack.bench_capacity_bytes(1 << 30) == 4 << 30  # --cpu-bytes 1GiB: a 4 GiB fs tier, 64 blocks of 64 MiB


def test_json_without_a_file_prints_the_report_as_json_alone_as_the_other_commands_do(tmp_path, capsys):
    assert main(["bench", "--config", primary_only_config(tmp_path), "--requests", "20", "--json"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out)  # stdout holds the JSON document and nothing else
    assert data["requests"] == 20 and data["hits_total"] == sum(data["hits"].values())
    assert not list(tmp_path.glob("-*"))  # no file named after the flag's default


def test_json_with_a_file_writes_it_beside_the_text_report(tmp_path, capsys):
    target = tmp_path / "r.json"
    assert main(["bench", "--config", primary_only_config(tmp_path), "--requests", "20", "--json", str(target)]) == 0
    out = capsys.readouterr().out
    assert "measured: the storage path only" in out and not out.lstrip().startswith("{")
    assert json.loads(target.read_text())["requests"] == 20
