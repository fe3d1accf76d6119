"""``tiering bench`` through a capped fs tier: the report shows the cap, the evictions and the bytes as stored."""

import json
import re

from tiering.cli.main import main


def test_bench_report_shows_the_fs_tiers_cap_evictions_and_on_disk_size(tmp_path, capsys):
    config = tmp_path / "config.json"
    tier = {"type": "fs", "root": str(tmp_path / "kv"), "capacity_bytes": "1MiB"}
    config.write_text(json.dumps({"cpu_bytes_to_use": "256KiB", "block_bytes": "16KiB", "secondary_tiers": [tier]}))
    report = tmp_path / "r.json"
    assert main(["bench", "--config", str(config), "--requests", "60", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    fs = data["tier_stats"]["0:fs"]
    assert fs["capacity_bytes"] == 1 << 20 and fs["evictions"] > 0
    assert "-> 0:fs (capped at 1.0 MiB), blocks written to " in out
    row = re.search(
        r"^  0:fs +capacity 1\.0 MiB, used (.*), evictions ([\d,]+) \((.*)\), failed stores: none$", out, re.M
    )
    assert row is not None, out
    assert int(row.group(2).replace(",", "")) == fs["evictions"]
    per_block = fs["resident_bytes"] // fs["resident_blocks"]
    assert f"0:fs counts bytes as stored: {per_block:,} B per 16.0 KiB block" in out
    assert data["request_bytes"] == sum(data["bytes_loaded"].values()) + data["bytes_stored"]["primary"]
    assert data["bytes_stored"]["0:fs"] > 0  # written into fs as well, but counted once in the throughput
    assert re.search(r"^  0:fs store +[\d,]+ jobs: p50 [\d.]+ ms, p99 [\d.]+ ms", out, re.M)
