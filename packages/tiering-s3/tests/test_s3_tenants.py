"""Per-tenant TTL and quotas of the s3 tier against a real server (moto or a configured one)."""

import itertools
import time

from s3_helpers import OBJ, build, make_spec, wait_until

from tiering.core import JobMetadata
from tiering.core.base import ReqContext, block_view
from tiering.core.policies.tenancy import tenant_tag
from tiering.core.policies.tenants import scope_key, scope_keys
from tiering.testing import block_payload, make_key, wait_for_jobs

A, B = ReqContext("a", tenant="a"), ReqContext("b", tenant="b")
_ids = itertools.count(70_000)


def store(tier, view, keys, ctx):
    """Store the engine's ``keys`` of ``ctx``'s tenant as the manager would: under their scoped keys."""
    for slot, key in enumerate(keys):
        block_view(view, slot)[:] = block_payload(key, view.shape[1])
    job = JobMetadata(next(_ids), scope_keys(ctx.tenant, keys), list(range(len(keys))), False, ctx)
    tier.submit_store(job)
    return wait_for_jobs(tier, [job.job_id], 30)[job.job_id]


def lookup(tier, key, ctx):
    """The tier's answer for the engine's ``key`` of ``ctx``'s tenant (scoped, as the manager asks)."""
    return tier.lookup(scope_key(ctx.tenant, key), ctx)


def objects(s3, tier, keys, ctx):
    """How many of ``keys`` (of tenant ``ctx``) have an object in the bucket."""
    names = set(s3.list_keys(s3.prefix + "/"))
    return sum(tier.object_key(scope_key(ctx.tenant, k)) in names for k in keys)


def test_tenant_ttl_expires_blocks_as_misses_and_deletes_them(s3):
    config = s3.tier_config(tenants={"overrides": {"a": {"ttl_s": 60}}})
    tier, view = build(config, make_spec())
    try:
        now = [time.time()]
        tier.index.tenants.clock = lambda: now[0]
        ka, kb = [make_key(i, b"s3-ttl") for i in range(2)], [make_key(9, b"s3-ttl")]
        assert store(tier, view, ka, A) and store(tier, view, kb, B)
        assert objects(s3, tier, ka, A) == 2 and objects(s3, tier, kb, B) == 1
        now[0] += 61
        assert [lookup(tier, k, A) for k in ka] == [False, False] and lookup(tier, kb[0], B) is True
        wait_until(lambda: objects(s3, tier, ka, A) == 0)
        wait_until(lambda: tier.stats()["used_bytes"] == OBJ)
        s = tier.stats()
        assert s["expirations"] == s["tenant:a:expirations"] == 2 and s["tenant:a:resident_blocks"] == 0
        assert objects(s3, tier, kb, B) == 1
    finally:
        tier.shutdown()


def test_restart_restores_tenant_usage_and_age_from_the_listing(s3):
    config = s3.tier_config(
        capacity_bytes=100 * OBJ, tenants={"default": {"quota_bytes": 3 * OBJ}, "overrides": {"a": {"ttl_s": 30}}}
    )
    spec = make_spec()
    ka, kb = [make_key(i, b"s3-rs-a") for i in range(3)], [make_key(i, b"s3-rs-b") for i in range(3)]
    tier, view = build(config, spec)
    try:
        assert store(tier, view, ka, A) and store(tier, view, kb, B)
    finally:
        tier.shutdown()
    time.sleep(2.1)  # a's blocks are now >= 2 s old (LastModified), whatever this process remembers
    tier, view = build(config, spec)
    try:
        s = tier.stats()
        assert (s["tenant:a:resident_blocks"], s["tenant:a:resident_bytes"]) == (3, 3 * OBJ)
        assert s[f"tenant:tag:{tenant_tag('b').hex()}:resident_blocks"] == 3
        # The quota holds across the restart: b's next store evicts b's oldest block, a's stay.
        assert store(tier, view, [make_key(7, b"s3-rs-b")], B)
        assert sum(lookup(tier, k, B) is True for k in kb) == 2 and all(lookup(tier, k, A) for k in ka)
        # Age is the listing's LastModified: 28.5 s on from now, a's blocks are >= 30.5 s old.
        later = time.time() + 28.5
        tier.index.tenants.clock = lambda: later
        assert [lookup(tier, k, A) for k in ka] == [False] * 3
        wait_until(lambda: objects(s3, tier, ka, A) == 0)
    finally:
        tier.shutdown()
