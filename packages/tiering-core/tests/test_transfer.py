"""The transfer path with torch: layouts, dtypes, byte-exact round trips, coalescing, pins, driver.

The torch-free part (planning, layouts, the driver over a pure-Python copier, core without torch) is in
test_transfer_plan.py.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

torch = pytest.importorskip("torch")

from tiering.core import (  # noqa: E402
    CPUPrimaryTier,
    JobMetadata,
    JobResult,
    LRUCachePolicy,
    OffloadKey,
    ReqContext,
    SecondaryTierManager,
    TieringManager,
    TieringOffloadingSpec,
    block_view,
)
from tiering.core.keys import block_keys  # noqa: E402
from tiering.core.runtime.driver import OffloadingDriver  # noqa: E402
from tiering.core.transfer import (  # noqa: E402
    TransferHandler,
    allocate_host_buffer,
    detect_layout,
    kv_geometry,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.float16, torch.bfloat16] + (
    [torch.float8_e4m3fn] if hasattr(torch, "float8_e4m3fn") else []
)
LAYOUTS = ["kv_first", "blocks_first"]
NUM_LAYERS, NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD = 3, 13, 4, 2, 8


def make_kv(layout: str, dtype: torch.dtype, device: str, fill: bool = True, num_blocks: int = NUM_BLOCKS):
    """Per-layer KV tensors filled with random bytes (every bit pattern, NaNs included)."""
    shape = (
        (2, num_blocks, BLOCK_SIZE, HEADS, HEAD) if layout == "kv_first" else (num_blocks, 2, BLOCK_SIZE, HEADS, HEAD)
    )
    out = []
    gen = torch.Generator().manual_seed(1234)
    for _ in range(NUM_LAYERS):
        t = torch.zeros(shape, dtype=dtype, device=device)
        if fill:
            raw = torch.randint(0, 256, (t.numel() * t.element_size(),), dtype=torch.uint8, generator=gen)
            t.view(torch.uint8).view(-1).copy_(raw.to(device))
        out.append(t)
    return out


def page(t: torch.Tensor, layout: str, block: int, kv: int) -> bytes:
    """The bytes of one K (kv=0) or V (kv=1) page of one block, straight from the tensor."""
    p = t[kv, block] if layout == "kv_first" else t[block, kv]
    return p.contiguous().view(torch.uint8).cpu().numpy().tobytes()


def expected_slot(kv: list[torch.Tensor], layout: str, block: int) -> bytes:
    """The documented slot layout: layer-major, K then V."""
    return b"".join(page(t, layout, block, k) for t in kv for k in (0, 1))


def primary_for(kv: list[torch.Tensor], num_slots: int, layout: str | None = None) -> CPUPrimaryTier:
    geo = kv_geometry(kv, layout)  # type: ignore[arg-type]
    buf = allocate_host_buffer(num_slots, geo.block_bytes)
    return CPUPrimaryTier(num_slots, geo.block_bytes, LRUCachePolicy(num_slots), buffer=buf.view)


def drain(handler: TransferHandler) -> list[JobResult]:
    handler.synchronize()
    return handler.get_finished()


def slot_bytes(primary: CPUPrimaryTier, slot: int) -> bytes:
    return primary.kv_view[slot : slot + 1].tobytes()


# -- geometry -----------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_geometry(layout, dtype):
    kv = make_kv(layout, dtype, "cpu", fill=False)
    geo = kv_geometry(kv)
    assert geo.layout == layout
    assert geo.num_blocks == NUM_BLOCKS
    assert geo.page_bytes == BLOCK_SIZE * HEADS * HEAD * torch.empty((), dtype=dtype).element_size()
    assert geo.block_bytes == 2 * NUM_LAYERS * geo.page_bytes
    assert geo.kv_dtype == str(dtype).removeprefix("torch.")
    cfg = geo.config()
    assert cfg["block_bytes"] == geo.block_bytes and cfg["block_size"] == BLOCK_SIZE
    assert cfg["kv_layout"].startswith("layer-major/kv/nhd;layers=3;")
    other = kv_geometry(make_kv(LAYOUTS[1 - LAYOUTS.index(layout)], dtype, "cpu", fill=False))
    assert other.kv_layout == geo.kv_layout  # slot bytes do not depend on the device layout


def test_geometry_errors():
    with pytest.raises(ValueError, match="5-D"):
        detect_layout((2, 4, 4))
    with pytest.raises(ValueError, match="ambiguous"):
        detect_layout((2, 2, 4, 2, 8))
    assert kv_geometry([torch.zeros(2, 2, 4, 2, 8)], layout="blocks_first").num_blocks == 2
    with pytest.raises(ValueError, match="neither"):
        detect_layout((3, 4, 4, 2, 8))
    with pytest.raises(ValueError, match="empty"):
        kv_geometry([])
    with pytest.raises(ValueError, match="layer 1"):
        kv_geometry([torch.zeros(2, 4, 4, 2, 8), torch.zeros(2, 5, 4, 2, 8)])
    with pytest.raises(ValueError, match="does not fit"):
        kv_geometry([torch.zeros(2, 4, 4, 2, 8)], layout="blocks_first")
    kv = make_kv("kv_first", torch.float16, "cpu", fill=False)
    wrong = CPUPrimaryTier(4, 1000, LRUCachePolicy(4))
    with pytest.raises(ValueError, match="block_bytes="):
        TransferHandler(kv, wrong)


def test_non_contiguous_page_rejected():
    t = torch.zeros(2, 4, 8, 4, 2).transpose(2, 3)  # heads before tokens: pages not contiguous
    with pytest.raises(RuntimeError):
        TransferHandler([t], primary_for([t], 2))


# -- round trips ----------------------------------------------------------------
STORE_CASES = {
    "contiguous": ([2, 3, 4, 5, 6], [0, 1, 2, 3, 4]),
    "odd-scattered": ([12, 0, 7, 3, 9, 1, 5], [6, 2, 0, 4, 1, 5, 3]),
    "mixed-runs": ([1, 2, 3, 8, 9, 11, 4], [0, 1, 2, 5, 6, 8, 3]),
    "single": ([7], [8]),
    "long-run": ([2, 3, 4, 5, 6, 7, 8, 9, 10], [0, 1, 2, 3, 4, 5, 6, 7, 8]),  # >= 8: one torch copy per layer
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("staged", [False, True], ids=["direct", "staged"])
@pytest.mark.parametrize("case", list(STORE_CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_round_trip_byte_exact(layout, dtype, case, staged, device):
    if device == "cuda" and not staged:
        pytest.skip("CUDA always stages")
    blocks, slots = STORE_CASES[case]
    kv = make_kv(layout, dtype, device)
    primary = primary_for(kv, 9)
    handler = TransferHandler(kv, primary, staged=staged, staging_bytes=3 * kv_geometry(kv).block_bytes)
    handler.submit_store(41, blocks, slots)
    assert drain(handler) == [JobResult(41, True)]
    for b, s in zip(blocks, slots):
        assert slot_bytes(primary, s) == expected_slot(kv, layout, b)
    # load into a fresh cache of the other layout: the slot bytes are layout-free
    other = LAYOUTS[1 - LAYOUTS.index(layout)]
    fresh = make_kv(other, dtype, device, fill=False)
    loader = TransferHandler(fresh, primary, staged=staged, staging_bytes=2 * kv_geometry(kv).block_bytes)
    targets = [NUM_BLOCKS - 1 - i for i in range(len(blocks))]
    loader.submit_load(42, slots, targets)
    assert drain(loader) == [JobResult(42, True)]
    for b, t in zip(blocks, targets):
        assert expected_slot(fresh, other, t) == expected_slot(kv, layout, b)
    untouched = set(range(NUM_BLOCKS)) - set(targets)
    zero = bytes(kv_geometry(kv).block_bytes)
    assert all(expected_slot(fresh, other, u) == zero for u in untouched)
    assert handler.bytes_stored == loader.bytes_loaded == len(blocks) * kv_geometry(kv).block_bytes


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_scattered_gather_path(layout, device):
    """More runs than the slice limit: the staged path gathers with index_select / index_copy_."""
    kv = make_kv(layout, torch.bfloat16, device, num_blocks=31)
    primary = primary_for(kv, 20)
    blocks = [30, 1, 17, 4, 22, 9, 0, 13, 26, 6, 19]
    slots = [3, 5, 7, 9, 11, 13, 15, 17, 19, 0, 1]
    handler = TransferHandler(kv, primary, staged=True, staging_bytes=4 * kv_geometry(kv).block_bytes)
    handler.submit_store(1, blocks, slots)
    handler.submit_store(2, [2, 3], [2, 4])
    assert drain(handler) == [JobResult(1, True), JobResult(2, True)]
    for b, s in zip([*blocks, 2, 3], [*slots, 2, 4]):
        assert slot_bytes(primary, s) == expected_slot(kv, layout, b)
    fresh = make_kv(layout, torch.bfloat16, device, fill=False, num_blocks=31)
    loader = TransferHandler(fresh, primary, staged=True, staging_bytes=4 * kv_geometry(kv).block_bytes)
    loader.submit_load(3, slots, blocks)
    assert drain(loader) == [JobResult(3, True)]
    for b in blocks:
        assert expected_slot(fresh, layout, b) == expected_slot(kv, layout, b)


def test_non_contiguous_block_stride():
    """A per-layer view of a cross-layer allocation (block stride spans all layers) works."""
    base = torch.randn(NUM_BLOCKS, NUM_LAYERS, 2, BLOCK_SIZE, HEADS, HEAD)
    kv = [base[:, layer] for layer in range(NUM_LAYERS)]
    assert not kv[0].is_contiguous()
    primary = primary_for(kv, 4)
    handler = TransferHandler(kv, primary)
    handler.submit_store(0, [3, 4, 9], [0, 1, 3])
    drain(handler)
    for b, s in zip([3, 4, 9], [0, 1, 3]):
        assert slot_bytes(primary, s) == expected_slot(kv, "blocks_first", b)


def test_job_reporting_and_validation():
    kv = make_kv("kv_first", torch.float32, "cpu")
    primary = primary_for(kv, 5)
    handler = TransferHandler(kv, primary)
    assert handler.get_finished() == [] and not handler.has_pending_work()
    handler.submit_store(7, [1, 2], [0, 1])
    with pytest.raises(ValueError, match="already in flight"):
        handler.submit_store(7, [3], [2])
    handler.submit_load(8, [0, 1], [5, 6])
    assert handler.has_pending_work()
    assert handler.get_finished() == [JobResult(7, True), JobResult(8, True)]
    assert handler.get_finished() == [] and not handler.has_pending_work()
    for blocks, slots, msg in (
        ([1, 2], [0], "2 device blocks but 1 slots"),
        ([NUM_BLOCKS], [0], "outside"),
        ([0], [5], "outside"),
        ([-1], [0], "outside"),
        ([1, 1], [0, 1], "repeated device block"),
        ([1, 2], [3, 3], "repeated slot"),
    ):
        with pytest.raises(ValueError, match=msg):
            handler.submit_store(9, blocks, slots)
    handler.submit_store(9, [], [])  # an empty job is still reported
    assert handler.get_finished() == [JobResult(9, True)]


def test_copy_failure_is_reported(monkeypatch):
    kv = make_kv("blocks_first", torch.float16, "cpu")
    handler = TransferHandler(kv, primary_for(kv, 3))

    def boom(*args, **kwargs):
        raise RuntimeError("copy failed")

    monkeypatch.setattr(handler, "_copy_direct", boom)
    handler.submit_store(1, [0], [0])
    assert handler.get_finished() == [JobResult(1, False)]
    assert handler.bytes_stored == 0


# -- host buffer ----------------------------------------------------------------
def test_host_buffer():
    buf = allocate_host_buffer(3, 64)
    assert buf.tensor.numel() == 192 and buf.tensor.dtype == torch.uint8
    assert buf.view.nbytes == 192 and not buf.view.readonly and buf.view.format == "B"
    assert buf.pinned == torch.cuda.is_available()
    buf.view[5] = 9
    assert int(buf.tensor[5]) == 9
    primary = CPUPrimaryTier(3, 64, LRUCachePolicy(3), buffer=buf.view)
    primary.kv_view[2:3].cast("B")[0] = 4
    assert int(buf.tensor[128]) == 4
    view = buf.view
    del buf, primary
    view[0] = 1  # the view keeps the tensor's memory alive
    with pytest.raises(ValueError):
        allocate_host_buffer(0, 64)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only torch behaviour")
def test_pinning_without_cuda_raises():
    with pytest.raises(RuntimeError):
        allocate_host_buffer(1, 64, pin_memory=True)


# -- driver with the manager --------------------------------------------------------
class HeldTier(SecondaryTierManager):
    """A dict tier that finishes jobs only when released, to watch pins mid-flight."""

    def __init__(self, spec, view, tier_type="held"):
        super().__init__(spec, view, tier_type)
        self.blocks: dict[OffloadKey, bytes] = {}
        self.held: list[JobMetadata] = []
        self.done: list[JobResult] = []
        self.release = True

    def lookup(self, key, req_context):
        return key in self.blocks

    def submit_store(self, job):
        self.held.append(job)

    def submit_load(self, job):
        self.held.append(job)

    def _run(self) -> None:
        for job in self.held:
            for key, slot in zip(job.keys, job.block_ids):
                if job.is_promotion:
                    block_view(self.primary_kv_view, slot)[:] = self.blocks[key]
                else:
                    self.blocks[key] = block_view(self.primary_kv_view, slot).tobytes()
            self.done.append(JobResult(job.job_id, True))
        self.held = []

    def get_finished(self) -> Iterable[JobResult]:
        if self.release:
            self._run()
        done, self.done = self.done, []
        return done


class HeldHandler(TransferHandler):
    """Reports copies only when released."""

    release = True

    def get_finished(self):
        return super().get_finished() if self.release else []


def make_stack(kv, num_slots, handler_cls=TransferHandler):
    geo = kv_geometry(kv)
    spec = TieringOffloadingSpec({"cpu_bytes_to_use": num_slots * geo.block_bytes, **geo.config()})
    buf = allocate_host_buffer(num_slots, geo.block_bytes)
    primary = spec.create_primary(buf.view)
    tier = HeldTier(spec, primary.kv_view)
    manager = TieringManager(primary, [tier])
    handler = handler_cls(kv, primary, host_buffer=buf.tensor)
    return manager, tier, handler, OffloadingDriver(manager, handler)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_driver_pins_held_until_both_hops_done(layout, device):
    kv = make_kv(layout, torch.float16, device)
    manager, tier, handler, driver = make_stack(kv, 6, HeldHandler)
    keys = block_keys(list(range(5 * BLOCK_SIZE)), BLOCK_SIZE)
    blocks = [4, 9, 2, 11, 0]
    ctx = ReqContext("r1")

    # store, hop 1 (device -> primary): slots pinned and not readable
    handler.release = False
    tier.release = False
    assert driver.store(keys, blocks, ctx) == keys
    handler.synchronize()
    assert driver.poll().stores == []
    assert all(manager.primary.pins(k) == 1 and not manager.primary.lookup(k) for k in keys)
    # hop 2 (primary -> secondary): readable, still pinned by the cascade
    handler.release = True
    done = driver.poll()
    assert [s.keys for s in done.stores] == [keys] and done.stores[0].success
    assert all(manager.primary.pins(k) == 1 and manager.primary.lookup(k) for k in keys)
    other = manager.prepare_store(block_keys(list(range(100, 100 + 6 * BLOCK_SIZE)), BLOCK_SIZE), ctx)
    assert len(other.keys) == 1 and len(other.rejected) == 5  # one free slot; the pinned ones are not evicted
    manager.complete_store(other.keys, ctx, success=False)
    tier.release = True
    driver.wait(timeout=10)
    assert all(manager.primary.pins(k) == 0 for k in keys)
    assert set(tier.blocks) == set(keys)
    for k, b in zip(keys, blocks):
        assert tier.blocks[k] == expected_slot(kv, layout, b)

    # evict the primary copies: fill it with other blocks
    filler = block_keys(list(range(1000, 1000 + 6 * BLOCK_SIZE)), BLOCK_SIZE)
    assert driver.store(filler, list(range(6)), ReqContext("filler")) == filler
    driver.wait(timeout=10)
    assert not any(manager.primary.lookup(k) for k in keys)

    # load, hop 1 (secondary -> primary) then hop 2 (primary -> device)
    fresh = make_kv(layout, torch.float16, device, fill=False)
    handler2 = HeldHandler(fresh, manager.primary)
    driver2 = OffloadingDriver(manager, handler2)
    ctx2 = ReqContext("r2")
    assert manager.lookup(keys, ctx2) == 5
    targets = [12, 1, 3, 5, 7]
    tier.release = False
    driver2.load(keys, targets, ctx2)
    assert driver2.poll().loads == []
    assert all(manager.primary.pins(k) == 1 for k in keys)  # promotion slots, not ready
    handler2.release = False
    tier.release = True
    assert driver2.poll().loads == []  # promoted; host -> device copy not reported yet
    assert all(manager.primary.pins(k) == 1 and manager.primary.lookup(k) for k in keys)
    handler2.synchronize()
    assert driver2.poll().loads == []
    assert all(manager.primary.pins(k) == 1 for k in keys)
    handler2.release = True
    loads = driver2.poll().loads
    assert len(loads) == 1
    assert loads[0].keys == keys and loads[0].block_ids == targets
    assert loads[0].sources == [0] * 5 and loads[0].requested == 5
    assert all(manager.primary.pins(k) == 0 for k in keys)
    for b, t in zip(blocks, targets):
        assert expected_slot(fresh, layout, t) == expected_slot(kv, layout, b)
    assert not driver.has_pending_work() and not driver2.has_pending_work()


def test_driver_primary_hit_and_partial_load():
    kv = make_kv("kv_first", torch.float32, "cpu")
    manager, _, _, driver = make_stack(kv, 8)
    keys = block_keys(list(range(4 * BLOCK_SIZE)), BLOCK_SIZE)
    driver.store(keys[:3], [0, 1, 2], ReqContext("a"))
    driver.wait(timeout=10)
    ctx = ReqContext("b")
    assert manager.lookup(keys, ctx) == 3
    driver.load(keys, [5, 6, 7, 8], ctx)  # the 4th key is a miss: loads stop there
    with pytest.raises(ValueError, match="already has a load"):
        driver.load(keys, [5, 6, 7, 8], ctx)
    loads = driver.wait(timeout=10).loads
    assert [(d.keys, d.block_ids, d.sources, d.requested) for d in loads] == [(keys[:3], [5, 6, 7], [-1, -1, -1], 4)]
    assert all(manager.primary.pins(k) == 0 for k in keys[:3])
    for b, t in zip([0, 1, 2], [5, 6, 7]):
        assert expected_slot(kv, "kv_first", t) == expected_slot(kv, "kv_first", b)
    # nothing found: an empty LoadDone, no copy
    other = block_keys(list(range(500, 500 + BLOCK_SIZE)), BLOCK_SIZE)
    driver.load(other, [9], ReqContext("c"))
    assert [(d.keys, d.requested) for d in driver.wait(timeout=10).loads] == [([], 1)]
    # keys already present are not copied again
    assert driver.store(keys[:3], [0, 1, 2], ReqContext("d")) == []


def test_driver_store_failure_frees_slots(monkeypatch):
    kv = make_kv("blocks_first", torch.float32, "cpu")
    manager, tier, handler, driver = make_stack(kv, 4)

    def boom(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(handler, "_copy_direct", boom)
    keys = block_keys(list(range(2 * BLOCK_SIZE)), BLOCK_SIZE)
    driver.store(keys, [0, 1], ReqContext("a"))
    assert manager.primary.num_resident == 2
    done = driver.wait(timeout=10)
    assert [(s.keys, s.success) for s in done.stores] == [(keys, False)]
    assert manager.primary.num_resident == 0 and not tier.blocks
    with pytest.raises(ValueError, match="outside"):
        driver.store(keys, [0, NUM_BLOCKS], ReqContext("b"))
    assert manager.primary.num_resident == 0  # the rejected store released its slots


def test_create_handlers_from_spec():
    kv = make_kv("kv_first", torch.bfloat16, "cpu")
    geo = kv_geometry(kv)
    spec = TieringOffloadingSpec(
        {"cpu_bytes_to_use": 4 * geo.block_bytes, **geo.config(), "secondary_tiers": [{"type": "example"}]}
    )
    assert spec.namespace.kv_layout == geo.kv_layout and spec.namespace.kv_dtype == "bfloat16"
    manager = spec.get_manager(allocate_host_buffer(4, geo.block_bytes).view)
    handler = spec.create_handlers(kv, manager)
    assert isinstance(handler, TransferHandler)
    driver = OffloadingDriver(manager, handler)
    keys = block_keys(list(range(2 * BLOCK_SIZE)), BLOCK_SIZE)
    driver.store(keys, [3, 8], ReqContext("a"))
    driver.wait(timeout=10)
    assert manager.secondary_tiers[0].stats()["resident_blocks"] == 2
