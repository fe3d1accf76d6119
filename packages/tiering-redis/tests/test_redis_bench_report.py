"""``tiering bench`` through a redis tier capped for the whole fleet (``eviction: "tier"``): the cap and its victims."""

import json
import re

from tiering.cli.main import main

FLEET = "for the whole fleet (one LRU on the server, shared by every process, which evicts)"


def test_bench_shows_the_fleet_wide_cap_of_an_eviction_tier_tier(redis_server, prefix, tmp_path, capsys):
    tier = {"type": "redis", "url": redis_server.url, "prefix": prefix, "eviction": "tier", "capacity_bytes": "64KiB"}
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"cpu_bytes_to_use": "64KiB", "block_bytes": "4KiB", "secondary_tiers": [tier]}))
    report = tmp_path / "report.json"
    assert main(["bench", "--config", str(config), "--requests", "5", "--json", str(report)]) == 0
    out, err = capsys.readouterr()
    assert f"-> 0:redis (capped at 64.0 KiB {FLEET})" in err
    assert "(no cap)" not in out + err
    cap = re.escape(f"capacity 64.0 KiB {FLEET}")
    row = re.search(rf"  0:redis +{cap}, used .*, evictions ([\d,]+) at the fleet's cap,", out)
    assert row is not None, out
    victims = json.loads(report.read_text())["tier_stats"]["0:redis"]["fleet_evictions"]
    assert victims > 0 and int(row.group(1).replace(",", "")) == victims  # more blocks stored than 64 KiB holds
