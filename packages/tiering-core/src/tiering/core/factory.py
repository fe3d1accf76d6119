"""Factories: resolve a configured name to a class, build specs, tiers and cache policies from config.

One :class:`~tiering.core.registry.Registry` mechanism serves three users, as
in vLLM's ``kv_offload`` factories and fsspec's ``registry``:

- :data:`SecondaryTierFactory`: secondary tiers (``type`` / ``module_path``),
  entry-point group ``tiering.tiers``;
- :data:`CachePolicyFactory`: primary-tier eviction policies
  (``eviction_policy`` / ``cache_policy_module_path``), group ``tiering.cache_policies``;
- :data:`OffloadingSpecFactory`: specs (``spec_name`` / ``spec_module_path``),
  group ``tiering.specs``.

Resolution order: names registered in-process (:meth:`Registry.register`,
imported lazily on first use) -> installed entry points -> ``module_path``
from the config (import the module, take the attribute named by the name).

Loading code named by a config file is a trust boundary: whoever writes the
config runs code in the engine process.

The modules form a chain without cycles: :mod:`~tiering.core.registry` (the
mechanism) <- :mod:`~tiering.core.tier_factory` (tiers, cache policies) <-
:mod:`~tiering.core.spec` (the spec builds its tiers and policy) <- this
module (the spec factory, and every factory name in one place).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tiering.core.construct import construct, label_error
from tiering.core.redact import Redactor
from tiering.core.registry import OUT_OF_TREE_WARNING, Registry, import_module_path
from tiering.core.spec import OffloadingSpec
from tiering.core.tier_factory import (
    CACHE_POLICY_SIGNATURE,
    TIER_SIGNATURE,
    CachePolicyFactory,
    SecondaryTierFactory,
    check_tier_keys,
    create_cache_policy,
    create_secondary_tier,
    redact_offloading_config,
    register_tier,
    resolve_tier,
)

SPEC_SIGNATURE = "(extra_config: Mapping[str, Any], engine_config: Any = None)"
"""How :func:`create_spec` calls a spec's constructor (the shape of :class:`~tiering.core.spec.OffloadingSpec`)."""

OffloadingSpecFactory: Registry[OffloadingSpec] = Registry(
    "offloading spec", OffloadingSpec, group="tiering.specs", name_key="spec_name", path_key="spec_module_path"
)
OffloadingSpecFactory.register("TieringOffloadingSpec", "tiering.core.spec", "TieringOffloadingSpec")
OffloadingSpecFactory.register("OffloadingSpec", "tiering.core.spec", "OffloadingSpec")
_FIRST_PARTY_SPECS = frozenset({"TieringOffloadingSpec", "OffloadingSpec"})


def create_spec(extra_config: Mapping[str, Any], engine_config: Any = None) -> OffloadingSpec:
    """Build the spec named by ``spec_name`` (default ``TieringOffloadingSpec``).

    Args:
        extra_config: the offloading config (vLLM's ``kv_connector_extra_config`` shape).
        engine_config: the engine's own config object, handed to the spec.

    Raises:
        ValueError: ``spec_name`` is unknown (with a "did you mean" suggestion
            and the known names), or a config value is bad.
        ImportError, AttributeError: ``spec_module_path`` cannot be imported or
            has no such class; the message names the key.
        TypeError: the class is not an :class:`~tiering.core.spec.OffloadingSpec`,
            or its constructor does not take :data:`SPEC_SIGNATURE`; the
            message names ``spec_name``, ``spec_module_path``, the class's
            signature and the expected one.
        Exception: whatever an out-of-tree spec's constructor raises, same
            type, its message prefixed with ``spec_name ... (spec_module_path ...)``.
            Every message is redacted (:mod:`tiering.core.redact`).
    """
    name = extra_config.get("spec_name", "TieringOffloadingSpec")
    module_path = extra_config.get("spec_module_path")
    redact = Redactor(extra_config)
    label = f"spec_name {name!r}"
    if name not in _FIRST_PARTY_SPECS:
        label += f" ({OffloadingSpecFactory.source(name, module_path)})"
    try:
        cls = OffloadingSpecFactory.get_class(name, module_path)
    except (ImportError, AttributeError, TypeError) as exc:
        raise label_error(exc, label, redact)  # noqa: B904 - relabelled in place
    return construct(
        cls,
        (extra_config, engine_config),
        {},
        label=label,
        expected=SPEC_SIGNATURE,
        redact=redact,
        label_raised=name not in _FIRST_PARTY_SPECS,
    )


__all__ = [
    "CACHE_POLICY_SIGNATURE",
    "OUT_OF_TREE_WARNING",
    "SPEC_SIGNATURE",
    "TIER_SIGNATURE",
    "CachePolicyFactory",
    "OffloadingSpecFactory",
    "Registry",
    "SecondaryTierFactory",
    "check_tier_keys",
    "create_cache_policy",
    "create_secondary_tier",
    "create_spec",
    "import_module_path",
    "redact_offloading_config",
    "register_tier",
    "resolve_tier",
]
