"""``tiering stat`` on an fs stack: the tier's state in units, tenants by the config's names, pins; --json raw."""

import json
import re

from tiering.cli.main import main
from tiering.core.policies.tenancy import tenant_tag


def test_stat_shows_blocks_bytes_cap_pins_and_tenants_by_name(tmp_path, capsys):
    config = tmp_path / "config.json"
    tier = {
        "type": "fs",
        "root": str(tmp_path / "kv"),
        "capacity_bytes": "8MiB",
        "max_pinned_bytes": "1MiB",
        "tenants": {"overrides": {"t1": {"quota_bytes": "2MiB"}}},
    }
    config.write_text(json.dumps({"cpu_bytes_to_use": "256KiB", "block_bytes": "16KiB", "secondary_tiers": [tier]}))
    assert main(["bench", "--config", str(config), "--requests", "30", "--tenants", "2"]) == 0
    assert main(["pin", str(config), "--ttl", "1h", "--hash-ids", "0,1"]) == 0
    capsys.readouterr()
    assert main(["stat", str(config), "--json"]) == 0
    raw = json.loads(capsys.readouterr().out)["tiers"][0]["stats"]
    assert main(["stat", str(config)]) == 0
    out = capsys.readouterr().out
    blocks, stored = raw["resident_blocks"], raw["resident_bytes"]
    assert blocks > 0
    assert f"  stored         {blocks:,} blocks, " in out and f" = {stored} bytes\n" in out
    assert f"  capacity       8.0 MiB = 8388608 bytes, {stored / (8 << 20):.1%} used\n" in out
    assert "  pins           0 blocks pinned (0 B), 2 pinned but not stored yet; max_pinned_bytes 1.0 MiB\n" in out
    t1 = raw["tenant:t1:resident_blocks"]
    assert re.search(rf"^  tenant         t1: {t1:,} blocks \(.*\), quota 2.0 MiB$", out, re.M), out
    tag = f"tag:{tenant_tag('t0').hex()}"  # the config names t1 only: t0 is known by its tag
    assert re.search(
        rf"^                 {tag}: {raw[f'tenant:{tag}:resident_blocks']:,} blocks \(.*\), quota none$", out, re.M
    )
    assert "  start-up scan  done in " in out
    assert "(every counter of each tier: tiering stat --json)" in out
    assert "lookups_miss" not in out and "store_failed_" not in out  # this process's counters: --json only
    assert "lookups_miss" in raw
