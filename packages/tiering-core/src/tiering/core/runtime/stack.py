"""Build the tier stack a spec describes: primary tier, secondary tiers, scheduler-side manager, transfer handlers.

:class:`~tiering.core.runtime.tiering_spec.TieringOffloadingSpec` holds configuration only;
its ``create_primary`` / ``create_secondary_tiers`` / ``get_manager`` /
``create_handlers`` (the shape of vLLM's ``OffloadingSpec``) call the
functions here, which resolve and construct through :mod:`tiering.core.factory`.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Any

from tiering.core.factory import create_cache_policy, create_secondary_tier
from tiering.core.primary import CPUPrimaryTier
from tiering.core.primary.memory import allocation_error, check_primary_fits
from tiering.core.runtime.manager import TieringManager

if TYPE_CHECKING:
    from tiering.core.base import SecondaryTierManager
    from tiering.core.runtime.tiering_spec import TieringOffloadingSpec


def build_primary(spec: TieringOffloadingSpec, buffer: memoryview | None = None) -> CPUPrimaryTier:
    """The CPU primary tier of ``spec`` (``num_primary_blocks`` slots of ``block_bytes``) with its configured policy.

    Args:
        spec: the stack's spec.
        buffer: a flat writable host buffer of ``num_primary_blocks *
            block_bytes`` bytes (e.g. the pinned
            :attr:`tiering.core.transfer.HostBuffer.view`); when None an
            ordinary pre-faulted buffer is allocated.

    Raises:
        ValueError: (no buffer given) the primary tier is larger than this
            machine's memory (:func:`~tiering.core.primary.memory.check_primary_fits`),
            refused before allocating (pre-faulting it could get the process killed).
        OSError: (``ENOMEM``) the buffer cannot be allocated; the message
            names ``cpu_bytes_to_use``, its value and the machine's memory.
        ValueError, ImportError, AttributeError, TypeError: the policy cannot
            be built (:func:`~tiering.core.factory.create_cache_policy`).
    """
    nbytes = spec.num_primary_blocks * spec.block_bytes
    policy = create_cache_policy(spec.eviction_policy, spec.cache_policy_module_path, spec.num_primary_blocks)
    if buffer is None:
        check_primary_fits(nbytes)
    try:
        return CPUPrimaryTier(spec.num_primary_blocks, spec.block_bytes, policy, buffer=buffer)
    except (MemoryError, OSError) as exc:
        if buffer is not None or (isinstance(exc, OSError) and exc.errno != errno.ENOMEM):
            raise
        raise allocation_error(exc, nbytes) from exc


def build_secondary_tiers(spec: TieringOffloadingSpec, primary_kv_view: memoryview) -> list[SecondaryTierManager]:
    """Every entry of ``spec.secondary_tiers`` built over ``primary_kv_view``, in order.

    On an error, the tiers already built are shut down before it propagates
    (errors: :func:`~tiering.core.factory.create_secondary_tier`).
    """
    tiers: list[SecondaryTierManager] = []
    try:
        for index, tier_config in enumerate(spec.secondary_tiers):
            tiers.append(create_secondary_tier(tier_config, primary_kv_view, spec, index=index))
    except BaseException:
        for tier in tiers:
            tier.shutdown()
        raise
    return tiers


def build_manager(spec: TieringOffloadingSpec, buffer: memoryview | None = None) -> TieringManager:
    """The scheduler-side :class:`~tiering.core.runtime.manager.TieringManager` of ``spec``.

    Args:
        spec: the stack's spec.
        buffer: the primary tier's host buffer, see :func:`build_primary`.
    """
    primary = build_primary(spec, buffer)
    tiers = build_secondary_tiers(spec, primary.kv_view)
    return TieringManager(
        primary, tiers, load_cost=spec.load_cost, block_tokens=spec.block_size, admission=spec.admission()
    )


def build_handlers(kv_caches: Any, manager: TieringManager) -> Any:
    """Worker-side transfer handlers between the engine's KV caches and ``manager``'s primary tier.

    Requires the ``torch`` extra (``pip install 'tiering-core[torch]'``);
    see :mod:`tiering.core.transfer`.
    """
    from tiering.core.transfer import TransferHandler

    return TransferHandler(kv_caches, manager.primary)


__all__ = ["build_handlers", "build_manager", "build_primary", "build_secondary_tiers"]
