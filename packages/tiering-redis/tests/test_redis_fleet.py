"""The fleet-wide cap (``eviction: "tier"``): two real processes share one server and one LRU."""

import itertools
import json
import subprocess
import sys
import threading
import time

import pytest

from tiering.core import create_secondary_tier
from tiering.core.base import JobMetadata, ReqContext, block_view
from tiering.core.primary import allocate_host_buffer
from tiering.core.spec import OffloadingSpec
from tiering.testing import block_payload, make_key, wait_for_jobs
from tiering.testing.harness import wait_until

BLOCK = 64 * 1024
OBJECT = BLOCK + 128
CTX = ReqContext("fleet")
_ids = itertools.count(1)

CHILD = """
import json, sys
from tiering.core import create_secondary_tier
from tiering.core.base import JobMetadata, ReqContext, block_view
from tiering.core.primary import allocate_host_buffer
from tiering.core.spec import OffloadingSpec
from tiering.testing import block_payload, make_key, wait_for_jobs
config, salt, n, block = json.loads(sys.argv[1])
spec = OffloadingSpec({"cpu_bytes_to_use": 32 * block, "block_bytes": block, "model": "redis/fleet"})
view = allocate_host_buffer(32, block)
tier = create_secondary_tier(config, view, spec)
tier.wait_for_scan(30)
ok = True
for start in range(0, n, 8):
    keys = [make_key(i, salt.encode()) for i in range(start, start + 8)]
    for i, key in enumerate(keys):
        block_view(view, i)[:] = block_payload(key, block)
    tier.submit_store(JobMetadata(start + 1, keys, list(range(8)), False, ReqContext("child")))
    ok = wait_for_jobs(tier, [start + 1])[start + 1] and ok
tier.pool.wait_idle(10)
print(json.dumps({"ok": ok, "stats": tier.stats()}))
tier.shutdown()
"""


def spec():
    return OffloadingSpec({"cpu_bytes_to_use": 32 * BLOCK, "block_bytes": BLOCK, "model": "redis/fleet"})


def store_blocks(tier, view, keys):
    """Store ``keys`` from slots 0.. as one job; asserts it succeeded and waits until the tier's I/O is idle."""
    for slot, key in enumerate(keys):
        block_view(view, slot)[:] = block_payload(key, BLOCK)
    job = JobMetadata(next(_ids), list(keys), list(range(len(keys))), False, CTX)
    tier.submit_store(job)
    assert wait_for_jobs(tier, [job.job_id])[job.job_id]
    tier.pool.wait_idle(10)


def block_names(client, prefix):
    return [k for k in client.scan_iter(match=f"{prefix}:*", count=1000) if not k.endswith((b":namespace", b":lru"))]


def stored_bytes(client, prefix):
    return sum(client.strlen(k) for k in block_names(client, prefix))


def test_fleet_cap_holds_across_two_processes_and_evictions_are_misses(redis_server, prefix):
    cap_blocks, connections, pipeline = 16, 2, 4
    config = {
        "type": "redis", "url": redis_server.url, "prefix": prefix, "eviction": "tier",
        "capacity_bytes": cap_blocks * OBJECT, "max_connections": connections, "pipeline_blocks": pipeline,
    }  # fmt: skip
    bound = cap_blocks * OBJECT + 2 * connections * pipeline * OBJECT  # the documented bound, 2 processes
    client = redis_server.client()
    peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], stored_bytes(client, prefix))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CHILD, json.dumps([config, salt, 48, BLOCK])], stdout=subprocess.PIPE, text=True
            )
            for salt in ("p1", "p2")
        ]
        reports = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    finally:
        stop.set()
        sampler.join(10)
    assert all(r["ok"] for r in reports)
    assert sum(r["stats"]["blocks_stored"] for r in reports) == 96
    assert sum(r["stats"]["fleet_evictions"] for r in reports) == 96 - cap_blocks  # each victim taken once
    assert 0 < peak[0] <= bound, (peak[0], bound)
    # At rest: exactly the counted blocks exist, within the cap.
    names = block_names(client, prefix)
    members = {m for m, _ in client.zscan_iter(f"{prefix}:{{{spec().namespace.digest}}}:lru")}
    assert len(names) == len(members) == cap_blocks
    assert {n.rsplit(b":", 1)[1] for n in names} == members
    # A third tier: every block is either its exact bytes or a miss, never an error.
    view = allocate_host_buffer(32, BLOCK)
    reader = create_secondary_tier({**config}, view, spec())
    try:
        hits = 0
        for salt in (b"p1", b"p2"):
            for start in range(0, 48, 8):
                keys = [make_key(i, salt) for i in range(start, start + 8)]
                for key in keys:
                    job = JobMetadata(next(_ids), [key], [0], True, CTX)
                    reader.submit_load(job)
                    if wait_for_jobs(reader, [job.job_id])[job.job_id]:
                        hits += 1
                        assert block_view(view, 0).tobytes() == block_payload(key, BLOCK)
        stats = reader.stats()
        assert hits == cap_blocks
        assert stats.get("load_failed_missing", 0) == 96 - cap_blocks
        assert sum(v for k, v in stats.items() if k.startswith("errors_")) == 0
    finally:
        reader.shutdown()
        client.close()


def test_start_up_scan_repairs_the_fleet_lru(redis_server, prefix):
    config = {"type": "redis", "url": redis_server.url, "prefix": prefix, "eviction": "tier",
              "capacity_bytes": 4 * OBJECT}  # fmt: skip
    view = allocate_host_buffer(32, BLOCK)
    tier = create_secondary_tier(config, view, spec())
    assert tier.wait_for_scan(30)
    keys = [make_key(i, b"repair") for i in range(3)]
    store_blocks(tier, view, keys)
    lru = tier.blocks.layout.lru_key(tier.blocks.digest)
    client = redis_server.client()
    try:
        assert client.zcard(lru) == 3 and tier.stats()["fleet_used_bytes"] == 3 * OBJECT
        # A process died between SET NX and ZADD (block uncounted), and one block vanished behind the tier's back.
        orphan = make_key(9, b"repair")
        body = client.get(tier.blocks.block_key(keys[0]))
        client.set(tier.blocks.block_key(orphan), body)  # right size: a block the LRU does not count
        client.delete(tier.blocks.block_key(keys[1]))
        tier.shutdown()
        fresh = create_secondary_tier(config, view, spec())
        assert fresh.wait_for_scan(30)
        fresh.pool.wait_idle(10)
        members = {m for m, _ in client.zscan_iter(lru)}
        assert members == {keys[0].hex().encode(), keys[2].hex().encode(), orphan.hex().encode()}
        assert fresh.stats()["fleet_repaired_blocks"] == 2 and fresh.stats()["fleet_used_bytes"] == 3 * OBJECT
        fresh.shutdown()
    finally:
        client.close()


@pytest.mark.parametrize("cap_blocks", [1])
def test_a_cap_of_one_block_keeps_the_newest(redis_server, prefix, cap_blocks):
    config = {"type": "redis", "url": redis_server.url, "prefix": prefix, "eviction": "tier",
              "capacity_bytes": cap_blocks * OBJECT + 100}  # fmt: skip
    view = allocate_host_buffer(32, BLOCK)
    tier = create_secondary_tier(config, view, spec())
    client = redis_server.client()
    try:
        for n in range(3):
            store_blocks(tier, view, [make_key(n, b"one")])
        assert [n.rsplit(b":", 1)[1] for n in block_names(client, prefix)] == [make_key(2, b"one").hex().encode()]
        assert tier.stats()["fleet_evictions"] == 2
    finally:
        tier.shutdown()
        client.close()


def test_gc_removals_leave_the_fleet_lru_and_removing_the_namespace_removes_it(redis_server, prefix):
    from tiering.redis import RedisSecondaryTierManager

    config = {"type": "redis", "url": redis_server.url, "prefix": prefix, "eviction": "tier",
              "capacity_bytes": 8 * OBJECT}  # fmt: skip
    view = allocate_host_buffer(32, BLOCK)
    tier = create_secondary_tier(config, view, spec())
    keys = [make_key(i, b"gc") for i in range(3)]
    store_blocks(tier, view, keys)
    digest, lru = tier.blocks.digest, tier.blocks.layout.lru_key(tier.blocks.digest)
    tier.shutdown()
    client = redis_server.client()
    inspector = RedisSecondaryTierManager.inspector(config)
    try:
        blocks = sorted(inspector.blocks(digest), key=lambda b: b.key)
        victim = next(b for b in blocks if b.key == keys[0])
        assert inspector.remove_blocks(digest, [victim]) == 1
        assert {m for m, _ in client.zscan_iter(lru)} == {keys[1].hex().encode(), keys[2].hex().encode()}
        assert inspector.remove_namespace(digest) == 2
        assert not client.exists(lru)
    finally:
        client.close()


def test_touch_reorders_the_fleet_lru_so_the_least_recently_used_goes_first(redis_server, prefix):
    config = {"type": "redis", "url": redis_server.url, "prefix": prefix, "eviction": "tier",
              "capacity_bytes": 2 * OBJECT}  # fmt: skip
    view = allocate_host_buffer(32, BLOCK)
    tier = create_secondary_tier(config, view, spec())
    client = redis_server.client()
    keys = [make_key(i, b"touch") for i in range(3)]
    try:
        for key in keys[:2]:
            store_blocks(tier, view, [key])
            time.sleep(0.01)  # distinct scores
        tier.touch([keys[0]], CTX)  # keys[0] was stored first but is now the most recently used
        tier.pool.wait_idle(10)
        store_blocks(tier, view, [keys[2]])
        left = {n.rsplit(b":", 1)[1] for n in block_names(client, prefix)}
        assert left == {keys[0].hex().encode(), keys[2].hex().encode()}  # keys[1] was the least recently used
    finally:
        tier.shutdown()
        client.close()


def test_with_ttl_expired_blocks_stop_counting_against_the_cap(redis_server, prefix):
    config = {"type": "redis", "url": redis_server.url, "prefix": prefix, "eviction": "tier", "ttl_s": 1,
              "capacity_bytes": 2 * OBJECT}  # fmt: skip
    view = allocate_host_buffer(32, BLOCK)
    tier = create_secondary_tier(config, view, spec())
    client = redis_server.client()
    keys = [make_key(i, b"ttl") for i in range(3)]
    try:
        store_blocks(tier, view, keys[:2])
        wait_until(lambda: not any(client.exists(tier.blocks.block_key(k)) for k in keys[:2]))  # expired there
        store_blocks(tier, view, [keys[2]])
        assert {m for m, _ in client.zscan_iter(tier.blocks.layout.lru_key(tier.blocks.digest))} == {
            keys[2].hex().encode()
        }
        assert tier.stats()["fleet_evictions"] == 0 and tier.stats()["fleet_used_bytes"] == OBJECT
    finally:
        tier.shutdown()
        client.close()


class _Pipe:
    """A pipeline whose ``execute`` answers ``size`` once ``release`` is set (replies out of order)."""

    def __init__(self, size, release):
        self.size, self.release = size, release

    def __getattr__(self, _name):
        return lambda *a, **k: None

    def execute(self):
        assert self.release.wait(10)
        return [[], 0, self.size]


def test_a_late_reply_does_not_roll_the_fleet_usage_back():
    """Two I/O threads read the set's size; the one sent first answers last and must not overwrite the newer size."""
    from tiering.redis.fleet import FleetCap

    early, late = threading.Event(), threading.Event()
    pipes = iter([_Pipe(0, late), _Pipe(3, early)])  # sent first: the older size 0; sent second: 3

    class Client:
        def pipeline(self, transaction):
            return next(pipes)

    cap = FleetCap(Client(), "lru", OBJECT, 4 * OBJECT)
    first = threading.Thread(target=cap.evict_surplus)
    first.start()
    while cap._sent < 1:
        time.sleep(0.001)
    early.set()
    cap.evict_surplus()  # the newer reply lands first
    assert cap.used_bytes == 3 * OBJECT
    late.set()
    first.join(10)
    assert cap.used_bytes == 3 * OBJECT
