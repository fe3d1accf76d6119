"""Per-tenant quotas and TTL of the fs tier on real files: overshoot, isolation from a noisy neighbour, restart."""

import itertools
import os
import threading
import time

import pytest

from tiering.cli.bench.workload import load_mooncake_trace, resolve_trace
from tiering.core import JobMetadata, TieringOffloadingSpec
from tiering.core.base import ReqContext, block_view
from tiering.core.policies.tenancy import MARK, tenant_tag
from tiering.core.policies.tenants import scope_key, scope_keys
from tiering.fs.layout import TRAILER_BYTES
from tiering.fs.testing import BB, block_files, make_spec
from tiering.testing import block_payload, make_key, wait_for_jobs

STORED = BB + TRAILER_BYTES
A, B = ReqContext("a", tenant="a"), ReqContext("b", tenant="b")
_ids = itertools.count(1)


def store(tier, view, keys, ctx, slots=None):
    """Store the engine's ``keys`` of ``ctx``'s tenant as the manager would: under their scoped keys."""
    slots = list(range(len(keys))) if slots is None else slots
    for key, slot in zip(keys, slots, strict=True):
        block_view(view, slot)[:] = block_payload(key, tier.block_bytes)
    job = JobMetadata(next(_ids), scope_keys(ctx.tenant, keys), slots, False, ctx)
    tier.submit_store(job)
    return wait_for_jobs(tier, [job.job_id], 60)[job.job_id]


def lookup(tier, key, ctx):
    """The tier's answer for the engine's ``key`` of ``ctx``'s tenant (scoped, as the manager asks)."""
    return tier.lookup(scope_key(ctx.tenant, key), ctx)


def tenant_files(root, tenant):
    """Block files of ``tenant`` under ``root`` (their names start with the tenant's tagged key)."""
    prefix = (MARK + tenant_tag(tenant)).hex()
    return [p for p in block_files(root) if p.name.startswith(prefix)]


def wait_until(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


@pytest.mark.usefixtures("python_io")
def test_quota_overshoot_is_at_most_one_block_per_writer(tmp_path, open_tier, monkeypatch):
    quota_blocks, writers = 8, 4
    tenants = {"overrides": {"a": {"quota_bytes": quota_blocks * STORED}}}
    tier, view = open_tier(tmp_path, num_blocks=64, n_write_threads=writers, tenants=tenants)
    b_keys = [make_key(i, b"q-b") for i in range(4)]
    assert store(tier, view, b_keys, B)
    # Every publish and unlink of a block file under one lock: the set is what the disk holds at each instant.
    lock, on_disk, peak = threading.Lock(), set(), [0]
    prefix = (MARK + tenant_tag("a")).hex()
    write_block, remove = tier.backend.write_block, tier.backend.remove

    def counted_write(tmp, final, *args):
        with lock:
            write_block(tmp, final, *args)
            if os.path.basename(final).startswith(prefix):
                on_disk.add(final)
                peak[0] = max(peak[0], len(on_disk))

    def counted_remove(path):
        with lock:
            ok = remove(path)
            if ok:
                on_disk.discard(path)
            return ok

    monkeypatch.setattr(tier.backend, "write_block", counted_write)
    monkeypatch.setattr(tier.backend, "remove", counted_remove)

    results, done = {}, threading.Condition()

    def collect():  # one thread takes the results (get_finished hands each out once) and wakes the writers
        while len(results) < writers * 8:
            for r in tier.get_finished():
                with done:
                    results[r.job_id] = r.success
                    done.notify_all()
            time.sleep(0.002)

    def writer(w):
        slots = [16 * w + i for i in range(4)]
        for j in range(8):
            keys = [make_key(1000 * w + 10 * j + i, b"q-a") for i in range(4)]
            for key, slot in zip(keys, slots, strict=True):
                block_view(view, slot)[:] = block_payload(key, tier.block_bytes)
            job = JobMetadata(next(_ids), scope_keys("a", keys), slots, False, A)
            tier.submit_store(job)
            with done:
                done.wait_for(lambda job=job: job.job_id in results, 60)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)] + [threading.Thread(target=collect)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == writers * 8 and all(results.values())
    s = tier.stats()
    print(f"tenant a: quota {quota_blocks} blocks, at most {peak[0]} block files on disk with {writers} writers")
    assert quota_blocks <= peak[0] <= quota_blocks + writers
    assert len(tenant_files(tmp_path, "a")) == s["tenant:a:resident_blocks"] == quota_blocks
    assert s["tenant:a:quota_evictions"] == writers * 8 * 4 - quota_blocks == s["evictions"]
    assert all(lookup(tier, k, B) is True for k in b_keys) and len(tenant_files(tmp_path, "b")) == 4


def test_tenant_ttl_expires_blocks_as_misses_and_removes_them(tmp_path, open_tier):
    tier, view = open_tier(tmp_path, tenants={"overrides": {"a": {"ttl_s": 60}}})
    now = [time.time()]
    tier.index.tenants.clock = lambda: now[0]
    ka, kb = make_key(1, b"ttl"), make_key(2, b"ttl")
    assert store(tier, view, [ka], A) and store(tier, view, [kb], B)
    assert lookup(tier, ka, A) is True and lookup(tier, ka, B) is False  # (b's key for the same block differs)
    now[0] += 61
    assert lookup(tier, ka, A) is False and lookup(tier, kb, B) is True
    wait_until(lambda: tier.stats()["used_bytes"] == STORED)  # a's block deleted, and the delete reported
    s = tier.stats()
    assert s["expirations"] == s["tenant:a:expirations"] == 1 and s["tenant:a:resident_blocks"] == 0
    assert not tenant_files(tmp_path, "a") and len(tenant_files(tmp_path, "b")) == 1


def test_restart_restores_tenant_usage_quota_and_age(tmp_path, open_tier):
    tenants = {"default": {"quota_bytes": 4 * STORED, "ttl_s": 3600}, "overrides": {"a": {"quota_bytes": 6 * STORED}}}
    tier, view = open_tier(tmp_path, tenants=tenants)
    a_keys = [make_key(i, b"rs-a") for i in range(5)]
    b_keys = [make_key(i, b"rs-b") for i in range(3)]
    assert store(tier, view, a_keys, A) and store(tier, view, b_keys, B)
    tier.shutdown()
    old = time.time() - 7200  # b's first block was stored two hours ago: past the default TTL
    b_file = [p for p in tenant_files(tmp_path, "b") if p.name.startswith(scope_key("b", b_keys[0]).hex())]
    os.utime(b_file[0], (old, old))

    tier2, view2 = open_tier(tmp_path, tenants=tenants)
    assert tier2.wait_for_scan(10)
    wait_until(lambda: len(tenant_files(tmp_path, "b")) == 2)  # the start-up scan removed the expired one
    s = tier2.stats()
    assert (s["tenant:a:resident_blocks"], s["tenant:a:resident_bytes"]) == (5, 5 * STORED)
    tag_b = f"tenant:tag:{tenant_tag('b').hex()}:"  # b is not in the config: named by its tag after a restart
    assert s[tag_b + "resident_blocks"] == 2 and s[tag_b + "expirations"] == 1
    assert [lookup(tier2, k, B) for k in b_keys] == [False, True, True]
    more = [make_key(i, b"rs-a-more") for i in range(3)]
    assert store(tier2, view2, more, A)  # 8 blocks for a quota of 6: two of a's older ones go, b's stay
    assert [lookup(tier2, k, A) for k in a_keys].count(True) == 3 and all(lookup(tier2, k, A) for k in more)
    assert len(tenant_files(tmp_path, "a")) == 6 and tier2.stats()["tenant:a:quota_evictions"] == 2
    assert all(lookup(tier2, k, B) for k in b_keys[1:])


def replay(tier, view, requests):
    """Replay ``(tenant context, keys)`` requests: prefix lookups, then store the missing blocks (one job each).

    Returns per tenant ``[blocks hit, blocks asked]``.
    """
    counts = {}
    for ctx, keys in requests:
        hits = 0
        for key in keys:
            if lookup(tier, key, ctx) is not True:
                break
            hits += 1
        c = counts.setdefault(ctx.tenant, [0, 0])
        c[0] += hits
        c[1] += len(keys)
        if hits < len(keys):
            job = JobMetadata(
                next(_ids), scope_keys(ctx.tenant, keys[hits:]), list(range(len(keys) - hits)), False, ctx
            )
            tier.submit_store(job)  # (the slots' bytes are not checked here: only presence counts)
            assert wait_for_jobs(tier, [job.job_id], 60)[job.job_id]
    return counts


def test_noisy_neighbour_keeps_tenant_a_hit_ratio(tmp_path, open_tier):
    # Tenant rule: a request of the Mooncake conversation trace (first 1000) belongs to tenant a when the last
    # byte of its second block's key is even (the turns of one conversation share it), else to b. b floods:
    # each of its requests is replayed once more under a salt (twice b's blocks, none shared with a).
    trace = [r.keys for r in load_mooncake_trace(resolve_trace("mooncake-conversation"), limit=1000)]
    is_a = [len(keys) > 1 and keys[1][-1] % 2 == 0 for keys in trace]
    a_only = [(A, keys) for keys, a in zip(trace, is_a, strict=True) if a]
    flood = []
    for keys, a in zip(trace, is_a, strict=True):
        flood += [(A, keys)] if a else [(B, keys), (B, tuple(k + b"+" for k in keys))]
    block = 4096
    quota = 3000 * (block + TRAILER_BYTES)
    tenants = {"default": {"quota_bytes": quota}}

    def ratio(requests, root, **cfg):
        spec = make_spec(block_bytes=block, num_blocks=256)
        tier, view = open_tier(root, spec=spec, num_blocks=256, capacity_bytes=2 * quota, **cfg)
        hit, asked = replay(tier, view, requests)["a"]
        tier.shutdown()
        return hit / asked

    started = time.monotonic()
    solo = ratio(a_only, tmp_path / "solo", tenants=tenants)
    shared = ratio(flood, tmp_path / "shared", tenants=tenants)
    unguarded = ratio(flood, tmp_path / "unguarded")  # no quotas: b's flood evicts a's blocks
    print(
        f"tenant a hit ratio: solo {solo:.3f}, b flooding with quotas {shared:.3f}, without {unguarded:.3f} "
        f"({time.monotonic() - started:.0f} s)"
    )
    assert solo > 0.1
    assert shared >= 0.95 * solo
    assert unguarded < 0.95 * solo  # (the replay is one where a neighbour hurts)


def test_a_tenants_pin_through_the_manager_keeps_its_blocks_past_its_quota(tmp_path):
    # The manager pins the keys the tier stores (one key form): the pinned blocks of tenant a are passed
    # over when a's quota evicts a's least recently used blocks.
    block = 4096
    stored = block + TRAILER_BYTES
    tier_config = {"type": "fs", "root": str(tmp_path), "max_pinned_bytes": 2 * stored,
                   "tenants": {"overrides": {"a": {"quota_bytes": 4 * stored}}}}  # fmt: skip
    config = {"cpu_bytes_to_use": 64 * block, "block_bytes": block, "block_size": 16, "model": "fs-tenant-pins"}
    manager = TieringOffloadingSpec({**config, "secondary_tiers": [tier_config]}).get_manager()
    try:
        pinned = [make_key(i, b"pin-a") for i in range(2)]
        manager_store(manager, pinned, A)
        assert manager.pin(pinned, 3600, tenant="a") == [True]
        for i in range(8):  # a's flood: 10 blocks for a quota of 4
            manager_store(manager, [make_key(i, b"flood-a")], A)
        tier = manager.secondary_tiers[0]
        s = tier.stats()
        assert (s["tenant:a:resident_blocks"], s["tenant:a:quota_evictions"], s["pinned_blocks"]) == (4, 6, 2)
        assert [tier.lookup(k, A) for k in scope_keys("a", pinned)] == [True, True]
        assert manager.lookup(pinned, ReqContext("again", tenant="a")) == 2
        assert manager.lookup(pinned, ReqContext("other", tenant="b")) == 0
    finally:
        manager.shutdown()


def manager_store(manager, keys, ctx):
    """Store ``keys`` of ``ctx``'s tenant through ``manager`` and wait until every tier has them."""
    alloc = manager.prepare_store(keys, ctx)
    for key, slot in zip(alloc.keys, alloc.block_ids, strict=True):
        block_view(manager.primary.kv_view, slot)[:] = block_payload(key, manager.primary.block_bytes)
    manager.complete_store(alloc.keys, ctx)
    wait_until(lambda: not manager.has_pending_work(), 30)
    manager.on_request_finished(ctx)
