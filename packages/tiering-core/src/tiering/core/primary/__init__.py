"""The CPU primary tier: host buffer, slots, pins and eviction policies.

The names below are imported on first use (PEP 562): a process that only
needs the buffer helpers (the vLLM binding, whose primary tier is vLLM's)
does not load the tier and its policies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiering.core import _lazy_exports

if TYPE_CHECKING:
    from tiering.core.base import PRIMARY
    from tiering.core.primary.buffer import allocate_host_buffer, as_block_view
    from tiering.core.primary.policy import ARCCachePolicy, CachePolicy, LRUCachePolicy
    from tiering.core.primary.tier import Allocation, CPUPrimaryTier

_HOMES = {
    "tiering.core.base": "PRIMARY",
    "tiering.core.primary.buffer": "allocate_host_buffer as_block_view",
    "tiering.core.primary.policy": "ARCCachePolicy CachePolicy LRUCachePolicy",
    "tiering.core.primary.tier": "Allocation CPUPrimaryTier",
}
__all__ = [
    "PRIMARY",
    "ARCCachePolicy",
    "Allocation",
    "CPUPrimaryTier",
    "CachePolicy",
    "LRUCachePolicy",
    "allocate_host_buffer",
    "as_block_view",
]


__getattr__ = _lazy_exports(__name__, _HOMES)
