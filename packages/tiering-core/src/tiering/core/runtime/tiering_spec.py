"""The tiering spec: an :class:`~tiering.core.spec.OffloadingSpec` that builds a CPU primary tier plus secondary tiers.

The shape follows vLLM's ``TieringOffloadingSpec`` (``vllm/v1/kv_offload``):
configuration, plus the ``create_*`` / ``get_manager`` methods of vLLM's
shape, which call :mod:`tiering.core.runtime.stack` (building through the
factories of :mod:`tiering.core.factory`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tiering.core.policies.admission import AdmissionConfig, admission_config
from tiering.core.policies.costmodel import COST_KEYS, LoadCostConfig
from tiering.core.policies.tenant_auth import TenantAuth
from tiering.core.redact import redact_config
from tiering.core.registry import closest_name
from tiering.core.runtime import stack
from tiering.core.spec import SPEC_KEYS, OffloadingSpec

if TYPE_CHECKING:
    from tiering.core.base import SecondaryTierManager
    from tiering.core.primary import CPUPrimaryTier
    from tiering.core.runtime.manager import TieringManager

EVICTION_POLICIES = ("lru", "arc")


class TieringOffloadingSpec(OffloadingSpec):
    """An :class:`OffloadingSpec` for a CPU primary tier plus secondary tiers.

    Additional config keys:

    - ``eviction_policy``: ``"lru"`` (default), ``"arc"``, or the name of a
      custom :class:`~tiering.core.primary.CachePolicy` loaded from
      ``cache_policy_module_path``.
    - ``secondary_tiers``: a list of objects ``{"type": ..., "module_path"?: ...,
      <tier keys>}``; tier 0 is consulted first.
    - ``load_cost_model``, ``recompute_tokens_per_s``, ``max_load_s``,
      ``load_cost_margin``: when a found prefix is worth loading
      (:mod:`tiering.core.policies.costmodel`), read into :attr:`load_cost`.

    Raises:
        ValueError: ``secondary_tiers`` is not a list of objects,
            ``eviction_policy`` is not one of the allowed values, or a cost
            model key is of the wrong type or range.
    """

    config_keys = SPEC_KEYS | COST_KEYS

    def __init__(self, extra_config: Mapping[str, Any], engine_config: Any = None, *, strict: bool = True) -> None:
        super().__init__(extra_config, engine_config, strict=strict)
        tiers = extra_config.get("secondary_tiers", [])
        if not isinstance(tiers, list) or not all(isinstance(t, Mapping) for t in tiers):
            raise ValueError(f"config key 'secondary_tiers' must be a list of objects, got {redact_config(tiers)!r}")
        self.secondary_tiers: list[Mapping[str, Any]] = tiers
        policy = extra_config.get("eviction_policy", "lru")
        self.cache_policy_module_path: str | None = extra_config.get("cache_policy_module_path")
        if not isinstance(policy, str) or (policy not in EVICTION_POLICIES and self.cache_policy_module_path is None):
            close = closest_name(policy, EVICTION_POLICIES) if isinstance(policy, str) else None
            raise ValueError(
                f"config key 'eviction_policy' is {policy!r}"
                + (f" (did you mean {close!r}?)" if close else "")
                + f"; allowed: {', '.join(map(repr, EVICTION_POLICIES))}, or a custom policy name "
                "together with 'cache_policy_module_path'"
            )
        self.eviction_policy: str = policy
        self.load_cost = LoadCostConfig.from_config(extra_config)
        self.tenant_auth = TenantAuth.from_config(extra_config)  # refuses a bad tenant_secret before anything starts

    def create_primary(self, buffer: memoryview | None = None) -> CPUPrimaryTier:
        """Build the CPU primary tier with the configured policy (:func:`tiering.core.runtime.stack.build_primary`)."""
        return stack.build_primary(self, buffer)

    def create_secondary_tiers(self, primary_kv_view: memoryview) -> list[SecondaryTierManager]:
        """Build every entry of ``secondary_tiers`` (:func:`tiering.core.runtime.stack.build_secondary_tiers`)."""
        return stack.build_secondary_tiers(self, primary_kv_view)

    def get_manager(self, buffer: memoryview | None = None) -> TieringManager:
        """Build the scheduler-side manager (:func:`tiering.core.runtime.stack.build_manager`).

        Args:
            buffer: the primary tier's host buffer, see :func:`~tiering.core.runtime.stack.build_primary`.
        """
        return stack.build_manager(self, buffer)

    def admission(self) -> list[AdmissionConfig]:
        """Each entry's admission settings (:mod:`tiering.core.policies.admission`), in ``secondary_tiers`` order.

        Raises:
            TierConfigError: a bad admission key, named ``secondary_tiers[<index>].<key>``.
        """
        return [admission_config(entry, i) for i, entry in enumerate(self.secondary_tiers)]

    def create_handlers(self, kv_caches: Any, manager: TieringManager) -> Any:
        """Worker-side transfer handlers (:func:`tiering.core.runtime.stack.build_handlers`; needs ``torch``)."""
        return stack.build_handlers(kv_caches, manager)
