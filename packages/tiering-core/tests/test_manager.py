"""The tiering manager across a primary tier and fake secondary tiers."""

import pytest

from tiering.core import CPUPrimaryTier, JobResult, LRUCachePolicy, OffloadingSpec, ReqContext, TieringManager
from tiering.core.base import SecondaryTierManager, block_view
from tiering.core.runtime.manager import PRIMARY
from tiering.testing import block_payload, make_key

BLOCK = 1024


class FakeTier(SecondaryTierManager):
    """Holds bytes; jobs finish when ``release()`` is called; can fail loads or raise."""

    def __init__(self, spec, view, name="fake"):
        super().__init__(spec, view, name)
        self.data = {}
        self.pending = []
        self.finished = []
        self.fail_loads = set()
        self.lookup_answer = None
        self.raise_in = set()
        self.loads = []

    def lookup(self, key, ctx):
        if "lookup" in self.raise_in:
            raise RuntimeError("boom")
        if self.lookup_answer is not None:
            return self.lookup_answer
        return key in self.data

    def submit_store(self, job):
        if "store" in self.raise_in:
            raise RuntimeError("boom")
        for k, b in zip(job.keys, job.block_ids):
            self.data[k] = block_view(self.primary_kv_view, b).tobytes()
        self.pending.append(JobResult(job.job_id, True))

    def submit_load(self, job):
        self.loads.append(list(job.keys))
        ok = all(k in self.data and k not in self.fail_loads for k in job.keys)
        if ok:
            for k, b in zip(job.keys, job.block_ids):
                block_view(self.primary_kv_view, b)[:] = self.data[k]
        self.pending.append(JobResult(job.job_id, ok))

    def release(self):
        self.finished += self.pending
        self.pending = []

    def get_finished(self):
        out, self.finished = self.finished, []
        return out


@pytest.fixture
def stack():
    spec = OffloadingSpec({"cpu_bytes_to_use": 4 * BLOCK, "block_bytes": BLOCK})
    primary = CPUPrimaryTier(4, BLOCK, LRUCachePolicy(4))
    tiers = [FakeTier(spec, primary.kv_view, "t0"), FakeTier(spec, primary.kv_view, "t1")]
    return TieringManager(primary, tiers), tiers


def store(manager, keys, ctx):
    alloc = manager.prepare_store(keys, ctx)
    for k, b in zip(alloc.keys, alloc.block_ids):
        block_view(manager.primary.kv_view, b)[:] = block_payload(k, BLOCK)
    manager.complete_store(alloc.keys, ctx)
    return alloc


def store_in_batches(manager, tiers, keys):
    for start in range(0, len(keys), 2):
        store(manager, keys[start : start + 2], ReqContext("a"))
        finish(manager, tiers)


def finish(manager, tiers):
    for t in tiers:
        t.release()
    return manager.get_finished()


def test_store_cascades_to_every_tier_and_pins_until_reported(stack):
    manager, tiers = stack
    keys = [make_key(i) for i in range(2)]
    store(manager, keys, ReqContext("a"))
    assert all(set(t.data) == set(keys) for t in tiers)
    assert [manager.primary.pins(k) for k in keys] == [2, 2]  # one pin per tier job
    assert manager.has_pending_work()
    finish(manager, tiers)
    assert [manager.primary.pins(k) for k in keys] == [0, 0]
    assert not manager.has_pending_work()
    assert manager.metrics.value("blocks_stored_total", index="0") == 2
    assert manager.metrics.value("blocks_stored_total", index="1") == 2
    assert manager.metrics.value("stored_bytes_total", index="1") == 2 * BLOCK
    assert manager.metrics.value("jobs_total", index="0", kind="store", outcome="ok") == 1


def test_lookup_primary_then_secondary_in_order_and_promotion(stack):
    manager, tiers = stack
    keys = [make_key(i) for i in range(6)]
    store_in_batches(manager, tiers, keys)  # 4 slots: keys 0, 1 evicted from the primary tier
    assert [manager.primary.lookup(k) for k in keys] == [False, False, True, True, True, True]
    ctx = ReqContext("b")
    assert manager.lookup(keys, ctx) == 6
    manager.prepare_load(keys[:4], ctx)
    assert manager.get_finished() == []  # promotions pending in tier 0
    (result,) = finish(manager, tiers)
    assert result.keys == keys[:4] and result.requested == 4
    assert result.sources[:2] == [0, 0]  # promoted from tier 0, the first holding them
    assert tiers[1].loads == []
    for k, b in zip(result.keys, result.block_ids):
        assert block_view(manager.primary.kv_view, b).tobytes() == block_payload(k, BLOCK)
    assert all(manager.primary.pins(k) == 1 for k in keys[:4])
    manager.complete_load(ctx)
    assert all(manager.primary.pins(k) == 0 for k in keys[:4])


def test_pending_secondary_answer_returns_none(stack):
    manager, tiers = stack
    tiers[0].lookup_answer = None
    tiers[1].lookup_answer = None
    tiers[0].data[make_key(1)] = b""
    tiers[1].lookup_answer = None
    # tier 0 holds the key: True wins over the pending tier 1
    assert manager.lookup([make_key(1)], ReqContext("a")) == 1
    tiers[0].data.clear()
    tiers[0].lookup_answer = False
    tiers[1].lookup_answer = None
    tiers[1].lookup = lambda key, ctx: None  # answer pending
    assert manager.lookup([make_key(1)], ReqContext("a")) is None


def test_failed_promotion_truncates_run_and_is_not_retried(stack):
    manager, tiers = stack
    keys = [make_key(i) for i in range(6)]
    store_in_batches(manager, tiers, keys)
    tiers[0].fail_loads = {keys[1]}
    tiers[1].fail_loads = {keys[1]}
    ctx = ReqContext("b")
    assert manager.lookup(keys, ctx) == 6
    manager.prepare_load(keys[:3], ctx)
    (result,) = finish(manager, tiers)
    # keys 0 and 1 were promoted by one job from tier 0, which failed as a whole.
    assert result.keys == [] and result.requested == 3
    assert manager.metrics.value("jobs_total", index="0", kind="load", outcome="failed") == 1 and tiers[0].loads == [
        keys[:2]
    ]
    assert manager.primary.pins(keys[2]) == 0  # the resident block after the failure was unpinned
    # The failed keys are misses for this request from now on: one attempt per key per request.
    assert manager.lookup(keys, ctx) == 0
    manager.complete_load(ctx)
    assert all(manager.primary.pins(k) == 0 for k in keys if k in manager.primary)
    assert keys[1] not in manager.primary
    manager.on_request_finished(ctx)
    assert manager.lookup(keys, ctx) == 6  # a new request may try again


def test_tier_exceptions_never_escape(stack):
    manager, tiers = stack
    tiers[0].raise_in = {"lookup", "store"}
    keys = [make_key(i) for i in range(2)]
    store(manager, keys, ReqContext("a"))
    finish(manager, tiers)
    assert manager.metrics.value("jobs_total", index="0", kind="store", outcome="failed") == 1
    assert all(manager.primary.pins(k) == 0 for k in keys)
    assert manager.lookup([make_key(9)], ReqContext("a")) == 0
    # 2 cascade lookups + the store submission + the lookup of key 9 raised; each is counted
    assert manager.metrics.value("tier_errors_total", index="0") == 4


def test_primary_hits_report_without_secondary_jobs(stack):
    manager, _ = stack
    keys = [make_key(i) for i in range(2)]
    store(manager, keys, ReqContext("a"))
    ctx = ReqContext("b")
    manager.prepare_load(keys, ctx)
    (result,) = manager.get_finished()
    assert result.sources == [PRIMARY, PRIMARY]
    with pytest.raises(ValueError, match="already has a load"):
        manager.prepare_load(keys, ctx)
    manager.complete_load(ctx)


def test_promotion_without_free_slot_truncates(stack):
    manager, tiers = stack
    keys = [make_key(i) for i in range(6)]
    store_in_batches(manager, tiers, keys)
    hot = [k for k in keys if manager.primary.lookup(k)]
    manager.primary.pin(hot)  # every slot pinned
    ctx = ReqContext("b")
    manager.prepare_load(keys[:2], ctx)
    (result,) = manager.get_finished()
    assert result.keys == [] and manager.metrics.value("load_failures_total", tier="primary", cause="no_slot") == 1


def test_cascade_skips_blocks_a_tier_already_holds(stack):
    manager, tiers = stack
    keys = [make_key(i) for i in range(2)]
    tiers[1].data[keys[0]] = b"old"  # tier 1 already holds key 0
    touched = []
    tiers[1].touch = lambda k, ctx: touched.extend(k)
    store(manager, keys, ReqContext("a"))
    finish(manager, tiers)
    assert manager.metrics.value("blocks_stored_total", index="0") == 2
    assert manager.metrics.value("blocks_stored_total", index="1") == 1
    assert tiers[1].data[keys[0]] == b"old" and touched == [keys[0]]


def test_partial_promotion_keeps_the_verified_prefix(stack):
    manager, tiers = stack
    keys = [make_key(i) for i in range(6)]
    store_in_batches(manager, tiers, keys)
    ctx = ReqContext("b")
    original = tiers[0].submit_load

    def partial(job):
        original(job)
        tiers[0].pending[-1] = JobResult(job.job_id, False, successful_keys=[job.keys[0]])

    tiers[0].submit_load = partial
    manager.prepare_load(keys[:3], ctx)
    (result,) = finish(manager, tiers)
    assert result.keys == keys[:1]
    assert block_view(manager.primary.kv_view, result.block_ids[0]).tobytes() == block_payload(keys[0], BLOCK)
    assert keys[1] not in manager.primary  # the failed block's slot was freed
    assert manager.lookup(keys, ctx) == 1


def test_promotion_from_a_lower_tier_fills_the_tiers_above(stack):
    manager, tiers = stack
    keys = [make_key(i, b"fill") for i in range(2)]
    for k in keys:
        tiers[1].data[k] = block_payload(k, BLOCK)  # e.g. written by another node to a shared tier
    ctx = ReqContext("a")
    assert manager.lookup(keys, ctx) == 2
    manager.prepare_load(keys, ctx)
    (result,) = finish(manager, tiers)
    assert result.sources == [1, 1]
    assert tiers[0].data == {k: block_payload(k, BLOCK) for k in keys}  # written back to tier 0
    assert [manager.primary.pins(k) for k in keys] == [2, 2]  # the load's pin and tier 0's store job
    finish(manager, tiers)
    manager.complete_load(ctx)
    assert [manager.primary.pins(k) for k in keys] == [0, 0] and not manager.has_pending_work()
    assert manager.metrics.value("blocks_stored_total", index="0") == 2
    assert manager.metrics.value("jobs_total", index="1", kind="store", outcome="ok") == 0


def test_promotion_from_the_first_tier_writes_nothing(stack):
    manager, tiers = stack
    keys = [make_key(i, b"nofill") for i in range(2)]
    for k in keys:
        tiers[0].data[k] = block_payload(k, BLOCK)
    ctx = ReqContext("a")
    manager.prepare_load(keys, ctx)
    (result,) = finish(manager, tiers)
    assert result.sources == [0, 0]
    assert tiers[1].data == {} and not manager.has_pending_work()


def _c18_stack(raise_in: str, times: int = 10**9):
    """Tier 0 holds keys 0, 1 and raises in ``raise_in`` (``times`` times); tier 1 holds keys 0..3."""
    spec = OffloadingSpec({"cpu_bytes_to_use": 8 * BLOCK, "block_bytes": BLOCK})
    primary = CPUPrimaryTier(8, BLOCK, LRUCachePolicy(8))
    tiers = [FakeTier(spec, primary.kv_view, "t0"), FakeTier(spec, primary.kv_view, "t1")]
    keys = [make_key(i, b"c18") for i in range(4)]
    for tier, held in zip(tiers, (keys[:2], keys)):
        tier.data.update({k: block_payload(k, BLOCK) for k in held})
    original = getattr(tiers[0], raise_in)

    def raising(*args):
        if tiers[0].raising:
            tiers[0].raising -= 1
            raise RuntimeError(f"{raise_in} broke")
        return original(*args)

    tiers[0].raising = times
    setattr(tiers[0], raise_in, raising)
    return TieringManager(primary, tiers), tiers, keys


def _c18_run(manager, tiers, keys, req_id):
    """Look ``keys`` up, load the run found, wait for the load's report; returns (result, run length)."""
    ctx = ReqContext(req_id)
    n = manager.lookup(keys, ctx)
    manager.prepare_load(keys[:n], ctx)
    results = []
    for _ in range(3):
        results += finish(manager, tiers)
    (result,) = results
    for k, b in zip(result.keys, result.block_ids):
        assert block_view(manager.primary.kv_view, b).tobytes() == block_payload(k, BLOCK)
    manager.complete_load(ctx)
    manager.on_request_finished(ctx)
    return result, n


def test_c18_submit_load_raising_reports_the_load_once_and_the_next_request_works(caplog):
    manager, tiers, keys = _c18_stack("submit_load")
    result, n = _c18_run(manager, tiers, keys, "first")
    # Tier 0 was asked for keys 0, 1 and refused: nothing before them loaded, the rest is recomputed.
    assert n == 4 and result.keys == [] and result.requested == 4
    assert manager.primary.num_pinned == 0 and not manager.has_pending_work()
    assert manager.metrics.value("tier_errors_total", index="0") == 1
    assert manager.metrics.value("jobs_total", index="0", kind="load", outcome="failed") == 1
    assert len([r for r in caplog.records if "refused job" in r.getMessage()]) == 1
    tiers[0].raising = 0
    result, _ = _c18_run(manager, tiers, keys, "second")
    # keys 2, 3 came from tier 1 in the first request and stayed in the primary tier
    assert result.keys == keys and result.sources == [0, 0, PRIMARY, PRIMARY]
    assert manager.primary.num_pinned == 0


def test_c18_submit_load_raising_keeps_what_other_tiers_delivered():
    manager, tiers, keys = _c18_stack("submit_load")
    alloc = manager.primary.allocate(keys[:1])  # key 0 resident in the primary tier
    block_view(manager.primary.kv_view, alloc.block_ids[0])[:] = block_payload(keys[0], BLOCK)
    manager.primary.complete_write(keys[:1], True)
    del tiers[0].data[keys[0]]
    for k in keys[:2]:
        del tiers[1].data[k]  # key 1 only in tier 0 (which refuses), keys 2, 3 only in tier 1
    result, n = _c18_run(manager, tiers, keys, "first")
    assert n == 4 and result.keys == keys[:1] and result.sources == [PRIMARY]
    assert manager.primary.num_pinned == 0 and not manager.has_pending_work()
    assert [manager.primary.lookup(k) for k in keys] == [True, False, True, True]


@pytest.mark.parametrize("raise_in", ["lookup", "get_finished", "submit_store"])
def test_c18_other_tier_calls_raising_never_escape(raise_in):
    manager, tiers, keys = _c18_stack(raise_in, times=1 if raise_in == "get_finished" else 10**9)
    result, _ = _c18_run(manager, tiers, keys, "first")
    if raise_in == "lookup":  # tier 0 is a miss: tier 1 serves every block
        assert result.keys == keys and result.sources == [1, 1, 1, 1]
    elif raise_in == "get_finished":  # tier 0's job stayed in flight until the tier reported it
        assert result.keys == keys and manager.metrics.value("tier_errors_total", index="0") == 1
    else:
        assert result.keys == keys and result.sources == [0, 0, 1, 1]
    fresh = [make_key(i, b"c18-new") for i in range(2)]
    store(manager, fresh, ReqContext("store"))  # a store cascades to tier 0 as well
    for _ in range(2):
        finish(manager, tiers)
    tiers[0].raising = 0
    finish(manager, tiers)
    assert manager.primary.num_pinned == 0 and not manager.has_pending_work()
    stored = all(k in tiers[0].data for k in fresh)
    assert stored is (raise_in != "submit_store")
    if raise_in == "submit_store":
        # the fill of keys 2, 3 (loaded from tier 1) and the new store: both refused, both reported failed
        assert manager.metrics.value("jobs_total", index="0", kind="store", outcome="failed") == 2


def test_primary_events_name_stores_promotions_and_evictions(stack):
    manager, tiers = stack
    keys = [make_key(i) for i in range(6)]
    store_in_batches(manager, tiers, keys)  # 4 slots: keys 0, 1 evicted from the primary tier
    ctx = ReqContext("b")
    assert manager.lookup(keys[:2], ctx) == 2
    manager.prepare_load(keys[:2], ctx)  # promoted back: keys 2, 3 make room
    finish(manager, tiers)
    manager.complete_load(ctx)
    events = manager.primary.take_events()
    assert {(e.medium, e.tier, e.locality) for e in events} == {("cpu", "primary", "local")}
    assert [(type(e).__name__, e.cause, e.keys) for e in events[1:]] == [
        ("BlockStored", "store", tuple(keys[0:2])),
        ("BlockStored", "store", tuple(keys[2:4])),
        ("BlockRemoved", "eviction", (keys[0],)),
        ("BlockRemoved", "eviction", (keys[1],)),
        ("BlockStored", "store", tuple(keys[4:6])),
        ("BlockRemoved", "eviction", (keys[2],)),
        ("BlockRemoved", "eviction", (keys[3],)),
        ("BlockStored", "promotion", tuple(keys[0:2])),
    ]
