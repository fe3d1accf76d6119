"""The names vLLM's ``SecondaryTierFactory`` resolves: one vLLM tier class per tiering tier.

A ``secondary_tiers`` entry whose ``type`` is not one of vLLM's built-in
tiers (``example``, ``fs``, ``p2p``, ``obj``, ``kvcr``) makes vLLM import
``module_path`` and take the attribute named by ``type``. With
``"module_path": "tiering.core.vllm.tiers"`` that attribute comes from this
module's ``__getattr__`` (PEP 562):

- ``tiering_<name>`` (canonical; e.g. ``tiering_fs``, ``tiering_s3``,
  ``tiering_example``): the tiering tier registered as ``<name>``, in-process
  or by an installed package's ``tiering.tiers`` entry point;
- ``Tiering<Name>`` (e.g. ``TieringFs``): the same class, by its class name;
- a tiering tier's class name (e.g. ``FsspecSecondaryTierManager``).

Every form starts with ``tiering``/``Tiering`` or is a tiering class name,
so none can be one of vLLM's built-in names, which vLLM resolves before it
ever imports this module. Each name returns the same class object every
time: a subclass of vLLM's ``SecondaryTierManager``
(:class:`tiering.core.vllm.tier.TieringSecondaryTier`).

Importing this module checks the installed vLLM version
(:data:`tiering.core.vllm.compat.SUPPORTED_RANGE`: ``>= 0.32, < 0.34``).
"""

from __future__ import annotations

from tiering.core.vllm.compat import SUPPORTED_TEXT
from tiering.core.vllm.names import (
    TIER_NAME_PREFIX,
    known_tier_names,
    resolve_tier_name,
    tier_class,
    unknown_tier_message,
)
from tiering.core.vllm.tier import TieringSecondaryTier

__all__ = ["SUPPORTED_TEXT", "TieringSecondaryTier"]


def __getattr__(attr: str) -> type[TieringSecondaryTier]:
    """The vLLM tier class for ``attr`` (see the module docstring).

    Raises:
        AttributeError: ``attr`` names no installed tiering tier; the message
            lists the names that work.
    """
    if attr.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
    name = resolve_tier_name(attr)
    if name is None:
        raise AttributeError(unknown_tier_message(attr))
    return tier_class(name)


def __dir__() -> list[str]:
    """The module's names plus ``tiering_<name>`` for every known tiering tier."""
    return sorted([*globals(), *(TIER_NAME_PREFIX + name for name in known_tier_names())])
