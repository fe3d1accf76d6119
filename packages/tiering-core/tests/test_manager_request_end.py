"""The manager frees a request's primary slots when it ends, whether its stores were completed or not."""

import pytest

from tiering.core import CPUPrimaryTier, JobResult, LRUCachePolicy, OffloadingSpec, ReqContext, TieringManager
from tiering.core.base import SecondaryTierManager, block_view
from tiering.testing import block_payload, make_key

BLOCK = 256
SLOTS = 48


class Tier(SecondaryTierManager):
    """Keeps what it is sent; every job finishes at once."""

    def __init__(self, spec, view):
        super().__init__(spec, view, "mem")
        self.data, self.done = {}, []

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


def stack():
    spec = OffloadingSpec({"cpu_bytes_to_use": SLOTS * BLOCK, "block_bytes": BLOCK})
    primary = CPUPrimaryTier(SLOTS, BLOCK, LRUCachePolicy(SLOTS))
    tier = Tier(spec, primary.kv_view)
    return TieringManager(primary, [tier]), tier


@pytest.mark.parametrize("tenant", ["", "acme"])
def test_c31_a_request_that_ends_without_complete_store_frees_its_primary_slots(tenant):
    manager, tier = stack()
    for r in range(30):  # each allocates two slots and ends (finished or aborted) without completing its store
        ctx = ReqContext(f"ended-{r}", tenant=tenant)
        alloc = manager.prepare_store([make_key(2 * r, b"e"), make_key(2 * r + 1, b"e")], ctx)
        assert len(alloc.keys) == 2, f"request {r} got no slots: {manager.primary.num_pinned} pinned"
        manager.on_request_finished(ctx)
    assert manager.primary.num_pinned == 0 and manager.primary.num_resident == 0
    for r in range(50):  # the next requests store and hit as before
        ctx = ReqContext(f"next-{r}", tenant=tenant)
        keys = [make_key(r, b"n")]
        alloc = manager.prepare_store(keys, ctx)
        assert len(alloc.keys) == 1
        block_view(manager.primary.kv_view, alloc.block_ids[0])[:] = block_payload(keys[0], BLOCK)
        manager.complete_store(alloc.keys, ctx)
        manager.on_request_finished(ctx)
        assert manager.lookup(keys, ReqContext(f"again-{r}", tenant=tenant)) == 1
    assert len(tier.data) == 50 and manager.primary.num_pinned == 0


def test_c31_a_completed_store_is_kept_when_its_request_ends():
    manager, _ = stack()
    ctx = ReqContext("done")
    keys = [make_key(1, b"k"), make_key(2, b"k")]
    alloc = manager.prepare_store(keys, ctx)
    manager.complete_store(alloc.keys[:1], ctx)  # one written, one never
    manager.on_request_finished(ctx)
    assert manager.lookup(keys[:1], ReqContext("later")) == 1
    assert manager.primary.num_resident == 1 and manager.primary.num_pinned == 0
