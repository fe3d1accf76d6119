"""Name resolution: which tiering tier a vLLM ``secondary_tiers`` entry's ``type`` selects.

vLLM's ``SecondaryTierFactory`` takes the attribute named by ``type`` from
``module_path`` (:mod:`tiering.core.vllm.tiers`); this module maps such a
name to a tiering tier and builds (once per name) the vLLM tier class that
wraps it, a subclass of :class:`~tiering.core.vllm.tier.TieringSecondaryTier`.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from tiering.core.base import SecondaryTierManager as TieringTierManager
from tiering.core.factory import SecondaryTierFactory
from tiering.core.vllm.compat import Medium
from tiering.core.vllm.tier import TieringSecondaryTier

logger = logging.getLogger(__name__)


def medium_for(tier_cls: type[TieringTierManager]) -> Any:
    """VLLM's ``Medium`` of a tiering tier class, from its ``medium`` ClassVar.

    ``"storage"`` -> ``Medium.STORAGE``; ``"cpu"`` and ``"memory"`` (host
    memory) -> ``Medium.CPU``. The medium decides how vLLM labels hits
    (``DISK`` / ``HOST``), how ``load_tier_filter`` treats the tier and what
    its KV events carry.

    Raises:
        ValueError: ``medium`` is none of those (named, with the class).
    """
    value = tier_cls.medium
    medium = _MEDIA.get(value.lower()) if isinstance(value, str) else None
    if medium is None:
        raise ValueError(
            f"{tier_cls.__module__}.{tier_cls.__qualname__}.medium = {value!r}: vLLM knows the media {sorted(_MEDIA)}"
        )
    return Medium[medium]


_MEDIA = {"storage": "STORAGE", "cpu": "CPU", "memory": "CPU"}


TIER_NAME_PREFIX = "tiering_"
"""``type`` = ``tiering_<name>`` selects tiering tier ``<name>``: never one of vLLM's built-in names."""

_classes: dict[str, type[TieringSecondaryTier]] = {}


def camel(name: str) -> str:
    """``fs`` -> ``Fs``, ``my-tier`` -> ``MyTier``: the part after ``Tiering`` in a class-style name."""
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^0-9A-Za-z]+", name) if part)


def known_tier_names() -> list[str]:
    """Tiering tier names resolvable here: registered in-process or installed (entry points)."""
    return SecondaryTierFactory.known_names()


def resolve_tier_name(attr: str) -> str | None:
    """The tiering tier name that ``attr`` selects, or None.

    Accepted, in this order: ``tiering_<name>`` (canonical), ``Tiering<Camel>``
    (e.g. ``TieringFs``), and the class name of an installed tiering tier
    (e.g. ``FsspecSecondaryTierManager``; this imports every installed tier).
    """
    names = known_tier_names()
    if attr.startswith(TIER_NAME_PREFIX) and attr[len(TIER_NAME_PREFIX) :] in names:
        return attr[len(TIER_NAME_PREFIX) :]
    if attr.startswith("Tiering"):
        for name in names:
            if "Tiering" + camel(name) == attr:
                return name
    for name in names:
        try:
            cls = SecondaryTierFactory.get_class(name)
        except Exception:  # a broken provider must not hide the others
            logger.debug("tiering tier %r did not load", name, exc_info=True)
            continue
        if cls.__name__ == attr:
            return name
    return None


def tier_class(name: str) -> type[TieringSecondaryTier]:
    """The vLLM tier class wrapping tiering tier ``name`` (one class per name, cached).

    Raises:
        ValueError, ImportError, TypeError: as
            :meth:`tiering.core.factory.Registry.get_class` for ``name``.
    """
    cls = _classes.get(name)
    if cls is None:
        inner = SecondaryTierFactory.get_class(name)
        class_name = "Tiering" + camel(name)
        cls = type(
            class_name,
            (TieringSecondaryTier,),
            {
                "__module__": "tiering.core.vllm.tiers",
                "__qualname__": class_name,
                "__doc__": f"vLLM secondary tier running tiering tier {name!r} "
                f"({inner.__module__}.{inner.__qualname__}).",
                "tiering_name": name,
                "tiering_class": inner,
                "medium": medium_for(inner),
            },
        )
        _classes[name] = cls
    return cls


def unknown_tier_message(attr: str) -> str:
    """The AttributeError text for a name :func:`resolve_tier_name` rejects."""
    names = known_tier_names()
    known = ", ".join(TIER_NAME_PREFIX + n for n in names) or "none installed"
    return (
        f'tiering.core.vllm.tiers has no tier {attr!r}. Use "type": "tiering_<name>" where <name> is a '
        f"tiering tier ({known}); install a backend (pip install tiering-fs) or register a tier under the "
        "'tiering.tiers' entry-point group. Bare names such as 'fs' or 'example' select vLLM's built-in tiers."
    )
