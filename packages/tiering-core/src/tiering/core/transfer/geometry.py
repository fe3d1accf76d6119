"""Shape facts of a paged device KV cache (torch tensors) and the byte views the copies use.

Needs torch (the ``torch`` extra). Any dtype (float32, float16, bfloat16,
float8_*...) works: blocks are moved as bytes through ``tensor.view(torch.uint8)``.
Each ``[block_size, num_kv_heads, head_size]`` page must be contiguous; the
block and K/V strides are free. The layouts are described in
:mod:`tiering.core.transfer.layout`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tiering.core.transfer._torch import torch
from tiering.core.transfer.layout import BLOCK_DIM, KVLayout, check_layout, detect_layout, slot_layout


def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype's name without the ``torch.`` prefix (``"bfloat16"``)."""
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
        return dtype_name(self.dtype)

    @property
    def kv_layout(self) -> str:
        """The slot layout with its geometry, for the namespace's ``kv_layout`` (see :func:`~.layout.slot_layout`)."""
        return slot_layout(self.num_layers, self.block_size, self.num_kv_heads, self.head_size, self.kv_dtype)

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
    shape = tuple(first.shape)
    layout = check_layout(shape, detect_layout(shape) if layout is None else layout)
    for i, t in enumerate(kv_caches):
        if tuple(t.shape) != shape or t.dtype != first.dtype or t.device != first.device:
            raise ValueError(
                f"KV cache layer {i} is {tuple(t.shape)} {t.dtype} on {t.device}; "
                f"layer 0 is {shape} {first.dtype} on {first.device}"
            )
    _, _, block_size, heads, head_size = shape
    page_bytes = block_size * heads * head_size * first.element_size()
    return KVCacheGeometry(
        layout, len(kv_caches), shape[BLOCK_DIM[layout]], block_size, heads, head_size, first.dtype, page_bytes
    )


def byte_pages(t: torch.Tensor, layout: KVLayout) -> torch.Tensor:
    """A ``[num_blocks, 2, page_bytes]`` uint8 view of one layer's KV tensor (no copy).

    Raises:
        ValueError: the last (head_size) dimension is not contiguous.
        RuntimeError: a page is not contiguous (from ``Tensor.view``).
    """
    if t.stride(-1) != 1:
        raise ValueError("the last (head_size) dimension of a KV cache tensor must be contiguous")
    u8 = t.view(torch.uint8)
    pages = u8.view(u8.shape[0], u8.shape[1], -1)  # raises if a page is not contiguous
    return pages.transpose(0, 1) if layout == "kv_first" else pages


__all__ = ["KVCacheGeometry", "byte_pages", "dtype_name", "kv_geometry"]
