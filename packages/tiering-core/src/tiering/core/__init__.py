"""tiering-core: the microkernel of the tiering KV-cache offload stack.

Importing this package needs neither torch nor vLLM; the transfer path
(:mod:`tiering.core.transfer`) and the vLLM binding import them on use.
"""

from tiering.core.__about__ import __version__
from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext, SecondaryTierManager, block_view
from tiering.core.factory import (
    CachePolicyFactory,
    OffloadingSpecFactory,
    SecondaryTierFactory,
    create_secondary_tier,
    create_spec,
    register_tier,
)
from tiering.core.manager import LoadResult, TieringManager
from tiering.core.primary import ARCCachePolicy, CachePolicy, CPUPrimaryTier, LRUCachePolicy
from tiering.core.spec import Namespace, OffloadingSpec, TieringOffloadingSpec

__all__ = [
    "ARCCachePolicy",
    "CPUPrimaryTier",
    "CachePolicy",
    "CachePolicyFactory",
    "JobMetadata",
    "JobResult",
    "LRUCachePolicy",
    "LoadResult",
    "Namespace",
    "OffloadKey",
    "OffloadingSpec",
    "OffloadingSpecFactory",
    "ReqContext",
    "SecondaryTierFactory",
    "SecondaryTierManager",
    "TieringManager",
    "TieringOffloadingSpec",
    "__version__",
    "block_view",
    "create_secondary_tier",
    "create_spec",
    "register_tier",
]
