"""The transfer handler: copies KV blocks between a device KV cache (torch tensors) and the primary's host buffer.

Needs torch (the ``torch`` extra). Which blocks move in which runs is decided
by :mod:`tiering.core.transfer.plan` (torch-free); this module only issues the
copies.

On CUDA the copies of a job run on a dedicated stream that first waits for
the engine's current stream: device blocks are gathered into a device
staging buffer laid out as slots (one strided copy per run of contiguous
blocks and layer, or one gather per layer when the blocks are scattered),
then each run of contiguous slots moves in one ``cudaMemcpyAsync``
(loads: the reverse). An event per job is polled by :meth:`TransferHandler.get_finished`
without blocking. The host buffer should be pinned
(:func:`~tiering.core.transfer.allocate_host_buffer`). Without CUDA the same
API copies synchronously (one strided copy per run of contiguous blocks/slots
and layer) and the next :meth:`TransferHandler.get_finished` reports the job.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

from tiering.core.base import JobResult
from tiering.core.primary import CPUPrimaryTier
from tiering.core.transfer._torch import torch
from tiering.core.transfer.geometry import byte_pages, kv_geometry
from tiering.core.transfer.host import host_tensor
from tiering.core.transfer.layout import KVLayout
from tiering.core.transfer.plan import (
    DEFAULT_STAGING_BYTES,
    MIN_STRIDED_RUN,
    CopyPlan,
    check_job,
    plan_copies,
    staging_blocks,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _Pending:
    job_id: int
    event: Any  # torch.cuda.Event, or None for a synchronous copy
    success: bool


class TransferHandler:
    """Copies blocks between a device KV cache and the primary tier's host buffer.

    Jobs are submitted with :meth:`submit_store` / :meth:`submit_load`, which
    return at once, and reported exactly once, in submission order, by
    :meth:`get_finished` as :class:`~tiering.core.base.JobResult`. The caller
    keeps the slots pinned until then (:class:`OffloadingDriver` does).

    Args:
        kv_caches: per-layer device KV tensors (layouts in
            :mod:`tiering.core.transfer.layout`, dtypes in :mod:`tiering.core.transfer.geometry`).
        primary: the primary tier whose host buffer (``primary.kv_view``) the
            blocks move to and from; its ``block_bytes`` must equal
            :attr:`KVCacheGeometry.block_bytes`.
        layout: the device layout; detected from the shape when None.
        host_buffer: the host buffer as a tensor (e.g. :attr:`HostBuffer.tensor`);
            derived from ``primary.kv_view`` without copying when None.
        staging_bytes: size of the device staging buffer in bytes (rounded
            down to whole blocks, at least one block); bigger jobs are copied
            in chunks of that size.
        staged: CPU only: copy through a staging buffer as the CUDA path
            always does (synchronously; tests use it to check the CUDA path's
            gather/scatter logic). Ignored on CUDA.

    Raises:
        ValueError: bad KV tensors, or ``block_bytes`` / buffer size mismatch.
    """

    def __init__(
        self,
        kv_caches: Sequence[torch.Tensor],
        primary: CPUPrimaryTier,
        layout: KVLayout | None = None,
        host_buffer: torch.Tensor | None = None,
        staging_bytes: int = DEFAULT_STAGING_BYTES,
        staged: bool | None = None,
    ) -> None:
        self.geometry = kv_geometry(kv_caches, layout)
        geo = self.geometry
        if primary.block_bytes != geo.block_bytes:
            raise ValueError(
                f"primary tier slots are {primary.block_bytes} bytes but one KV block is {geo.block_bytes} bytes "
                f"(2 x {geo.num_layers} layers x {geo.page_bytes}-byte pages); set block_bytes={geo.block_bytes}"
            )
        host = host_tensor(primary.kv_view) if host_buffer is None else host_buffer
        if host.dtype != torch.uint8 or host.dim() != 1 or host.numel() != primary.num_blocks * geo.block_bytes:
            raise ValueError(
                f"host buffer must be a 1-D uint8 tensor of {primary.num_blocks * geo.block_bytes} bytes, "
                f"got {host.dtype} {tuple(host.shape)}"
            )
        self.num_slots = primary.num_blocks
        self._host = host
        self._host_slots = host.view(self.num_slots, geo.num_layers, 2, geo.page_bytes)
        self._pages = [byte_pages(t, geo.layout) for t in kv_caches]
        # byte addresses and strides of each layer's pages (the tensors are kept alive by self._pages)
        self._page_ptrs = [(p.data_ptr(), p.stride(0), p.stride(1)) for p in self._pages]
        self.device = kv_caches[0].device
        self.is_cuda = self.device.type == "cuda"
        self.staged = self.is_cuda or bool(staged)
        self._pending: deque[_Pending] = deque()
        self._in_flight: set[int] = set()
        self.bytes_stored = 0
        self.bytes_loaded = 0
        self._stream: Any = None
        self._staging: torch.Tensor | None = None
        self._staging_blocks = staging_blocks(staging_bytes, geo.block_bytes)
        if self.is_cuda:
            stream_cls: Any = torch.cuda.Stream  # untyped in torch's stubs
            self._stream = stream_cls(device=self.device)
            if not host.is_pinned():
                logger.warning("host buffer is not pinned: device<->host copies will not be asynchronous")

    # -- API ----------------------------------------------------------------
    def submit_store(self, job_id: int, block_ids: Sequence[int], slot_ids: Sequence[int]) -> None:
        """Start copying device blocks ``block_ids[i]`` into host slots ``slot_ids[i]``; return at once.

        Args:
            job_id: the caller's id, reported back by :meth:`get_finished`;
                must not be in flight.
            block_ids: device block indices (``[0, num_blocks)``, no repeats).
            slot_ids: primary slots (``[0, num_slots)``, no repeats), one per block.

        Raises:
            ValueError: bad ids or lengths, or ``job_id`` already in flight.
        """
        self._submit(job_id, block_ids, slot_ids, store=True)

    def submit_load(self, job_id: int, slot_ids: Sequence[int], block_ids: Sequence[int]) -> None:
        """Start copying host slots ``slot_ids[i]`` into device blocks ``block_ids[i]``; return at once.

        The engine must not read the device blocks before :meth:`get_finished`
        reports the job.

        Raises:
            ValueError: as :meth:`submit_store`.
        """
        self._submit(job_id, block_ids, slot_ids, store=False)

    def get_finished(self) -> list[JobResult]:
        """The jobs finished since the last call, in submission order, each exactly once; never blocks."""
        out: list[JobResult] = []
        while self._pending:
            pending = self._pending[0]
            if pending.event is not None and not pending.event.query():
                break
            self._pending.popleft()
            self._in_flight.discard(pending.job_id)
            out.append(JobResult(pending.job_id, pending.success))
        return out

    def has_pending_work(self) -> bool:
        """Whether a submitted job has not been reported yet."""
        return bool(self._pending)

    def synchronize(self) -> None:
        """Block until every submitted copy has finished (they are still reported by :meth:`get_finished`)."""
        if self._stream is not None:
            self._stream.synchronize()

    def shutdown(self) -> None:
        """Wait for copies in flight; later :meth:`get_finished` calls still report them."""
        self.synchronize()

    # -- internals ----------------------------------------------------------
    def _submit(self, job_id: int, block_ids: Sequence[int], slot_ids: Sequence[int], store: bool) -> None:
        check_job(job_id, block_ids, slot_ids, self.geometry.num_blocks, self.num_slots, self._in_flight)
        plan = plan_copies(slot_ids, block_ids)
        nbytes = len(slot_ids) * self.geometry.block_bytes
        event = None
        success = True
        try:
            if self.is_cuda:
                event = self._copy_cuda(plan, store)
            elif self.staged:
                self._copy_staged(plan, store)
            else:
                self._copy_direct(plan, store)
        except Exception:
            logger.exception(
                "transfer job %d (%s, %d blocks) failed", job_id, "store" if store else "load", len(slot_ids)
            )
            success, event = False, None
        if success:
            if store:
                self.bytes_stored += nbytes
            else:
                self.bytes_loaded += nbytes
        self._in_flight.add(job_id)
        self._pending.append(_Pending(job_id, event, success))

    def _copy_direct(self, plan: CopyPlan, store: bool) -> None:
        """Copy straight between host-resident KV tensors and the host buffer.

        A run of at least :data:`~tiering.core.transfer.plan.MIN_STRIDED_RUN` blocks moves per layer in one
        strided ``copy_``; shorter runs move with ``memmove`` per contiguous
        segment (one per block and layer when K and V are adjacent), which
        costs about a tenth of a torch op's dispatch.
        """
        geo = self.geometry
        pb, bb = geo.page_bytes, geo.block_bytes
        host_base = self._host.data_ptr()
        memmove = ctypes.memmove
        for _, slot, block, n in plan.runs:
            if n >= MIN_STRIDED_RUN:
                host = self._host_slots[slot : slot + n]
                for layer, pages in enumerate(self._pages):
                    if store:
                        host[:, layer].copy_(pages[block : block + n])
                    else:
                        pages[block : block + n].copy_(host[:, layer])
                continue
            for j in range(n):
                slot_addr = host_base + (slot + j) * bb
                for layer, (base, block_stride, kv_stride) in enumerate(self._page_ptrs):
                    dev = base + (block + j) * block_stride
                    host_addr = slot_addr + 2 * layer * pb
                    if kv_stride == pb:  # K and V pages adjacent on the device too
                        memmove(host_addr, dev, 2 * pb) if store else memmove(dev, host_addr, 2 * pb)
                    elif store:
                        memmove(host_addr, dev, pb)
                        memmove(host_addr + pb, dev + kv_stride, pb)
                    else:
                        memmove(dev, host_addr, pb)
                        memmove(dev + kv_stride, host_addr + pb, pb)

    def _copy_cuda(self, plan: CopyPlan, store: bool) -> Any:
        """Issue the copies of a job on the transfer stream; return the event marking their end."""
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._copy_staged(plan, store)
            event_cls: Any = torch.cuda.Event
            event = event_cls()
            event.record(stream)
        return event

    def _copy_staged(self, plan: CopyPlan, store: bool) -> None:
        """Copy through the device staging buffer, in chunks of at most ``staging_blocks`` blocks.

        On CUDA this runs on the transfer stream, whose order makes reusing
        the one staging buffer for every chunk and job safe.
        """
        if self._staging is None:
            self._staging = torch.empty(
                self._staging_blocks * self.geometry.block_bytes, dtype=torch.uint8, device=self.device
            )
        for chunk in plan.split(self._staging_blocks):
            self._copy_chunk_staged(chunk, store)

    def _copy_chunk_staged(self, plan: CopyPlan, store: bool) -> None:
        geo = self.geometry
        assert self._staging is not None
        n = len(plan.slots)
        flat = self._staging[: n * geo.block_bytes]
        staged = flat.view(n, geo.num_layers, 2, geo.page_bytes)
        bb = geo.block_bytes
        gather = plan.scattered
        index = torch.tensor(plan.blocks, dtype=torch.long).to(self.device, non_blocking=True) if gather else None
        if not store:
            for i, slot, length in plan.slot_runs:
                flat[i * bb : (i + length) * bb].copy_(self._host[slot * bb : (slot + length) * bb], non_blocking=True)
        for layer, pages in enumerate(self._pages):
            if index is not None:
                if store:
                    staged[:, layer].copy_(pages.index_select(0, index))
                else:
                    pages.index_copy_(0, index, staged[:, layer])
            else:
                for i, _, block, length in plan.runs:
                    if store:
                        staged[i : i + length, layer].copy_(pages[block : block + length])
                    else:
                        pages[block : block + length].copy_(staged[i : i + length, layer])
        if store:
            for i, slot, length in plan.slot_runs:
                self._host[slot * bb : (slot + length) * bb].copy_(flat[i * bb : (i + length) * bb], non_blocking=True)


__all__ = ["TransferHandler"]
