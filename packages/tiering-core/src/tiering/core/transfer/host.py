"""The primary tier's host buffer as torch memory: pinned when CUDA is present, pre-faulted.

Needs torch (the ``torch`` extra).
"""

from __future__ import annotations

import ctypes
import dataclasses

from tiering.core.transfer._torch import torch


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
        block_bytes: bytes per slot (> 0); use :attr:`~tiering.core.transfer.KVCacheGeometry.block_bytes`.
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


__all__ = ["HostBuffer", "allocate_host_buffer", "host_tensor"]
