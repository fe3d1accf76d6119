"""The report accounts for every primary store in each secondary tier: written, held, declined, failed, in flight."""

import json

from tiering.cli.bench.stores import store_accounting
from tiering.cli.main import main
from tiering.testing import requires_tier


@requires_tier("fs")
def test_every_primary_store_is_accounted_for_in_each_tier_and_the_figures_add_up(tmp_path, capsys):
    # a small primary tier over a second_sighting fs tier over a plain one: stores, declines, fills from tier 1
    tiers = [
        {"type": "fs", "root": str(tmp_path / "a"), "capacity_bytes": "2MiB", "admission": "second_sighting"},
        {"type": "fs", "root": str(tmp_path / "b"), "capacity_bytes": "64MiB"},
    ]
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"cpu_bytes_to_use": "1MiB", "block_bytes": 16384, "secondary_tiers": tiers}))
    out = tmp_path / "r.json"
    assert main(["bench", "--config", str(config), "--requests", "300", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    accounting = store_accounting(data["metrics"])
    assert sorted(accounting) == ["0:fs", "1:fs"]
    for tier, a in accounting.items():
        assert a["primary_stores"] == data["blocks_stored"] > 0
        offers = a["primary_stores"] + sum(a["other_offers"].values())
        assert offers == a["held"] + a["declined"] + a["written"] + a["failed"] + a["in_flight"], (tier, a)
        assert a["written"] == data["tier_stats"][tier]["blocks_stored"]
        assert f"  {tier}" in text and f"{a['primary_stores']:,} primary stores" in text
    assert accounting["0:fs"]["declined"] > 0 and accounting["1:fs"]["declined"] == 0
    assert accounting["0:fs"]["other_offers"]["fill"] > 0  # hits in 1:fs are written up into 0:fs
    assert (
        f"written {accounting['1:fs']['written']:,}, already held {accounting['1:fs']['held']:,} (touched, not "
        "written again), declined by admission 0, failed 0, in flight at the end 0"
    ) in text
