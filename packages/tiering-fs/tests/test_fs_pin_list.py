"""``tiering pin --list`` and ``--unpin`` on an fs stack: the pins as the medium holds them, counts that add up."""

import json
import re

from tiering.cli.main import main
from tiering.core.keys import trace_block_key
from tiering.fs.layout import TRAILER_BYTES
from tiering.fs.testing import BB

STORED = BB + TRAILER_BYTES


def _config(tmp_path, **tier):
    config = tmp_path / "config.json"
    entry = {"type": "fs", "root": str(tmp_path / "kv"), "capacity_bytes": 10 * STORED, **tier}
    tenants = {"overrides": {"acme": {"quota_bytes": 4 * STORED}}}
    entry.setdefault("tenants", tenants)
    config.write_text(json.dumps({"cpu_bytes_to_use": 16 * BB, "block_bytes": BB, "secondary_tiers": [entry]}))
    return str(config)


def test_pin_list_shows_each_pin_with_its_tenant_and_expiry_and_changes_nothing(tmp_path, capsys):
    config = _config(tmp_path, max_pinned_bytes="100KiB")
    assert main(["pin", config, "--ttl", "3600", "--hash-ids", "0,1"]) == 0  # plain seconds, as a request's TTL
    assert main(["pin", config, "--ttl", "90s", "--hash-ids", "7", "--tenant", "acme"]) == 0
    capsys.readouterr()
    assert main(["pin", config, "--list"]) == 0
    out = capsys.readouterr().out
    assert "secondary_tiers[0] fs: 3 pins; max_pinned_bytes 100.0 KiB\n" in out
    lines = [line for line in out.splitlines() if line.startswith("  ")]
    assert len(lines) == 3
    first = re.fullmatch(r"  ([0-9a-f]+), tenant acme: until \S+ \S+ UTC \(in (\d+) s\), not stored yet", lines[0])
    assert first is not None, lines[0]
    assert first.group(1) == trace_block_key(7).hex() and 80 <= int(first.group(2)) <= 90
    rest = sorted(
        re.fullmatch(r"  ([0-9a-f]+): until .* \(in ([\d,]+) s\), not stored yet", x).group(1) for x in lines[1:]
    )
    assert rest == sorted(trace_block_key(i).hex() for i in (0, 1))
    assert main(["pin", config, "--list"]) == 0
    assert "secondary_tiers[0] fs: 3 pins;" in capsys.readouterr().out  # listing ended no pin
    # a config with pinning off still lists the pins the medium holds, and says how to turn pinning on
    assert main(["pin", _config(tmp_path), "--list"]) == 0
    out = capsys.readouterr().out
    assert "fs: 3 pins; pinning is off in this config (max_pinned_bytes 0; --max-pinned-bytes SIZE turns it on)" in out


def test_unpin_counts_only_the_blocks_that_were_pinned(tmp_path, capsys):
    config = _config(tmp_path, max_pinned_bytes="100KiB")
    assert main(["pin", config, "--ttl", "1h", "--hash-ids", "0,1"]) == 0
    capsys.readouterr()
    assert main(["pin", config, "--unpin", "--hash-ids", "0,1,2"]) == 0
    assert "fs: pins of 2 of the 3 blocks ended (1 were not pinned)" in capsys.readouterr().out
    assert main(["pin", config, "--unpin", "--hash-ids", "0"]) == 0
    assert "fs: pins of 0 of the 1 blocks ended (1 were not pinned)" in capsys.readouterr().out
    assert main(["pin", config, "--list"]) == 0
    assert "fs: 0 pins;" in capsys.readouterr().out


def test_list_refuses_a_ttl_and_pin_asks_for_a_ttl_in_either_form(tmp_path, capsys):
    config = _config(tmp_path, max_pinned_bytes="100KiB")
    assert main(["pin", config, "--list", "--ttl", "5"]) == 2
    assert "--list changes nothing: give it without --ttl and --unpin" in capsys.readouterr().err
    assert main(["pin", config, "--hash-ids", "0"]) == 2
    assert "give --ttl DURATION (plain seconds (90) or a number with a unit" in capsys.readouterr().err


def test_a_tenants_ttl_takes_a_duration_with_a_unit(tmp_path, capsys):
    config = _config(tmp_path, tenants={"default": {"ttl_s": "1h"}, "overrides": {"acme": {"ttl_s": 90}}})
    assert main(["check", config]) == 0
    bad = _config(tmp_path, tenants={"default": {"ttl_s": "soon"}})
    assert main(["check", bad]) == 2
    assert "default.ttl_s must be seconds or a duration such as '1h' (is 'soon')" in capsys.readouterr().err


def test_stat_with_pinning_off_counts_the_pins_the_tier_holds(tmp_path, capsys):
    pinning = _config(tmp_path, max_pinned_bytes="100KiB")
    assert main(["pin", pinning, "--ttl", "1h", "--hash-ids", "0,1"]) == 0
    assert main(["stat", pinning]) == 0
    assert "  pins           0 blocks pinned (0 B), 2 pinned but not stored yet" in capsys.readouterr().out
    off = _config(tmp_path)  # the same root, pinning off: its counters count no pin, the medium holds two
    assert main(["stat", off]) == 0
    out = capsys.readouterr().out
    assert "pinning off in this config (max_pinned_bytes 0); 2 live pins on the tier" in out
    assert main(["stat", off, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tiers"][0]["pins_on_medium"] == 2
