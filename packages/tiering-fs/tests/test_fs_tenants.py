"""Tenants over a real fs tier: identical prompts of random tenants never hit across tenants, in any tier."""

import tempfile
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from tiering.core import ReqContext, TieringOffloadingSpec
from tiering.core.base import block_view
from tiering.core.keys import block_keys
from tiering.testing import block_payload

BB = 4096
TOKENS = 16
TIMEOUT_S = 30.0


def _manager(root):
    config = {"cpu_bytes_to_use": 64 * BB, "block_bytes": BB, "block_size": TOKENS, "model": "fs-tenants"}
    return TieringOffloadingSpec({**config, "secondary_tiers": [{"type": "fs", "root": root}]}).get_manager()


def _payload(tenant, key):
    return block_payload(tenant.encode() + b"\0" + key, BB)  # each tenant's bytes differ: a stray load shows


def _drain(manager):
    deadline = time.monotonic() + TIMEOUT_S
    while manager.has_pending_work():
        assert time.monotonic() < deadline, "cascade never finished"
        time.sleep(0.002)


def _store(manager, keys, tenant, req_id):
    ctx = ReqContext(req_id, tenant=tenant)
    alloc = manager.prepare_store(keys, ctx)
    for key, slot in zip(alloc.keys, alloc.block_ids):
        block_view(manager.primary.kv_view, slot)[:] = _payload(tenant, key)
    manager.complete_store(alloc.keys, ctx)
    _drain(manager)
    manager.on_request_finished(ctx)


def _hits(manager, keys, tenant, req_id):
    """Leading blocks found for ``tenant``; those found are loaded and must be the tenant's own bytes."""
    ctx = ReqContext(req_id, tenant=tenant)
    deadline = time.monotonic() + TIMEOUT_S
    while (found := manager.lookup(keys, ctx)) is None:
        assert time.monotonic() < deadline, "lookup never resolved"
        time.sleep(0.002)
    if found:
        manager.prepare_load(keys[:found], ctx)
        while not (results := manager.get_finished()):
            assert time.monotonic() < deadline, "load never finished"
            time.sleep(0.002)
        (result,) = results
        rows = [block_view(manager.primary.kv_view, slot).tobytes() for slot in result.block_ids]
        assert rows == [_payload(tenant, key) for key in result.keys], f"tenant {tenant!r} got foreign bytes"
        manager.complete_load(ctx)
    manager.on_request_finished(ctx)
    return found


@settings(max_examples=15, deadline=None)
@given(
    tenants=st.lists(st.text(max_size=6), min_size=3, max_size=5, unique=True),
    prompt=st.lists(st.integers(0, 2**32 - 1), min_size=TOKENS, max_size=4 * TOKENS),
)
def test_random_tenants_with_one_prompt_get_no_cross_tenant_hit_primary_or_fs(tenants, prompt):
    keys = block_keys(prompt, TOKENS)
    writers, readers = tenants[:2], tenants[2:]  # random salts, "" (the default tenant) among them at times
    with tempfile.TemporaryDirectory() as root:
        for fresh in (False, True):  # first with the primary tier holding the blocks, then from the fs tier only
            manager = _manager(root)
            try:
                if not fresh:
                    for i, tenant in enumerate(writers):
                        _store(manager, keys, tenant, f"store-{i}")
                cross = sum(_hits(manager, keys, t, f"r-{i}") for i, t in enumerate(readers))
                assert cross == 0, f"{cross} cross-tenant hits for readers {readers!r}"
                for i, tenant in enumerate(writers):
                    assert _hits(manager, keys, tenant, f"w-{i}") == len(keys), f"tenant {tenant!r} lost its blocks"
            finally:
                manager.shutdown()
