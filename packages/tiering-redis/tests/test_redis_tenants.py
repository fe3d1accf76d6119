"""Per-tenant TTL (the server's EX) and fleet-wide quotas (eviction "tier") of the redis tier on a real server."""

import itertools
import time

from tiering.core import create_secondary_tier
from tiering.core.base import JobMetadata, ReqContext, block_view
from tiering.core.policies.tenancy import tenant_tag
from tiering.core.policies.tenants import scope_key, scope_keys
from tiering.core.primary import allocate_host_buffer
from tiering.core.spec import OffloadingSpec
from tiering.testing import block_payload, make_key, wait_for_jobs
from tiering.testing.harness import wait_until

BLOCK = 16 * 1024
OBJECT = BLOCK + 128
A, B = ReqContext("a", tenant="a"), ReqContext("b", tenant="b")
_ids = itertools.count(1)


def spec():
    return OffloadingSpec({"cpu_bytes_to_use": 32 * BLOCK, "block_bytes": BLOCK, "model": "redis/tenants"})


def store(tier, view, keys, ctx):
    """Store the engine's ``keys`` of ``ctx``'s tenant as the manager would: under their scoped keys."""
    for slot, key in enumerate(keys):
        block_view(view, slot)[:] = block_payload(key, BLOCK)
    job = JobMetadata(next(_ids), scope_keys(ctx.tenant, keys), list(range(len(keys))), False, ctx)
    tier.submit_store(job)
    ok = wait_for_jobs(tier, [job.job_id], 30)[job.job_id]
    tier.pool.wait_idle(10)
    return ok


def lookup(tier, key, ctx):
    """The tier's answer for the engine's ``key`` of ``ctx``'s tenant (scoped, as the manager asks)."""
    return tier.lookup(scope_key(ctx.tenant, key), ctx)


def present(client, tier, keys, ctx):
    """How many of ``keys`` (of tenant ``ctx``) the server holds."""
    return sum(client.exists(tier.blocks.block_key(scope_key(ctx.tenant, k))) for k in keys)


def test_tenant_ttl_is_the_blocks_ex_and_expired_blocks_are_misses(redis_server, prefix):
    config = {"type": "redis", "url": redis_server.url, "prefix": prefix, "ttl_s": 3600,
              "tenants": {"overrides": {"a": {"ttl_s": 30}}}}  # fmt: skip
    view = allocate_host_buffer(32, BLOCK)
    tier = create_secondary_tier(config, view, spec())
    client = redis_server.client()
    try:
        assert tier.wait_for_scan(30)
        ka, kb = [make_key(i, b"r-ttl-a") for i in range(3)], [make_key(i, b"r-ttl-b") for i in range(2)]
        assert store(tier, view, ka, A) and store(tier, view, kb, B)
        assert all(0 < client.ttl(tier.blocks.block_key(scope_key("a", k))) <= 30 for k in ka)  # the tenant's
        assert all(3500 < client.ttl(tier.blocks.block_key(scope_key("b", k))) <= 3600 for k in kb)  # the tier's
        assert all(lookup(tier, k, A) for k in ka)
        # Thirty seconds on, without waiting them out: the tier's clock is the test's, and the server's EX is
        # brought forward to now (what the server does once the tenant's TTL has passed).
        later = time.time() + 31
        tier.index.tenants.clock = lambda: later
        for k in ka:
            client.pexpire(tier.blocks.block_key(scope_key("a", k)), 1)
        wait_until(lambda: present(client, tier, ka, A) == 0)
        assert present(client, tier, ka, A) == 0 and present(client, tier, kb, B) == 2  # the server expired a's
        assert [lookup(tier, k, A) for k in ka] == [False] * 3 and all(lookup(tier, k, B) for k in kb)
        tier.pool.wait_idle(10)
        deadline = time.monotonic() + 10  # the expired blocks' deletes run on the tier's delete pool
        while tier.stats()["used_bytes"] > 2 * OBJECT and time.monotonic() < deadline:
            time.sleep(0.01)
        s = tier.stats()
        assert s["expirations"] == s["tenant:a:expirations"] == 3 and s["tenant:a:resident_blocks"] == 0
        assert s["used_bytes"] == 2 * OBJECT
    finally:
        tier.shutdown()
        client.close()


def test_fleet_tier_keeps_tenant_quotas_across_two_tier_instances(redis_server, prefix, caplog):
    config = {"type": "redis", "url": redis_server.url, "prefix": prefix, "eviction": "tier",
              "capacity_bytes": 64 * OBJECT, "tenants": {"default": {"quota_bytes": 4 * OBJECT}}}  # fmt: skip
    views = [allocate_host_buffer(32, BLOCK) for _ in range(2)]
    tiers = [create_secondary_tier(config, view, spec()) for view in views]
    client = redis_server.client()
    try:
        assert all(t.wait_for_scan(30) for t in tiers)
        kb = [make_key(i, b"r-fleet-b") for i in range(3)]
        assert store(tiers[0], views[0], kb, B)
        first = [make_key(i, b"r-fleet-a1") for i in range(3)]
        second = [make_key(i, b"r-fleet-a2") for i in range(3)]
        assert store(tiers[0], views[0], first, A)
        assert store(tiers[1], views[1], second, A)  # the fleet holds 6 of a's blocks for a quota of 4
        assert present(client, tiers[0], first + second, A) == 4
        assert present(client, tiers[0], first[:2], A) == 0  # the fleet's oldest of a's went (either process)
        assert present(client, tiers[0], kb, B) == 3  # b's blocks are never a's victims
        digest = tiers[0].blocks.digest
        members = client.zcard(f"{prefix}:{{{digest}}}:lru:t:{tenant_tag('a').hex()}")
        assert members == 4 and client.zcard(f"{prefix}:{{{digest}}}:lru") == 7
        s0, s1 = tiers[0].stats(), tiers[1].stats()
        assert s1["tenant:a:fleet_used_bytes"] == 4 * OBJECT and s1["tenant:a:fleet_quota_evictions"] == 2
        assert s0["fleet_evictions"] + s1["fleet_evictions"] == 2
        # A third process starting over the same namespace settles its start-up trim without an error
        # (a trim with no tenant's surplus once raised in the scan) and knows the quota.
        with caplog.at_level("ERROR"):
            tiers.append(create_secondary_tier(config, allocate_host_buffer(32, BLOCK), spec()))
            assert tiers[-1].wait_for_scan(30)
        assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
    finally:
        for tier in tiers:
            tier.shutdown()
        client.close()
