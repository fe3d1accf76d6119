"""A default-tenant caller choosing its keys can never name another tenant's stored block."""

import pytest

from tiering.core import CPUPrimaryTier, JobResult, LRUCachePolicy, OffloadingSpec, ReqContext, TieringManager
from tiering.core.base import OffloadKey, SecondaryTierManager, block_view
from tiering.core.policies.tenancy import DEFAULT_TAG, MARK, tag_of, tenant_tag
from tiering.core.policies.tenants import caller_allocation, scope_key, scope_keys
from tiering.testing import block_payload, make_key

BLOCK = 256


class Tier(SecondaryTierManager):
    """Keeps what it is sent (the medium that survives a restart); every job finishes at once."""

    def __init__(self, spec, view, data):
        super().__init__(spec, view, "mem")
        self.data, self.done = data, []

    def lookup(self, key, ctx):
        return key in self.data

    def submit_store(self, job):
        for k, b in zip(job.keys, job.block_ids, strict=True):
            self.data[k] = block_view(self.primary_kv_view, b).tobytes()
        self.done.append(JobResult(job.job_id, True))

    def submit_load(self, job):
        for k, b in zip(job.keys, job.block_ids, strict=True):
            block_view(self.primary_kv_view, b)[:] = self.data[k]
        self.done.append(JobResult(job.job_id, True))

    def get_finished(self):
        out, self.done = self.done, []
        return out


def stack(data):
    spec = OffloadingSpec({"cpu_bytes_to_use": 16 * BLOCK, "block_bytes": BLOCK})
    primary = CPUPrimaryTier(16, BLOCK, LRUCachePolicy(16))
    return TieringManager(primary, [Tier(spec, primary.kv_view, data)])


def test_c28_a_default_tenant_key_in_another_tenants_stored_form_never_gets_its_blocks():
    data = {}
    manager = stack(data)
    keys = [make_key(i, b"tenant-b") for i in range(4)]
    ctx_b = ReqContext("b", tenant="B")
    alloc = manager.prepare_store(keys, ctx_b)
    for k, slot in zip(alloc.keys, alloc.block_ids, strict=True):
        block_view(manager.primary.kv_view, slot)[:] = block_payload(k, BLOCK)
    manager.complete_store(alloc.keys, ctx_b)
    manager.on_request_finished(ctx_b)
    forged = [scope_key("B", k) for k in keys]  # B's stored form, byte for byte
    assert set(forged) <= set(data)
    default = ReqContext("default")
    assert not manager.lookup(forged, default)  # from the primary tier
    assert manager.lookup(keys, ReqContext("b2", tenant="B")) == 4  # B still gets its own
    again = stack(data)  # a restart: only the secondary tier holds B's blocks
    assert not again.lookup(forged, default)
    assert again.lookup(keys, ReqContext("b3", tenant="B")) == 4


def test_c28_default_tenant_keys_shaped_like_a_stored_form_are_escaped_and_kept_the_default_tenants():
    engine = make_key(7, b"engine")
    assert scope_key("", engine) is engine and scope_keys("", [engine]) == [engine]  # the engine's keys unchanged
    forged = OffloadKey(MARK + tenant_tag("B") + engine)
    escaped = scope_key("", forged)
    assert escaped != forged and scope_keys("", [engine, forged]) == [engine, escaped]
    assert tag_of(escaped) == DEFAULT_TAG  # counted as the default tenant's, under no tenant's tag
    for tenant in ("", "B", "acme"):
        assert escaped != scope_key(tenant, engine)
    alloc_keys = [escaped]
    from tiering.core.primary.tier import Allocation

    mapped = caller_allocation("", Allocation(keys=alloc_keys, block_ids=[0]), [escaped], [forged])
    assert mapped.keys == [forged]  # the caller gets its own key back


@pytest.mark.parametrize("length", [4, 20, 300])
def test_c28_escaped_keys_of_any_length_fit_the_key_bound(length):
    from tiering.core.format import MAX_KEY_BYTES

    key = OffloadKey(MARK + bytes(length - len(MARK)))
    escaped = scope_key("", key)
    assert escaped.startswith(MARK) and len(escaped) <= MAX_KEY_BYTES and escaped != key
