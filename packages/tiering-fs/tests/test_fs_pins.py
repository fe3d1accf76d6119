"""Pinned blocks in the fs tier: kept from eviction until their pin expires, recorded on disk."""

import json
import logging
import signal
import time

import pytest
from fs_worker import run_worker

from tiering.cli.main import main
from tiering.core.inspection import inspector_for
from tiering.core.keys import block_keys, trace_block_key
from tiering.core.policies.pin_records import MAX_PIN_EXPIRY_S, parse_marker
from tiering.core.policies.tenants import scope_key
from tiering.core.schema import InvalidValueError
from tiering.fs.layout import TRAILER_BYTES
from tiering.fs.testing import BB, CTX, block_files, store
from tiering.testing import make_key

STORED = BB + TRAILER_BYTES


def markers(root):
    return sorted(p for p in root.rglob("pins/*.pin"))


def fill(tier, view, salt, n):
    """Store ``n`` new blocks one at a time (a defined recency order)."""
    for i in range(n):
        assert store(tier, view, [make_key(i, salt)])


def test_pinned_blocks_survive_a_tier_filled_ten_times_over(tmp_path, open_tier):
    tier, view = open_tier(tmp_path, capacity_bytes=10 * STORED, max_pinned_bytes=3 * STORED)
    pinned = [make_key(i, b"system-prompt") for i in range(3)]
    assert store(tier, view, pinned)
    assert tier.pin(pinned, 3600) is True
    fill(tier, view, b"flood", 100)
    stats = tier.stats()
    assert stats["evictions"] == 93  # 103 blocks through a 10-block cap; the 3 pinned never chosen
    assert [tier.lookup(k, CTX) for k in pinned] == [True] * 3
    assert (stats["pinned_blocks"], stats["pinned_bytes"], stats["pins_pending"]) == (3, 3 * STORED, 0)
    assert len(markers(tmp_path)) == 3


def test_a_key_pinned_before_it_is_stored_is_kept_once_stored(tmp_path, open_tier):
    tier, view = open_tier(tmp_path, capacity_bytes=4 * STORED, max_pinned_bytes=STORED)
    key = make_key(0, b"later")
    assert tier.pin([key], 3600)
    assert tier.stats()["pins_pending"] == 1
    assert store(tier, view, [key])
    fill(tier, view, b"flood", 20)
    assert tier.lookup(key, CTX) is True
    assert tier.stats()["pins_pending"] == 0


def test_max_pinned_bytes_refuses_a_pin_past_the_bound_whole(tmp_path, open_tier, caplog):
    tier, view = open_tier(tmp_path, capacity_bytes=10 * STORED, max_pinned_bytes=3 * STORED)
    keys = [make_key(i, b"big") for i in range(4)]
    assert store(tier, view, keys)
    with caplog.at_level(logging.WARNING):
        assert tier.pin(keys, 3600) is False
    assert "over max_pinned_bytes" in caplog.text
    assert tier.stats()["pins_refused"] == 4 and tier.stats()["pinned_blocks"] == 0
    assert markers(tmp_path) == []
    assert tier.pin(keys[:3], 3600) is True
    assert tier.pin(keys[:3], 7200) is True  # renewing pins nothing new: within the bound
    assert len(markers(tmp_path)) == 3  # the renewal replaced the older markers
    assert tier.pin(keys[3:], 3600) is False
    assert tier.stats()["pins_refused"] == 5


def test_pinning_is_off_by_default(tmp_path, open_tier):
    tier, _view = open_tier(tmp_path, capacity_bytes=10 * STORED)
    assert tier.pin([make_key(0, b"off")], 60) is False
    assert tier.stats()["max_pinned_bytes"] == 0 and tier.stats()["pins_refused"] == 1


def test_max_pinned_bytes_must_stay_below_the_cap(tmp_path, open_tier):
    with pytest.raises(InvalidValueError, match="max_pinned_bytes: must be below capacity_bytes"):
        open_tier(tmp_path, capacity_bytes=4 * STORED, max_pinned_bytes=4 * STORED)


def test_pin_expires_by_itself_and_unpin_ends_it(tmp_path, open_tier):
    tier, view = open_tier(tmp_path, capacity_bytes=4 * STORED, max_pinned_bytes=2 * STORED)
    short, ended = make_key(0, b"short"), make_key(1, b"ended")
    assert store(tier, view, [short, ended])
    assert tier.pin([short], 0.5) and tier.pin([ended], 3600)
    tier.unpin([ended])
    assert [parse_marker(p.name)[0] for p in markers(tmp_path)] == [short]
    time.sleep(0.6)
    fill(tier, view, b"flood", 8)
    assert tier.lookup(short, CTX) is False and tier.lookup(ended, CTX) is False
    tier.pins.refresh()
    assert markers(tmp_path) == []  # the expired marker is removed by the next refresh


def test_restart_keeps_pins_and_a_crashed_pinner_leaves_none_forever(tmp_path, open_tier):
    worker = run_worker({"root": str(tmp_path), "block_bytes": BB, "n": 4, "salt": "crash", "pin_ttl_s": 600,
                         "tier": {"capacity_bytes": 10 * STORED, "max_pinned_bytes": 4 * STORED}})  # fmt: skip
    assert worker.stdout.readline().strip() == "ready"
    assert worker.stdout.readline().strip() == "stored"
    assert worker.stdout.readline().strip() == "pinned"
    worker.send_signal(signal.SIGKILL)  # a crash: the pins are never released
    worker.wait(10)
    pinned = [make_key(i, b"crash") for i in range(4)]

    tier, view = open_tier(tmp_path, capacity_bytes=10 * STORED, max_pinned_bytes=4 * STORED)
    assert tier.wait_for_scan(10)
    assert tier.stats()["pinned_blocks"] == 4  # another process's pins, read from the disk
    fill(tier, view, b"flood", 30)
    assert [tier.lookup(k, CTX) for k in pinned] == [True] * 4
    later = max(parse_marker(p.name)[1] for p in markers(tmp_path)) + 1.0
    tier.pins.clock = lambda: later  # the test's clock: past every pin's expiry, however long the work above took
    tier.pins.refresh()
    fill(tier, view, b"flood-2", 30)
    assert [tier.lookup(k, CTX) for k in pinned] == [False] * 4
    assert markers(tmp_path) == [] and tier.stats()["pinned_blocks"] == 0
    assert len(block_files(tmp_path)) == 10


def test_markers_are_not_foreign_and_go_with_their_namespace(tmp_path, open_tier):
    from tiering.fs.inspection import FsInspector

    tier, view = open_tier(tmp_path, capacity_bytes=10 * STORED, max_pinned_bytes=STORED)
    key = make_key(0, b"ns")
    assert store(tier, view, [key]) and tier.pin([key], 3600)
    tier.shutdown()
    inspector = FsInspector.from_config({"type": "fs", "root": str(tmp_path)})
    assert list(inspector.foreign()) == []
    inspector.remove_namespace(tier.namespace.digest)
    assert markers(tmp_path) == []


def _config(tmp_path, **tier):
    config = tmp_path / "config.json"
    entry = {"type": "fs", "root": str(tmp_path / "kv"), "capacity_bytes": 10 * STORED, **tier}
    config.write_text(json.dumps({"cpu_bytes_to_use": 16 * BB, "block_bytes": BB, "secondary_tiers": [entry]}))
    return str(config)


def test_tiering_pin_pins_a_prompt_from_its_token_ids_and_unpins_it(tmp_path, capsys):
    config = _config(tmp_path, max_pinned_bytes="100KiB")
    tokens = tmp_path / "prompt.json"
    tokens.write_text(json.dumps(list(range(40))))  # 2 full blocks of 16 tokens, 8 tokens left over
    assert main(["pin", config, "--ttl", "1h", "--tokens", str(tokens)]) == 0
    captured = capsys.readouterr()
    assert (
        "fs: pinned 2 blocks for 3600 s; the tier now has 0 blocks pinned, 2 pinned but not stored yet" in captured.out
    )
    assert "fs: warning: the tier holds no block of namespace" in captured.err  # a config that matches no engine's
    found = sorted(parse_marker(p.name)[0] for p in markers(tmp_path))
    assert found == sorted(block_keys(list(range(40)), 16))
    assert main(["pin", config, "--unpin", "--tokens", str(tokens)]) == 0
    assert markers(tmp_path) == []


def test_tiering_pin_refused_past_the_bound_exits_1_and_check_validates_the_key(tmp_path, capsys, caplog):
    config = _config(tmp_path, max_pinned_bytes=STORED)
    with caplog.at_level(logging.WARNING):
        assert main(["pin", config, "--ttl", "10m", "--hash-ids", "0,1"]) == 1
    captured = capsys.readouterr()
    assert "fs: refused" in captured.out and "no tier pinned the prefix" in captured.err
    assert "pinning 2 more blocks would pin 40960 bytes, over max_pinned_bytes 20480" in caplog.text
    bad = _config(tmp_path, max_pinned_bytes="lots")
    assert main(["check", bad]) == 2
    assert "secondary_tiers[0].max_pinned_bytes:" in capsys.readouterr().err


def test_a_running_process_honours_a_pin_another_process_takes(tmp_path, open_tier):
    cfg = {"capacity_bytes": 6 * STORED, "max_pinned_bytes": STORED, "rescan_interval_s": 0}
    holder, view = open_tier(tmp_path, **cfg)
    pinner, _ = open_tier(tmp_path, **cfg)
    key = make_key(0, b"shared")
    assert store(holder, view, [key])
    assert pinner.pin([key], 3600)  # taken elsewhere: the holder reads it at its next refresh
    holder.pins.refresh_interval_s = 0.01  # (5 s by default) so that a store asks for a refresh at once
    fill(holder, view, b"first", 1)  # a store asks for the refresh; it runs on an I/O thread beside the stores
    deadline = time.monotonic() + 30.0
    while not holder.pins.protects(key) and time.monotonic() < deadline:
        time.sleep(0.02)  # on a loaded machine the refresh may come late: ask again as a store would
        holder.pins.refresh_soon(holder.pool.submit_call)
    assert holder.pins.protects(key)
    fill(holder, view, b"flood", 20)
    assert holder.lookup(key, CTX) is True and holder.pins.protects(key)


def test_tiering_pin_on_a_tier_that_cannot_pin_says_so_without_a_traceback(tmp_path, capsys):
    pytest.importorskip("tiering.example")
    config = tmp_path / "mixed.json"
    fs = {"type": "fs", "root": str(tmp_path / "kv"), "capacity_bytes": 10 * STORED, "max_pinned_bytes": STORED}
    stack = {"cpu_bytes_to_use": 16 * BB, "block_bytes": BB, "secondary_tiers": [fs, {"type": "example"}]}
    config.write_text(json.dumps(stack))
    assert main(["pin", str(config), "--ttl", "1h", "--hash-ids", "1", "--tenant", "acme"]) == 1
    out = capsys.readouterr().out
    assert "secondary_tiers[0] fs: pinned 1 block " in out and "secondary_tiers[1] example: cannot pin" in out
    assert [parse_marker(p.name)[0] for p in markers(tmp_path)] == [scope_key("acme", trace_block_key(1))]
    assert main(["pin", str(config), "--unpin", "--hash-ids", "1", "--tenant", "acme"]) == 0
    assert "example: cannot pin (nothing to unpin)" in capsys.readouterr().out and markers(tmp_path) == []


def test_c29_a_pin_of_any_ttl_saturates_at_the_latest_expiry_and_every_reader_parses_it(tmp_path, open_tier):
    tier, view = open_tier(tmp_path, capacity_bytes=4 * STORED, max_pinned_bytes=2 * STORED)
    key = make_key(0, b"forever")
    assert store(tier, view, [key])
    assert tier.pin([key], 10**15)  # seconds: far past what a 16-digit millisecond expiry could hold
    [marker] = markers(tmp_path)
    assert parse_marker(marker.name) == (key, MAX_PIN_EXPIRY_S)
    tier.shutdown()
    again, view = open_tier(tmp_path, capacity_bytes=4 * STORED, max_pinned_bytes=2 * STORED)
    assert again.stats()["pinned_blocks"] == 1 and again.pins.protects(key)
    fill(again, view, b"flood", 8)
    assert again.lookup(key, CTX) is True  # held through a flood, as any pin
    assert list(inspector_for({"type": "fs", "root": str(tmp_path)}).foreign()) == []


def test_c29_tiering_pin_with_a_huge_ttl_pins_until_the_latest_expiry_and_stat_counts_it(tmp_path, capsys):
    config = _config(tmp_path, max_pinned_bytes="100KiB")
    assert main(["pin", config, "--ttl", "2000000000w", "--hash-ids", "0,1"]) == 0
    out = capsys.readouterr().out
    assert "pinned 2 blocks until 9999-12-31 23:59:59 UTC" in out
    assert [parse_marker(p.name)[1] for p in markers(tmp_path)] == [MAX_PIN_EXPIRY_S] * 2
    assert main(["stat", config, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tiers"][0]["stats"]["pins_pending"] == 2  # read back by stat's tier
    assert main(["ls", "--root", str(tmp_path / "kv")]) == 0
    assert "foreign entries" not in capsys.readouterr().out


def test_c29_a_marker_with_a_longer_expiry_than_is_written_now_is_read_as_a_saturated_pin(tmp_path, open_tier):
    tier, view = open_tier(tmp_path, capacity_bytes=4 * STORED, max_pinned_bytes=2 * STORED)
    key = make_key(1, b"old-marker")
    assert store(tier, view, [key])
    assert tier.pin([key], 60)
    folder = markers(tmp_path)[0].parent
    (folder / f"{key.hex()}.1234567890123456789.pin").write_bytes(b"")  # 19 digits, as an older version wrote
    tier.pins.refresh()
    assert tier.pins.expiry(key) == MAX_PIN_EXPIRY_S
    assert list(inspector_for({"type": "fs", "root": str(tmp_path)}).foreign()) == []


def test_c28_tiering_pin_keys_of_the_default_tenant_never_pin_another_tenants_block(tmp_path, capsys):
    config = _config(tmp_path, max_pinned_bytes="100KiB")
    theirs = scope_key("B", trace_block_key(1))  # tenant B's stored form of block 1
    assert main(["pin", config, "--ttl", "1h", "--keys", theirs.hex()]) == 0  # the default tenant, forging it
    capsys.readouterr()
    [pinned] = [parse_marker(p.name)[0] for p in markers(tmp_path)]
    assert pinned != theirs and pinned == scope_key("", theirs)  # escaped: not B's block
    assert main(["pin", config, "--ttl", "1h", "--keys", trace_block_key(1).hex(), "--tenant", "B"]) == 0
    capsys.readouterr()
    assert theirs in {parse_marker(p.name)[0] for p in markers(tmp_path)}  # B pins its own as before
