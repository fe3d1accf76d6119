"""Pinned blocks in the redis tier (a real redis-server): per-process index, the fleet's LRU, TTLs, the server."""

import itertools
import logging
import time

import pytest

from tiering.core import create_secondary_tier
from tiering.core.base import JobMetadata, ReqContext, block_view
from tiering.core.primary import allocate_host_buffer
from tiering.core.spec import OffloadingSpec
from tiering.redis.inspection import RedisInspector
from tiering.testing import block_payload, make_key, wait_for_jobs, wait_for_lookup

BLOCK = 16 * 1024
CTX = ReqContext("pins")
_ids = itertools.count(1)


def build(config):
    spec = OffloadingSpec({"cpu_bytes_to_use": 8 * BLOCK, "block_bytes": BLOCK, "model": "redis/pins"})
    view = allocate_host_buffer(8, BLOCK)
    tier = create_secondary_tier(config, view, spec)
    assert tier.wait_for_scan(30)
    return tier, view


def store(tier, view, keys):
    for slot, key in enumerate(keys):
        block_view(view, slot)[:] = block_payload(key, BLOCK)
    job = JobMetadata(next(_ids), list(keys), list(range(len(keys))), False, CTX)
    tier.submit_store(job)
    assert wait_for_jobs(tier, [job.job_id])[job.job_id]
    tier.pool.wait_idle(10)


def fill(tier, view, salt, n):
    for i in range(n):
        store(tier, view, [make_key(i, salt)])


@pytest.fixture
def config(redis_server, prefix):
    def make(**overrides):
        return {"type": "redis", "url": redis_server.url, "prefix": prefix, **overrides}

    return make


def test_process_eviction_keeps_pinned_blocks_and_a_restart_reads_the_pins_back(config):
    tier, view = build(config(eviction="process", capacity_bytes="120KiB", max_pinned_bytes="40KiB"))
    obj = tier.stored_block_bytes
    pinned = [make_key(i, b"prompt") for i in range(2)]
    store(tier, view, pinned)
    assert tier.pin(pinned, 3600)
    fill(tier, view, b"flood", 70)  # 72 blocks through a cap of 7
    stats = tier.stats()
    assert (stats["pinned_blocks"], stats["pinned_bytes"], stats["evictions"]) == (2, 2 * obj, 72 - 120 * 1024 // obj)
    assert [tier.lookup(k, CTX) for k in pinned] == [True, True]
    tier.shutdown()
    again, view2 = build(config(eviction="process", capacity_bytes="120KiB", max_pinned_bytes="40KiB"))
    try:
        assert again.stats()["pinned_blocks"] == 2
        fill(again, view2, b"flood-2", 20)
        assert [again.lookup(k, CTX) for k in pinned] == [True, True]
    finally:
        again.shutdown()


def test_fleet_lru_scores_pinned_blocks_at_their_expiry_so_the_trim_passes_them(config, redis_server):
    tier, view = build(config(eviction="tier", capacity_bytes="120KiB", max_pinned_bytes="40KiB"))
    client = redis_server.client()
    try:
        later = make_key(0, b"pinned-before-stored")
        assert tier.pin([later], 3600)  # pinned before it is stored: applies once stored
        pinned = [make_key(i, b"prompt") for i in range(1)]
        store(tier, view, [*pinned, later])
        assert tier.pin(pinned, 3600)
        fill(tier, view, b"flood", 60)
        lru = tier.blocks.fleet.lru_key
        for key in [*pinned, later]:
            assert client.exists(tier.blocks.block_key(key)) == 1
            assert client.zscore(lru, key.hex()) > time.time() + 3000  # scored at the pin's expiry
        assert tier.stats()["fleet_evictions"] > 50
    finally:
        tier.shutdown()


def test_ttl_of_a_pinned_block_is_pushed_out_to_the_pin(config, redis_server):
    tier, view = build(config(ttl_s=30, max_pinned_bytes="40KiB"))
    client = redis_server.client()
    try:
        first, later = make_key(0, b"ttl"), make_key(1, b"ttl")
        store(tier, view, [first])
        assert tier.pin([first, later], 600)
        store(tier, view, [later])
        for key in (first, later):
            assert client.pttl(tier.blocks.block_key(key)) > 500_000
        assert 0 < client.ttl(tier.blocks.layout.pins_key(tier.blocks.digest)) <= 601  # the set ends with its last pin
    finally:
        tier.shutdown()


def test_an_abandoned_pin_ends_by_itself_and_the_bound_refuses(config, caplog):
    crashed, view = build(config(eviction="process", capacity_bytes="80KiB", max_pinned_bytes="20KiB"))
    keys = [make_key(i, b"short") for i in range(2)]
    store(crashed, view, keys)
    with caplog.at_level(logging.WARNING):
        assert crashed.pin(keys, 60) is False
    assert "over max_pinned_bytes" in caplog.text and crashed.stats()["pins_refused"] == 2
    assert crashed.pin(keys[:1], 60)  # then the process goes away without unpinning (no shutdown)
    other, view2 = build(config(eviction="process", capacity_bytes="80KiB", max_pinned_bytes="20KiB"))
    try:
        assert other.pins.protects(keys[0])
        other.pins.clock = lambda: time.time() + 120  # the test's clock: two minutes on, past the pin's expiry
        assert not other.pins.protects(keys[0])
        fill(other, view2, b"flood", 8)
        assert wait_for_lookup(other, keys[0], CTX, 10) is False
        other.pins.refresh()
        assert other.blocks.pin_records().list_pins() == []
    finally:
        other.shutdown()
        crashed.shutdown()


def test_a_server_that_evicts_any_key_refuses_pins(config, redis_server, caplog):
    client = redis_server.client()
    old = client.config_get("maxmemory*")
    client.config_set("maxmemory", 512 * 1024 * 1024)
    client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        tier, _ = build(config(max_pinned_bytes="40KiB"))
        with caplog.at_level(logging.WARNING):
            assert tier.pin([make_key(0, b"x")], 60) is False
        assert "the server evicts any key: allkeys-lru" in caplog.text
        tier.shutdown()
    finally:
        client.config_set("maxmemory", old["maxmemory"])
        client.config_set("maxmemory-policy", old["maxmemory-policy"])


def test_the_pins_set_is_ours_and_goes_with_its_namespace(config, redis_server):
    cfg = config(max_pinned_bytes="40KiB")
    tier, view = build(cfg)
    key = make_key(0, b"ns")
    store(tier, view, [key])
    assert tier.pin([key], 3600)
    tier.shutdown()
    inspector = RedisInspector.from_config(cfg)
    try:
        assert list(inspector.foreign()) == []
        inspector.remove_namespace(tier.blocks.digest)
        assert redis_server.client().exists(tier.blocks.layout.pins_key(tier.blocks.digest)) == 0
    finally:
        inspector.close()


def test_pins_in_a_cluster_keep_blocks_spread_over_every_primary(redis_cluster, prefix):
    cfg = {"type": "redis", "mode": "cluster", "url": redis_cluster.url, "prefix": prefix, "ttl_s": 60,
           "eviction": "process", "capacity_bytes": "120KiB", "max_pinned_bytes": "40KiB"}  # fmt: skip
    tier, view = build(cfg)
    try:
        pinned = [make_key(i, b"cluster") for i in range(2)]
        store(tier, view, pinned)
        assert tier.pin(pinned, 600)
        fill(tier, view, b"flood", 30)
        assert [tier.lookup(k, CTX) for k in pinned] == [True, True]
        assert all(tier.blocks.client.pttl(tier.blocks.block_key(k)) > 500_000 for k in pinned)
        assert sorted(tier.blocks.pin_records().list_pins()) == sorted((k, tier.pins.expiry(k)) for k in pinned)
    finally:
        tier.shutdown()
