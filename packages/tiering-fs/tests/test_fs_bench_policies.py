"""``tiering bench --tenants`` through an fs tier with quotas: policies, tenants by name, evictions by cause."""

import json
import re

from tiering.cli.main import main


def test_bench_report_names_tenants_and_splits_evictions_by_cause(tmp_path, capsys):
    config = tmp_path / "config.json"
    tier = {
        "type": "fs",
        "root": str(tmp_path / "kv"),
        "capacity_bytes": "4MiB",
        "tenants": {"default": {"quota_bytes": "320KiB"}, "overrides": {"t1": {"quota_bytes": "640KiB"}}},
    }
    config.write_text(json.dumps({"cpu_bytes_to_use": "256KiB", "block_bytes": "16KiB", "secondary_tiers": [tier]}))
    report = tmp_path / "r.json"
    argv = ["bench", "--config", str(config), "--requests", "60", "--tenants", "3", "--json", str(report)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    data = json.loads(report.read_text())
    fs = data["tier_stats"]["0:fs"]
    assert not [k for k in fs if k.startswith("tenant:tag:")]
    assert "tag:" not in out
    assert fs["quota_evictions"] > 0
    assert (
        "policies: admission: 0:fs always; load cost model: on; recompute rate unknown (set recompute_tokens_per_s); "
        "no max_load_s; margin 1.1; tenant limits: 0:fs default quota 320.0 KiB; t1 quota 640.0 KiB"
    ) in err
    row = re.search(
        r"evictions ([\d,]+) \(.*\): ([\d,]+) at the cap, ([\d,]+) at a tenant's quota; ([\d,]+) expired", out
    )
    assert row is not None, out
    total, cap, quota, expired = (int(g.replace(",", "")) for g in row.groups())
    assert (total, quota, expired) == (fs["evictions"], fs["quota_evictions"], fs["expirations"])
    assert cap == total - quota
    for name, quota_text in (("t0", "320.0 KiB"), ("t1", "640.0 KiB"), ("t2", "320.0 KiB")):
        line = re.search(
            rf"^  0:fs {name} +([\d,]+) blocks \(.*\), quota {quota_text}, evicted at its quota ([\d,]+)", out, re.M
        )
        assert line is not None, out
        assert int(line.group(2).replace(",", "")) == fs[f"tenant:{name}:quota_evictions"]
