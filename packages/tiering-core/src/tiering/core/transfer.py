"""The transfer path: KV blocks between an engine's device KV cache and the primary tier's host buffer.

Needs the ``torch`` extra (``pip install 'tiering-core[torch]'``); importing
this module without torch raises ImportError saying so, while
``import tiering.core`` never needs torch.

Device KV cache
    A list of per-layer tensors (one per attention layer, same shape and
    dtype), in one of the two common paged layouts:

    - ``"kv_first"``: ``[2, num_blocks, block_size, num_kv_heads, head_size]``
      (vLLM's FlashAttention layout);
    - ``"blocks_first"``: ``[num_blocks, 2, block_size, num_kv_heads, head_size]``
      (vLLM's FlashInfer layout).

    Any dtype (float32, float16, bfloat16, float8_*...): blocks are moved as
    bytes through ``tensor.view(torch.uint8)``. Each ``[block_size,
    num_kv_heads, head_size]`` page must be contiguous; the block and K/V
    strides are free.

Slot layout (:data:`SLOT_LAYOUT`, ``kv_layout`` of the namespace)
    One primary slot holds one block for all layers, contiguous, so a
    secondary tier does one I/O per block. With ``page_bytes = block_size *
    num_kv_heads * head_size * itemsize`` the slot is layer-major, K then V,
    each page in the device's ``[block_size, num_kv_heads, head_size]``
    (token, head, dim) order::

        offset(layer, kv) = (2 * layer + kv) * page_bytes      # kv: 0 = K, 1 = V
        block_bytes       = 2 * num_layers * page_bytes

    The slot bytes do not depend on the device layout: a block stored from a
    ``kv_first`` cache loads into a ``blocks_first`` one. The full geometry is
    in :attr:`KVCacheGeometry.kv_layout`.

Copies
    On CUDA the copies of a job run on a dedicated stream that first waits for
    the engine's current stream: device blocks are gathered into a device
    staging buffer laid out as slots (one strided copy per run of contiguous
    blocks and layer, or one gather per layer when the blocks are scattered),
    then each run of contiguous slots moves in one ``cudaMemcpyAsync``
    (loads: the reverse). An event per job is polled by :meth:`TransferHandler.get_finished`
    without blocking. The host buffer should be pinned
    (:func:`allocate_host_buffer`). Without CUDA the same API copies
    synchronously (one strided copy per run of contiguous blocks/slots and
    layer) and the next :meth:`TransferHandler.get_finished` reports the job.

:class:`OffloadingDriver` connects a :class:`TransferHandler` to a
:class:`~tiering.core.manager.TieringManager`: stores go device -> primary ->
secondary tiers, loads secondary -> primary -> device.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Literal

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError("tiering.core.transfer needs torch; install it with: pip install 'tiering-core[torch]'") from exc

from tiering.core.base import JobResult, OffloadKey, ReqContext
from tiering.core.manager import TieringManager
from tiering.core.primary import CPUPrimaryTier

logger = logging.getLogger(__name__)

KVLayout = Literal["kv_first", "blocks_first"]
"""Device KV-cache layouts: ``"kv_first"`` = ``[2, N, bs, H, D]``, ``"blocks_first"`` = ``[N, 2, bs, H, D]``."""

SLOT_LAYOUT = "layer-major/kv/nhd"
"""Name of the slot byte layout (layer-major, K then V, pages in token/head/dim order), version 1."""

DEFAULT_STAGING_BYTES = 64 * 1024 * 1024
"""Default size of the CUDA staging buffer (bytes; rounded down to whole blocks, at least one)."""

_KV_DIM = {"kv_first": 0, "blocks_first": 1}
_BLOCK_DIM = {"kv_first": 1, "blocks_first": 0}
_MAX_SLICE_RUNS = 4
_MIN_TORCH_RUN = 8


# -- host buffer ------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class HostBuffer:
    """A primary-tier host buffer owned by torch.

    Attributes:
        tensor: 1-D ``torch.uint8`` CPU tensor of ``num_blocks * block_bytes`` bytes.
        view: flat writable memoryview (format ``"B"``) over the same memory,
            for ``CPUPrimaryTier(..., buffer=view)``; it keeps ``tensor`` alive.
        pinned: True when the memory is page-locked (CUDA present).
        num_blocks: number of slots.
        block_bytes: bytes per slot.
    """

    tensor: torch.Tensor
    view: memoryview
    pinned: bool
    num_blocks: int
    block_bytes: int


def allocate_host_buffer(num_blocks: int, block_bytes: int, pin_memory: bool | None = None) -> HostBuffer:
    """Allocate the primary tier's host buffer, pinned when CUDA is available, and pre-fault it.

    Args:
        num_blocks: number of slots (> 0).
        block_bytes: bytes per slot (> 0); use :attr:`KVCacheGeometry.block_bytes`.
        pin_memory: force pinning on (True) or off (False); default: pinned
            exactly when ``torch.cuda.is_available()`` (pinning raises
            RuntimeError on CPU-only torch builds).

    Returns:
        A :class:`HostBuffer`; pass ``.view`` as ``CPUPrimaryTier(..., buffer=...)``.

    Raises:
        ValueError: a size is not positive.
        RuntimeError: ``pin_memory=True`` without CUDA.
    """
    if num_blocks <= 0 or block_bytes <= 0:
        raise ValueError(f"host buffer needs num_blocks > 0 and block_bytes > 0, got {num_blocks}, {block_bytes}")
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    size = num_blocks * block_bytes
    tensor = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
    tensor.zero_()  # first touch happens here, once, not on the first store
    array = (ctypes.c_ubyte * size).from_address(tensor.data_ptr())
    array._tiering_owner = tensor  # type: ignore[attr-defined]  # the view keeps the tensor alive
    view = memoryview(array).cast("B")
    return HostBuffer(tensor, view, pin, num_blocks, block_bytes)


def host_tensor(buffer: memoryview) -> torch.Tensor:
    """A 1-D ``torch.uint8`` tensor sharing the memory of a writable byte buffer (no copy).

    Raises:
        ValueError: the buffer is read-only.
    """
    flat = memoryview(buffer).cast("B")
    if flat.readonly:
        raise ValueError("the host buffer must be writable")
    return torch.frombuffer(flat, dtype=torch.uint8)


# -- geometry ---------------------------------------------------------------
def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclasses.dataclass(frozen=True)
class KVCacheGeometry:
    """Shape facts of a paged device KV cache and of the slot it maps to.

    Attributes:
        layout: the device layout (``"kv_first"`` or ``"blocks_first"``).
        num_layers: number of per-layer tensors.
        num_blocks: device blocks per layer.
        block_size: tokens per block.
        num_kv_heads: KV heads per layer.
        head_size: elements per head.
        dtype: the KV dtype.
        page_bytes: bytes of one K (or V) page of one block of one layer.
    """

    layout: KVLayout
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    page_bytes: int

    @property
    def block_bytes(self) -> int:
        """Bytes of one block for all layers: the primary slot size (``2 * num_layers * page_bytes``)."""
        return 2 * self.num_layers * self.page_bytes

    @property
    def kv_dtype(self) -> str:
        """The dtype's name (``"bfloat16"``, ``"float8_e4m3fn"``...), the namespace's ``kv_dtype``."""
        return _dtype_name(self.dtype)

    @property
    def kv_layout(self) -> str:
        """The slot layout with its geometry, for the namespace's ``kv_layout``.

        Example: ``"layer-major/kv/nhd;layers=32;block_size=16;heads=8;head_size=128;dtype=bfloat16"``.
        It names the slot bytes only, so both device layouts give the same string.
        """
        return (
            f"{SLOT_LAYOUT};layers={self.num_layers};block_size={self.block_size};"
            f"heads={self.num_kv_heads};head_size={self.head_size};dtype={self.kv_dtype}"
        )

    def config(self) -> dict[str, Any]:
        """The offloading-config keys this geometry fixes: ``block_size``, ``block_bytes``, ``kv_dtype``, ``kv_layout``.

        Merge them into the JSON given to :class:`~tiering.core.spec.OffloadingSpec`.
        """
        return {
            "block_size": self.block_size,
            "block_bytes": self.block_bytes,
            "kv_dtype": self.kv_dtype,
            "kv_layout": self.kv_layout,
        }


def detect_layout(shape: Sequence[int]) -> KVLayout:
    """Guess the layout of a 5-D per-layer KV tensor shape.

    Raises:
        ValueError: the shape is not 5-D, has no axis of size 2 in front, or is
            ambiguous (``[2, 2, ...]``: pass ``layout=`` explicitly).
    """
    if len(shape) != 5:
        raise ValueError(f"KV cache tensors must be 5-D, got shape {tuple(shape)}")
    if shape[0] == 2 and shape[1] != 2:
        return "kv_first"
    if shape[1] == 2 and shape[0] != 2:
        return "blocks_first"
    if shape[0] == 2:
        raise ValueError(f"KV cache shape {tuple(shape)} is ambiguous; pass layout='kv_first' or 'blocks_first'")
    raise ValueError(
        f"KV cache shape {tuple(shape)} is neither [2, num_blocks, block_size, heads, head_size] "
        "nor [num_blocks, 2, block_size, heads, head_size]"
    )


def kv_geometry(kv_caches: Sequence[torch.Tensor], layout: KVLayout | None = None) -> KVCacheGeometry:
    """Check a list of per-layer KV tensors and describe them.

    Args:
        kv_caches: per-layer tensors, all the same shape, dtype and device.
        layout: the device layout; detected from the shape when None.

    Raises:
        ValueError: empty list, mismatched tensors, unknown layout or a shape
            that fits neither layout.
    """
    if not kv_caches:
        raise ValueError("kv_caches is empty")
    first = kv_caches[0]
    if layout is None:
        layout = detect_layout(first.shape)
    elif layout not in _KV_DIM:
        raise ValueError(f"unknown KV layout {layout!r}; expected 'kv_first' or 'blocks_first'")
    shape = tuple(first.shape)
    if len(shape) != 5 or shape[_KV_DIM[layout]] != 2:
        raise ValueError(f"KV cache shape {shape} does not fit layout {layout!r}")
    for i, t in enumerate(kv_caches):
        if tuple(t.shape) != shape or t.dtype != first.dtype or t.device != first.device:
            raise ValueError(
                f"KV cache layer {i} is {tuple(t.shape)} {t.dtype} on {t.device}; "
                f"layer 0 is {shape} {first.dtype} on {first.device}"
            )
    _, _, block_size, heads, head_size = shape
    page_bytes = block_size * heads * head_size * first.element_size()
    return KVCacheGeometry(
        layout, len(kv_caches), shape[_BLOCK_DIM[layout]], block_size, heads, head_size, first.dtype, page_bytes
    )


def _byte_pages(t: torch.Tensor, layout: KVLayout) -> torch.Tensor:
    """A ``[num_blocks, 2, page_bytes]`` uint8 view of one layer's KV tensor (no copy)."""
    if t.stride(-1) != 1:
        raise ValueError("the last (head_size) dimension of a KV cache tensor must be contiguous")
    u8 = t.view(torch.uint8)
    pages = u8.view(u8.shape[0], u8.shape[1], -1)  # raises if a page is not contiguous
    return pages.transpose(0, 1) if layout == "kv_first" else pages


# -- copy planning ------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Plan:
    slots: list[int]  # sorted by slot
    blocks: list[int]  # device block of each slot
    runs: list[tuple[int, int, int, int]]  # (index, slot, block, length): slots and blocks both contiguous
    slot_runs: list[tuple[int, int, int]]  # (index, slot, length): slots contiguous


def _runs(values: Sequence[int]) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[i - 1] + 1:
            out.append((start, values[start], i - start))
            start = i
    return out


def plan_copies(slot_ids: Sequence[int], block_ids: Sequence[int]) -> _Plan:
    """Sort (slot, device block) pairs by slot and find the runs to copy in one piece.

    Returns:
        A plan whose ``runs`` are maximal runs where both slots and device
        blocks are consecutive, and whose ``slot_runs`` are maximal runs of
        consecutive slots (the host-side copies of the CUDA path).
    """
    pairs = sorted(zip(slot_ids, block_ids, strict=True))
    slots = [s for s, _ in pairs]
    blocks = [b for _, b in pairs]
    runs: list[tuple[int, int, int, int]] = []
    start = 0
    for i in range(1, len(pairs) + 1):
        if i == len(pairs) or slots[i] != slots[i - 1] + 1 or blocks[i] != blocks[i - 1] + 1:
            runs.append((start, slots[start], blocks[start], i - start))
            start = i
    return _Plan(slots, blocks, runs, _runs(slots))


# -- the handler --------------------------------------------------------------
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
        kv_caches: per-layer device KV tensors (see the module docstring for
            layouts and dtypes).
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
        self._pages = [_byte_pages(t, geo.layout) for t in kv_caches]
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
        self._staging_blocks = max(1, staging_bytes // geo.block_bytes)
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
    def _check(self, job_id: int, block_ids: Sequence[int], slot_ids: Sequence[int]) -> None:
        if job_id in self._in_flight:
            raise ValueError(f"transfer job {job_id} is already in flight")
        if len(block_ids) != len(slot_ids):
            raise ValueError(f"transfer job {job_id}: {len(block_ids)} device blocks but {len(slot_ids)} slots")
        for name, ids, bound in (
            ("device block", block_ids, self.geometry.num_blocks),
            ("slot", slot_ids, self.num_slots),
        ):
            if len(set(ids)) != len(ids):
                raise ValueError(f"transfer job {job_id}: repeated {name} ids")
            for i in ids:
                if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < bound:
                    raise ValueError(f"transfer job {job_id}: {name} id {i!r} outside [0, {bound})")

    def _submit(self, job_id: int, block_ids: Sequence[int], slot_ids: Sequence[int], store: bool) -> None:
        self._check(job_id, block_ids, slot_ids)
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

    def _copy_direct(self, plan: _Plan, store: bool) -> None:
        """Copy straight between host-resident KV tensors and the host buffer.

        A run of at least :data:`_MIN_TORCH_RUN` blocks moves per layer in one
        strided ``copy_``; shorter runs move with ``memmove`` per contiguous
        segment (one per block and layer when K and V are adjacent), which
        costs about a tenth of a torch op's dispatch.
        """
        geo = self.geometry
        pb, bb = geo.page_bytes, geo.block_bytes
        host_base = self._host.data_ptr()
        memmove = ctypes.memmove
        for _, slot, block, n in plan.runs:
            if n >= _MIN_TORCH_RUN:
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

    def _copy_cuda(self, plan: _Plan, store: bool) -> Any:
        """Issue the copies of a job on the transfer stream; return the event marking their end."""
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._copy_staged(plan, store)
            event_cls: Any = torch.cuda.Event
            event = event_cls()
            event.record(stream)
        return event

    def _copy_staged(self, plan: _Plan, store: bool) -> None:
        """Copy through the device staging buffer, in chunks of at most ``staging_blocks`` blocks.

        On CUDA this runs on the transfer stream, whose order makes reusing
        the one staging buffer for every chunk and job safe.
        """
        if self._staging is None:
            self._staging = torch.empty(
                self._staging_blocks * self.geometry.block_bytes, dtype=torch.uint8, device=self.device
            )
        chunk = self._staging_blocks
        for lo in range(0, len(plan.slots), chunk):
            hi = min(len(plan.slots), lo + chunk)
            self._copy_chunk_staged(plan_copies(plan.slots[lo:hi], plan.blocks[lo:hi]), store)

    def _copy_chunk_staged(self, plan: _Plan, store: bool) -> None:
        geo = self.geometry
        assert self._staging is not None
        n = len(plan.slots)
        flat = self._staging[: n * geo.block_bytes]
        staged = flat.view(n, geo.num_layers, 2, geo.page_bytes)
        bb = geo.block_bytes
        gather = len(plan.runs) > _MAX_SLICE_RUNS
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


# -- the driver ---------------------------------------------------------------
@dataclasses.dataclass
class StoreDone:
    """A finished device -> primary store (the cascade to secondary tiers has started).

    Attributes:
        req_context: the request.
        keys: the blocks copied into the primary tier by this store.
        success: False when the device -> host copy failed (nothing was stored).
    """

    req_context: ReqContext
    keys: list[OffloadKey]
    success: bool


@dataclasses.dataclass
class LoadDone:
    """A finished load into the device KV cache.

    Attributes:
        req_context: the request.
        keys: the blocks now in the device cache: a prefix of the keys given
            to :meth:`OffloadingDriver.load` (the rest are misses to recompute).
        block_ids: the device block of each entry of ``keys``.
        sources: per key, :data:`tiering.core.manager.PRIMARY` or the index of
            the secondary tier it was promoted from.
        requested: how many keys were asked for.
    """

    req_context: ReqContext
    keys: list[OffloadKey]
    block_ids: list[int]
    sources: list[int]
    requested: int


@dataclasses.dataclass
class Finished:
    """What one :meth:`OffloadingDriver.poll` found finished."""

    stores: list[StoreDone] = dataclasses.field(default_factory=list)
    loads: list[LoadDone] = dataclasses.field(default_factory=list)

    def extend(self, other: Finished) -> None:
        """Append ``other``'s entries."""
        self.stores.extend(other.stores)
        self.loads.extend(other.loads)


@dataclasses.dataclass
class _StoreJob:
    req_context: ReqContext
    keys: list[OffloadKey]


@dataclasses.dataclass
class _LoadJob:
    req_context: ReqContext
    device_blocks: list[int]
    done: LoadDone | None = None


class OffloadingDriver:
    """Drives a :class:`TransferHandler` with a :class:`~tiering.core.manager.TieringManager`.

    - :meth:`store`: ``manager.prepare_store`` gives pinned slots, the handler
      copies device -> host, and on completion ``manager.complete_store``
      marks them ready and cascades them to every secondary tier (which keeps
      them pinned until it reports).
    - :meth:`load`: ``manager.prepare_load`` pins resident blocks and promotes
      the others secondary -> primary; when the manager reports the
      :class:`~tiering.core.manager.LoadResult`, the handler copies host ->
      device and only then ``manager.complete_load`` releases the pins.

    The driver owns ``manager.get_finished()``: call :meth:`poll` instead.
    All methods run on one thread (the scheduler's or the worker's).

    Args:
        manager: the tiering manager (its primary tier is the handler's).
        handler: the transfer handler.

    Raises:
        ValueError: ``handler`` and ``manager`` do not share the primary tier geometry.
    """

    def __init__(self, manager: TieringManager, handler: TransferHandler) -> None:
        if handler.num_slots != manager.primary.num_blocks:
            raise ValueError(f"handler has {handler.num_slots} slots, primary tier {manager.primary.num_blocks}")
        self.manager = manager
        self.handler = handler
        self._next_job = 0
        self._stores: dict[int, _StoreJob] = {}
        self._loads: dict[int, _LoadJob] = {}
        self._awaiting: dict[str, _LoadJob] = {}

    def _job_id(self) -> int:
        self._next_job += 1
        return self._next_job

    def store(self, keys: Sequence[OffloadKey], block_ids: Sequence[int], req_context: ReqContext) -> list[OffloadKey]:
        """Start offloading device blocks ``block_ids[i]`` under ``keys[i]``.

        Keys already in the primary tier are only touched; keys that find
        every slot pinned are skipped.

        Returns:
            The keys whose copy was started (reported by :meth:`poll` as a :class:`StoreDone`).

        Raises:
            ValueError: ``keys`` and ``block_ids`` differ in length or a device block id is invalid.
        """
        if len(keys) != len(block_ids):
            raise ValueError(f"{len(keys)} keys but {len(block_ids)} device blocks")
        device_block = dict(zip(keys, block_ids, strict=True))
        alloc = self.manager.prepare_store(keys, req_context)
        if not alloc.keys:
            return []
        job_id = self._job_id()
        try:
            self.handler.submit_store(job_id, [device_block[k] for k in alloc.keys], alloc.block_ids)
        except ValueError:
            self.manager.complete_store(alloc.keys, req_context, success=False)
            raise
        self._stores[job_id] = _StoreJob(req_context, list(alloc.keys))
        return list(alloc.keys)

    def load(self, keys: Sequence[OffloadKey], block_ids: Sequence[int], req_context: ReqContext) -> None:
        """Start restoring ``keys`` (a run found by ``manager.lookup``) into device blocks ``block_ids``.

        :meth:`poll` reports one :class:`LoadDone` for the request.

        Raises:
            ValueError: lengths differ, or a load for the request is already in progress.
        """
        if len(keys) != len(block_ids):
            raise ValueError(f"{len(keys)} keys but {len(block_ids)} device blocks")
        req_id = req_context.req_id
        if req_id in self._awaiting:
            raise ValueError(f"request {req_id!r} already has a load in progress")
        self.manager.prepare_load(keys, req_context)
        self._awaiting[req_id] = _LoadJob(req_context, list(block_ids))

    def poll(self) -> Finished:
        """Advance every job without blocking and return what finished."""
        out = Finished()
        for result in self.handler.get_finished():
            self._on_copy_done(result, out)
        for load in self.manager.get_finished():
            job = self._awaiting.pop(load.req_context.req_id, None)
            if job is None:
                logger.error("load of request %r was not started by this driver; released", load.req_context.req_id)
                self.manager.complete_load(load.req_context)
                continue
            blocks = job.device_blocks[: len(load.keys)]
            job.done = LoadDone(load.req_context, list(load.keys), blocks, list(load.sources), load.requested)
            if not load.keys:
                self.manager.complete_load(load.req_context)
                out.loads.append(job.done)
                continue
            job_id = self._job_id()
            self._loads[job_id] = job
            try:
                self.handler.submit_load(job_id, load.block_ids, blocks)
            except ValueError:
                logger.exception("load of request %r rejected by the transfer handler", load.req_context.req_id)
                del self._loads[job_id]
                self.manager.complete_load(load.req_context)
                job.done.keys, job.done.block_ids, job.done.sources = [], [], []
                out.loads.append(job.done)
        for result in self.handler.get_finished():
            self._on_copy_done(result, out)
        return out

    def _on_copy_done(self, result: JobResult, out: Finished) -> None:
        store = self._stores.pop(result.job_id, None)
        if store is not None:
            self.manager.complete_store(store.keys, store.req_context, success=result.success)
            out.stores.append(StoreDone(store.req_context, store.keys, result.success))
            return
        load = self._loads.pop(result.job_id)
        self.manager.complete_load(load.req_context)
        assert load.done is not None
        if not result.success:
            load.done.keys, load.done.block_ids, load.done.sources = [], [], []
        out.loads.append(load.done)

    def has_pending_work(self) -> bool:
        """Whether a copy, a promotion or a cascade is still in flight."""
        return bool(self._stores or self._loads or self._awaiting) or self.manager.has_pending_work()

    def wait(self, timeout: float | None = None, interval: float = 0.0005) -> Finished:
        """Poll until nothing is in flight (scripts, tests, shutdown).

        Args:
            timeout: seconds before giving up; None waits forever.
            interval: seconds to sleep between polls.

        Returns:
            Everything the polls found finished.

        Raises:
            TimeoutError: work is still in flight after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        out = self.poll()
        while self.has_pending_work():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"transfers still in flight after {timeout} s")
            time.sleep(interval)
            out.extend(self.poll())
        return out


__all__ = [
    "DEFAULT_STAGING_BYTES",
    "SLOT_LAYOUT",
    "Finished",
    "HostBuffer",
    "KVCacheGeometry",
    "KVLayout",
    "LoadDone",
    "OffloadingDriver",
    "StoreDone",
    "TransferHandler",
    "allocate_host_buffer",
    "detect_layout",
    "host_tensor",
    "kv_geometry",
    "plan_copies",
]
