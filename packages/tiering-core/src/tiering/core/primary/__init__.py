"""The CPU primary tier: host buffer, slots, pins and eviction policies.

The names below are imported on first use (PEP 562): a process that only
needs the buffer helpers (the vLLM binding, whose primary tier is vLLM's)
does not load the tier and its policies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names.split()}

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


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use (PEP 562)."""
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
