"""The CPU primary tier: host buffer, slots, pins and eviction policies."""

from tiering.core.primary.buffer import allocate_host_buffer, as_block_view
from tiering.core.primary.policy import ARCCachePolicy, CachePolicy, LRUCachePolicy
from tiering.core.primary.tier import PRIMARY, Allocation, CPUPrimaryTier

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
