"""``tiering bench --pin``: pinned prefixes survive a replay that fills the fs tier ten times over."""

import json

from tiering.cli.main import main


def test_pinned_set_survives_whole_a_replay_filling_the_tier_ten_times_over(tmp_path, capsys):
    config = tmp_path / "config.json"
    tier = {"type": "fs", "root": str(tmp_path / "kv"), "capacity_bytes": "2MiB"}
    config.write_text(json.dumps({"cpu_bytes_to_use": "256KiB", "block_bytes": "16KiB", "secondary_tiers": [tier]}))
    report = tmp_path / "r.json"
    argv = ["bench", "--config", str(config), "--requests", "600", "--pin", "12", "--json", str(report)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["bytes_stored"]["0:fs"] >= 10 * (2 << 20)  # the second pass alone wrote the tier 10x over
    off, on = data["pin_comparison"]["pins off"], data["pin_comparison"]["pins on"]
    assert on["pinned_in_tiers"] == [True] and off["pinned_in_tiers"] == []
    assert on["survived"] == 12  # every pinned block still stored at the end
    assert off["survived"] < 12
    assert on["pinned_hit_ratio"] > off["pinned_hit_ratio"]
    assert data["tier_stats"]["0:fs"]["pinned_blocks"] == 12
    assert "pinned prefixes (the trace's most shared blocks):" in out
    assert f"pins on   12 blocks, 12 still stored at the end; hit ratio: pinned {on['pinned_hit_ratio']:.2%}" in out
    assert not list((tmp_path / "kv").rglob("*.pin"))  # the bench's pins end with it: the config's tier is the user's


def test_pin_with_tenants_is_refused(tmp_path, capsys):
    assert main(["bench", "--requests", "10", "--pin", "4", "--tenants", "2"]) == 2
    assert "give --pin or --tenants, not both" in capsys.readouterr().err
