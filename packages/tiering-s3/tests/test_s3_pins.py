"""Pinned blocks in the s3 tier (moto server): kept from eviction until the pin expires; markers in the bucket."""

import logging
import time

from s3_helpers import CTX, OBJ, build, store

from tiering.core.policies.pin_records import parse_marker
from tiering.s3.inspection import S3Inspector
from tiering.testing import make_key, wait_for_lookup


def markers(env, tier):
    return [name for name in env.list_keys(tier.base + "/pins/") if parse_marker(name.rsplit("/", 1)[1])]


def fill(tier, view, salt, n):
    for i in range(n):
        assert store(tier, view, [make_key(i, salt)])


def test_pinned_blocks_survive_a_bucket_filled_ten_times_over_and_a_restart(s3):
    config = s3.tier_config(capacity_bytes=6 * OBJ, max_pinned_bytes=2 * OBJ)
    tier, view = build(config)
    pinned = [make_key(i, b"prompt") for i in range(2)]
    assert store(tier, view, pinned) and tier.pin(pinned, 3600)
    fill(tier, view, b"flood", 60)
    assert [tier.lookup(k, CTX) for k in pinned] == [True, True]
    stats = tier.stats()
    assert (stats["pinned_blocks"], stats["pinned_bytes"], stats["evictions"]) == (2, 2 * OBJ, 56)
    assert len(markers(s3, tier)) == 2
    tier.shutdown()

    again, view2 = build(config)  # a restart: the pins are read back from the bucket
    try:
        assert again.stats()["pinned_blocks"] == 2
        fill(again, view2, b"flood-2", 12)
        assert [again.lookup(k, CTX) for k in pinned] == [True, True]
    finally:
        again.shutdown()


def test_the_bound_refuses_and_an_abandoned_pin_ends_by_itself(s3, caplog):
    config = s3.tier_config(capacity_bytes=4 * OBJ, max_pinned_bytes=OBJ)
    crashed, view = build(config)
    keys = [make_key(i, b"short") for i in range(2)]
    assert store(crashed, view, keys)
    with caplog.at_level(logging.WARNING):
        assert crashed.pin(keys, 60) is False
    assert "over max_pinned_bytes" in caplog.text and crashed.stats()["pins_refused"] == 2
    assert crashed.pin(keys[:1], 60)
    # The pinning process goes away without unpinning (no shutdown: as after a crash).
    other, view2 = build(config)
    try:
        assert other.pins.protects(keys[0])
        other.pins.clock = lambda: time.time() + 120  # the test's clock: two minutes on, past the pin's expiry
        assert not other.pins.protects(keys[0])
        fill(other, view2, b"flood", 6)
        assert wait_for_lookup(other, keys[0], CTX, 10) is False  # expired: evicted like any block
        other.pins.refresh()
        assert markers(s3, other) == []  # and its marker removed by the next refresh
    finally:
        other.shutdown()
        crashed.shutdown()


def test_markers_are_not_foreign_and_go_with_their_namespace(s3):
    config = s3.tier_config(capacity_bytes=4 * OBJ, max_pinned_bytes=OBJ)
    tier, view = build(config)
    key = make_key(0, b"ns")
    assert store(tier, view, [key]) and tier.pin([key], 3600)
    tier.shutdown()
    inspector = S3Inspector.from_config(config)
    assert list(inspector.foreign()) == []
    inspector.remove_namespace(tier.base.rsplit("/", 1)[-1])
    assert markers(s3, tier) == []
