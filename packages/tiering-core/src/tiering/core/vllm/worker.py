"""A vLLM ``OffloadingWorker`` for vLLM's CPU platform: the engine's KV cache <-> the primary tier, by CPU copies.

vLLM's own worker (``CPUOffloadingWorker``) needs a CUDA/XPU device: a CUDA
copy kernel, CUDA events for completion and device tensors. On vLLM's CPU
platform the engine's KV cache is itself in host memory, so a transfer is a
set of plain memory copies between two host buffers, finished when the call
returns. :class:`CPUOffloadingWorker` does exactly that, with vLLM's byte
layout of the primary tier (so vLLM's scheduler side, its CPU primary tier
and every secondary tier see the same rows as on a GPU host):

- engine side: vLLM's canonical KV tensors, each an int8 view of shape
  ``(num_blocks, page_bytes)`` (``CanonicalKVCaches.tensors``);
- host side: per tensor, this worker's strided view of the shared
  /dev/shm region (``SharedOffloadRegion.create_next_worker_view``): shape
  ``(num_chunks, blocks_per_chunk * page_bytes)``, rows ``row_stride`` apart.
  Sub-block ``j`` of chunk ``c`` is bytes ``[j * page_bytes, (j + 1) *
  page_bytes)`` of row ``c``, as vLLM's GPU worker lays it out.

The (host sub-block, engine block) pairs of a job are grouped into runs that
are consecutive on both sides with tiering's copy planner
(:func:`tiering.core.transfer.plan_copies`); each run moves with one strided
``copy_`` per KV tensor. The direct layout only: vLLM's canonical layout
(``canonical_layout``) is refused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tiering.core.transfer import plan_copies
from tiering.core.vllm.compat import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    SharedOffloadRegion,
    TransferResult,
)

logger = logging.getLogger(__name__)


class CPUOffloadingWorker(OffloadingWorker):  # type: ignore[misc]
    """vLLM's worker interface for its CPU platform: synchronous CPU copies, completion reported on the next poll.

    Args:
        kv_caches: the engine's KV caches as vLLM canonicalizes them (CPU tensors).
        blocks_per_chunk: engine blocks per primary-tier chunk (row).
        mmap_region: this worker's handle on the shared primary region; the
            worker owns it from now on and cleans it up in :meth:`shutdown`.

    Raises:
        ValueError: a KV tensor is not on the CPU, or a group references a
            page larger than its tensor's page.
    """

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, mmap_region: SharedOffloadRegion) -> None:
        self._region: SharedOffloadRegion | None = mmap_region
        self.blocks_per_chunk = int(blocks_per_chunk)
        self._engine: list[torch.Tensor] = []
        self._host: list[torch.Tensor] = []
        for t_idx, kv in enumerate(kv_caches.tensors):
            if kv.tensor.device.type != "cpu":
                raise ValueError(
                    f"KV cache tensor {t_idx} is on {kv.tensor.device}; this worker copies CPU tensors only"
                )
            page = int(kv.page_size_bytes)
            self._engine.append(kv.tensor.view(torch.int8).view(-1, page))
            host = mmap_region.create_next_worker_view(page * self.blocks_per_chunk)
            self._host.append(host.unflatten(1, (self.blocks_per_chunk, page)))
        # Per KV-cache group: (tensor index, bytes to copy per block), one entry per tensor.
        self._group_pages: list[list[tuple[int, int]]] = []
        for g_idx, refs in enumerate(kv_caches.group_data_refs):
            pages: dict[int, int] = {}
            for ref in refs:
                limit = int(self._engine[ref.tensor_idx].shape[1])
                if ref.page_size_bytes > limit:
                    raise ValueError(
                        f"group {g_idx}: a layer's page of {ref.page_size_bytes} bytes exceeds "
                        f"tensor {ref.tensor_idx}'s page of {limit} bytes"
                    )
                pages[ref.tensor_idx] = max(pages.get(ref.tensor_idx, 0), int(ref.page_size_bytes))
            self._group_pages.append(sorted(pages.items()))
        self._finished: list[TransferResult] = []
        self.bytes_stored = 0
        self.bytes_loaded = 0

    # -- vLLM OffloadingWorker ---------------------------------------------------
    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        """Copy engine blocks ``src_spec`` into primary chunks ``dst_spec`` now; reported by :meth:`get_finished`."""
        nbytes, seconds = self._transfer(src_spec, dst_spec, store=True)
        self.bytes_stored += nbytes
        self._finished.append(TransferResult(job_id, True, transfer_size=nbytes, transfer_time=seconds))
        return True

    def submit_load(
        self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec, expedited: bool = False
    ) -> bool:
        """Copy primary chunks ``src_spec`` into engine blocks ``dst_spec`` now (``expedited``: 0.33, no effect)."""
        nbytes, seconds = self._transfer(dst_spec, src_spec, store=False)
        self.bytes_loaded += nbytes
        self._finished.append(TransferResult(job_id, True, transfer_size=nbytes, transfer_time=seconds))
        return True

    def get_finished(self) -> list[TransferResult]:
        """The jobs submitted since the last call, each exactly once, in submission order."""
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        """Nothing to wait for: every submitted copy has finished when ``submit_*`` returns."""

    def shutdown(self) -> None:
        """Drop the tensors and release this worker's mapping of the primary region (once)."""
        self._engine.clear()
        self._host.clear()
        region, self._region = self._region, None
        if region is not None:
            region.cleanup()

    # -- copies ----------------------------------------------------------------------
    def _transfer(self, engine_spec: Any, host_spec: Any, *, store: bool) -> tuple[int, float]:
        """Copy every group of a job; returns (bytes copied, seconds).

        ``engine_spec`` is vLLM's ``GPULoadStoreSpec`` (engine block ids,
        ``group_sizes``, ``block_indices``: the logical block index of each
        group's first block); ``host_spec`` holds the primary chunk ids. A
        group's first chunk may start mid-chunk (``block_index %
        blocks_per_chunk`` sub-blocks skipped), as in vLLM's GPU worker.

        Raises:
            ValueError: the specs' block counts do not match each other.
        """
        started = time.perf_counter()
        engine_blocks = np.asarray(engine_spec.block_ids, dtype=np.int64)
        chunks = np.asarray(host_spec.block_ids, dtype=np.int64)
        group_sizes: Sequence[int] = engine_spec.group_sizes
        block_indices: Sequence[int] = engine_spec.block_indices
        if len(group_sizes) != len(self._group_pages):
            raise ValueError(f"job has {len(group_sizes)} KV-cache groups, the engine has {len(self._group_pages)}")
        bpc = self.blocks_per_chunk
        e_off = h_off = nbytes = 0
        for g_idx, (size, index) in enumerate(zip(group_sizes, block_indices, strict=True)):
            if size == 0:
                continue
            skip = int(index) % bpc
            n_chunks = -(-(int(size) + skip) // bpc)
            group_chunks = chunks[h_off : h_off + n_chunks]
            group_blocks = engine_blocks[e_off : e_off + size]
            if len(group_chunks) != n_chunks or len(group_blocks) != size:
                raise ValueError(
                    f"group {g_idx}: {size} blocks from index {index} need {n_chunks} chunks; "
                    f"the job has {len(group_chunks)} chunks and {len(group_blocks)} blocks left"
                )
            subs = (group_chunks[:, None] * bpc + np.arange(bpc)).ravel()[skip : skip + size]
            plan = plan_copies(subs.tolist(), group_blocks.tolist())
            for _, sub, block, length in plan.runs:
                nbytes += self._copy_run(g_idx, sub, block, length, store)
            e_off += size
            h_off += n_chunks
        if e_off != len(engine_blocks) or h_off != len(chunks):
            raise ValueError(
                f"job covers {e_off} of {len(engine_blocks)} engine blocks and {h_off} of {len(chunks)} chunks"
            )
        return nbytes, time.perf_counter() - started

    def _copy_run(self, g_idx: int, sub: int, block: int, length: int, store: bool) -> int:
        """Copy ``length`` blocks: host sub-blocks from ``sub`` <-> engine blocks from ``block``; returns bytes."""
        bpc, nbytes = self.blocks_per_chunk, 0
        while length:
            chunk, j = divmod(sub, bpc)
            n = min(length, bpc - j)  # a run of host sub-blocks is contiguous only within one chunk
            for t_idx, page in self._group_pages[g_idx]:
                host = self._host[t_idx][chunk, j : j + n, :page]
                engine = self._engine[t_idx][block : block + n, :page]
                if store:
                    host.copy_(engine)
                else:
                    engine.copy_(host)
                nbytes += n * page
            sub, block, length = sub + n, block + n, length - n
        return nbytes
