"""tiering-core: the microkernel of the tiering KV-cache offload stack.

The names below are imported on first use (PEP 562), so ``import
tiering.core`` loads nothing but this module and the version: a process
pays only for what it uses (the vLLM binding never loads the standalone
manager; a tier never loads the CLI). Importing this package needs neither
torch nor vLLM; the transfer path (:mod:`tiering.core.transfer`) and the
vLLM binding import them on use.

The tree shows the layers (``lint-imports`` checks them, see the root
``pyproject.toml``):

- kernel: this package's top-level modules (contract, registry, factory,
  spec, block format, schema), :mod:`~tiering.core.primary` and
  :mod:`~tiering.core.transfer`;
- SDK: :mod:`~tiering.core.store`, the block store tiers are built from;
- features: :mod:`~tiering.core.policies` (tenants, pins, admission, cost model);
- runtime: :mod:`~tiering.core.runtime` (the standalone manager, the stack, metrics);
- integration: :mod:`~tiering.core.vllm`;
- tools: :mod:`~tiering.testing` (conformance suites).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tiering.core.__about__ import __version__
    from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext, SecondaryTierManager, block_view
    from tiering.core.factory import (
        CachePolicyFactory,
        OffloadingSpecFactory,
        SecondaryTierFactory,
        create_secondary_tier,
        create_spec,
    )
    from tiering.core.primary import ARCCachePolicy, CachePolicy, CPUPrimaryTier, LRUCachePolicy
    from tiering.core.registry import register_tier
    from tiering.core.runtime.manager import LoadResult, TieringManager
    from tiering.core.runtime.tiering_spec import TieringOffloadingSpec
    from tiering.core.spec import Namespace, OffloadingSpec

_HOMES = {
    "tiering.core.__about__": "__version__",
    "tiering.core.base": "JobMetadata JobResult OffloadKey ReqContext SecondaryTierManager block_view",
    "tiering.core.factory": (
        "CachePolicyFactory OffloadingSpecFactory SecondaryTierFactory create_secondary_tier create_spec"
    ),
    "tiering.core.registry": "register_tier",
    "tiering.core.runtime.manager": "LoadResult TieringManager",
    "tiering.core.primary": "ARCCachePolicy CPUPrimaryTier CachePolicy LRUCachePolicy",
    "tiering.core.spec": "Namespace OffloadingSpec",
    "tiering.core.runtime.tiering_spec": "TieringOffloadingSpec",
}
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


def _lazy_exports(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562): each name of ``homes`` imported from its module on first use.

    Args:
        package: the package's ``__name__``; the value is cached in its namespace after the first use.
        homes: module name -> its names, space-separated.

    Returns:
        The ``__getattr__``; it raises ``AttributeError`` for a name ``homes`` does not list.
    """
    home_of = {name: module for module, names in homes.items() for name in names.split()}

    def __getattr__(name: str) -> Any:
        module = home_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__


__getattr__ = _lazy_exports(__name__, _HOMES)


def __dir__() -> list[str]:
    return __all__
