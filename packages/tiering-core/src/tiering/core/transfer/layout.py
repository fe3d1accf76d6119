"""Device KV-cache layouts and the primary slot's byte layout, without torch.

Device KV cache
    A list of per-layer tensors (one per attention layer, same shape and
    dtype), in one of the two common paged layouts:

    - ``"kv_first"``: ``[2, num_blocks, block_size, num_kv_heads, head_size]``
      (vLLM's FlashAttention layout);
    - ``"blocks_first"``: ``[num_blocks, 2, block_size, num_kv_heads, head_size]``
      (vLLM's FlashInfer layout).

Slot layout (:data:`SLOT_LAYOUT`, ``kv_layout`` of the namespace)
    One primary slot holds one block for all layers, contiguous, so a
    secondary tier does one I/O per block. With ``page_bytes = block_size *
    num_kv_heads * head_size * itemsize`` the slot is layer-major, K then V,
    each page in the device's ``[block_size, num_kv_heads, head_size]``
    (token, head, dim) order::

        offset(layer, kv) = (2 * layer + kv) * page_bytes      # kv: 0 = K, 1 = V
        block_bytes       = 2 * num_layers * page_bytes

    The slot bytes do not depend on the device layout: a block stored from a
    ``kv_first`` cache loads into a ``blocks_first`` one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

KVLayout = Literal["kv_first", "blocks_first"]
"""Device KV-cache layouts: ``"kv_first"`` = ``[2, N, bs, H, D]``, ``"blocks_first"`` = ``[N, 2, bs, H, D]``."""

SLOT_LAYOUT = "layer-major/kv/nhd"
"""Name of the slot byte layout (layer-major, K then V, pages in token/head/dim order), version 1."""

KV_DIM: dict[str, int] = {"kv_first": 0, "blocks_first": 1}
"""Per layout, the axis of size 2 (K, V) of a per-layer tensor."""

BLOCK_DIM: dict[str, int] = {"kv_first": 1, "blocks_first": 0}
"""Per layout, the axis that indexes device blocks."""


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


def check_layout(shape: Sequence[int], layout: str) -> KVLayout:
    """Check that a per-layer KV tensor shape fits ``layout``; return the layout.

    Raises:
        ValueError: ``layout`` is unknown, or ``shape`` is not 5-D with 2 at the layout's K/V axis.
    """
    if layout not in KV_DIM:
        raise ValueError(f"unknown KV layout {layout!r}; expected 'kv_first' or 'blocks_first'")
    if len(shape) != 5 or shape[KV_DIM[layout]] != 2:
        raise ValueError(f"KV cache shape {tuple(shape)} does not fit layout {layout!r}")
    return "kv_first" if layout == "kv_first" else "blocks_first"


def slot_layout(num_layers: int, block_size: int, num_kv_heads: int, head_size: int, kv_dtype: str) -> str:
    """The slot layout with its geometry: the namespace's ``kv_layout``.

    Example: ``slot_layout(32, 16, 8, 128, "bfloat16")`` is
    ``"layer-major/kv/nhd;layers=32;block_size=16;heads=8;head_size=128;dtype=bfloat16"``.
    It names the slot bytes only, so both device layouts give the same string.
    """
    return (
        f"{SLOT_LAYOUT};layers={num_layers};block_size={block_size};"
        f"heads={num_kv_heads};head_size={head_size};dtype={kv_dtype}"
    )


__all__ = ["BLOCK_DIM", "KV_DIM", "SLOT_LAYOUT", "KVLayout", "check_layout", "detect_layout", "slot_layout"]
