"""The primary tier's host buffer: one block-major allocation, pre-faulted once."""

from __future__ import annotations

import mmap

_PREFAULT_CHUNK = 64 * 1024 * 1024


def allocate_host_buffer(num_blocks: int, block_bytes: int) -> memoryview:
    """Allocate ``num_blocks * block_bytes`` bytes of anonymous memory and touch every page.

    First-touch page faults run at about a fifth of copy speed (see the
    design notes' memory figures), so they are paid here, once, not on the
    first store. When CUDA is present, :mod:`tiering.core.transfer` supplies
    a pinned buffer instead.

    Returns:
        A writable 2-D memoryview of shape ``(num_blocks, block_bytes)``, format ``"B"``.

    Raises:
        ValueError: a size is not positive.
    """
    if num_blocks <= 0 or block_bytes <= 0:
        raise ValueError(f"host buffer needs num_blocks > 0 and block_bytes > 0, got {num_blocks}, {block_bytes}")
    size = num_blocks * block_bytes
    region = mmap.mmap(-1, size)
    flat = memoryview(region)
    zeros = bytes(min(size, _PREFAULT_CHUNK))
    for start in range(0, size, len(zeros)):
        end = min(size, start + len(zeros))
        flat[start:end] = zeros[: end - start]
    return as_block_view(flat, num_blocks, block_bytes)


def as_block_view(buffer: memoryview, num_blocks: int, block_bytes: int) -> memoryview:
    """View a flat writable byte buffer as ``(num_blocks, block_bytes)``.

    Raises:
        ValueError: the buffer is read-only or not exactly ``num_blocks * block_bytes`` bytes.
    """
    flat = memoryview(buffer).cast("B")
    if flat.readonly:
        raise ValueError("the primary tier's host buffer must be writable")
    if flat.nbytes != num_blocks * block_bytes:
        raise ValueError(f"host buffer is {flat.nbytes} bytes, expected {num_blocks} x {block_bytes}")
    return flat.cast("B", (num_blocks, block_bytes))
