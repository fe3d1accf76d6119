"""``tiering bench`` through a redis tier capped for the whole fleet (``eviction: "tier"``): the cap is shown."""

import json

from tiering.cli.main import main


def test_bench_shows_the_fleet_wide_cap_of_an_eviction_tier_tier(redis_server, prefix, tmp_path, capsys):
    tier = {"type": "redis", "url": redis_server.url, "prefix": prefix, "eviction": "tier", "capacity_bytes": "8MiB"}
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"cpu_bytes_to_use": "64KiB", "block_bytes": "4KiB", "secondary_tiers": [tier]}))
    assert main(["bench", "--config", str(config), "--requests", "5"]) == 0
    out, err = capsys.readouterr()
    assert "-> 0:redis (capped at 8.0 MiB for the whole fleet, the server evicts)" in err
    assert "(no cap)" not in out + err
    assert "  0:redis          capacity 8.0 MiB for the whole fleet (the server evicts), used " in out
