"""The ``adapter_params`` of the LMCache adapter: parsed and checked before anything is built. No LMCache import."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from tiering.core.policies.admission import refuse_admission
from tiering.core.registry import closest_name
from tiering.core.units import size_value
from tiering.lmcache.keys import namespace_config

PARAM_KEYS = ("tier", "object_bytes", "staging_objects", "lock_ttl_s", "lookup_timeout_s")
"""Keys accepted in ``adapter_params``."""

DEFAULT_STAGING_OBJECTS = 64
DEFAULT_LOCK_TTL_S = 300.0
DEFAULT_LOOKUP_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True)
class AdapterParams:
    """The adapter's configuration.

    Attributes:
        tier: the tiering tier entry, written as in ``secondary_tiers``
            (``{"type": "fs", "root": ...}``).
        object_bytes: the largest LMCache object stored (bytes); rows are
            this plus an 8-byte length.
        staging_objects: rows of the adapter's host staging buffer (objects
            in flight to or from the tier at once).
        lock_ttl_s: seconds a lookup's lock lasts when no unlock comes.
        lookup_timeout_s: seconds a lookup waits for a tier that answers
            "not known yet" (a rescan, a store in flight) before it is a miss.
    """

    tier: Mapping[str, Any]
    object_bytes: int
    staging_objects: int = DEFAULT_STAGING_OBJECTS
    lock_ttl_s: float = DEFAULT_LOCK_TTL_S
    lookup_timeout_s: float = DEFAULT_LOOKUP_TIMEOUT_S


def _positive_number(params: Mapping[str, Any], key: str, default: float) -> float:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"adapter_params.{key} must be a number of seconds > 0, got {value!r}")
    return float(value)


def parse_params(params: Any) -> AdapterParams:
    """Check LMCache's ``adapter_params`` dict and return :class:`AdapterParams`.

    Raises:
        ValueError: not a mapping, an unknown key (with a "did you mean"),
            ``tier`` missing or not an object with a ``type``, or a value of
            the wrong type or range; the message names the key.
    """
    if not isinstance(params, Mapping):
        raise ValueError(f"adapter_params must be a JSON object, got {type(params).__name__}")
    unknown = sorted(set(params) - set(PARAM_KEYS))
    if unknown:
        hints = [f"{k!r} (did you mean {m!r}?)" if (m := closest_name(k, PARAM_KEYS)) else repr(k) for k in unknown]
        raise ValueError(f"unknown adapter_params key {', '.join(hints)}; known keys: {', '.join(PARAM_KEYS)}")
    tier = params.get("tier")
    if not isinstance(tier, Mapping) or not isinstance(tier.get("type"), str):
        raise ValueError(
            'adapter_params.tier must be a tier entry such as {"type": "fs", "root": "/mnt/kv"}, '
            f"got {'an object without a type' if isinstance(tier, Mapping) else repr(tier)}"
        )
    refuse_admission(tier, "adapter_params.tier", "LMCache")
    object_bytes = size_value(
        params.get("object_bytes"), "adapter_params.object_bytes", 1, "the largest LMCache object"
    )
    staging = params.get("staging_objects", DEFAULT_STAGING_OBJECTS)
    if isinstance(staging, bool) or not isinstance(staging, int) or staging < 1:
        raise ValueError(f"adapter_params.staging_objects must be an integer >= 1, got {staging!r}")
    return AdapterParams(
        tier=tier,
        object_bytes=object_bytes,
        staging_objects=staging,
        lock_ttl_s=_positive_number(params, "lock_ttl_s", DEFAULT_LOCK_TTL_S),
        lookup_timeout_s=_positive_number(params, "lookup_timeout_s", DEFAULT_LOOKUP_TIMEOUT_S),
    )


def stack_config(params: AdapterParams) -> dict[str, Any]:
    """The tiering config of the stack the adapter opens: its tier in the LMCache namespace, one staging row a block.

    The adapter builds its spec from it, and ``tiering check`` / ``ls`` / ``stat`` / ``verify`` read LMCache's
    ``--l2-adapter`` object through it (:func:`read_l2_adapter`, an entry point of ``tiering.config_forms``),
    so they open the very namespace the adapter stores in (``model`` = ``lmcache``, rows of
    :func:`~tiering.lmcache.keys.row_bytes` of ``object_bytes``).
    """
    config = namespace_config(params.object_bytes)
    return {
        **config,
        "cpu_bytes_to_use": params.staging_objects * config["block_bytes"],
        "secondary_tiers": [dict(params.tier)],
    }


ADAPTER_MODULE = "tiering.lmcache.adapter"
"""The ``module_path`` of this adapter in LMCache's ``--l2-adapter`` object."""


def read_l2_adapter(raw: Any) -> tuple[dict[str, Any], str] | None:
    """LMCache's ``--l2-adapter`` object for this adapter as the tiering config of the stack it opens; else None.

    The ``tiering.config_forms`` entry point of this distribution: :func:`tiering.core.configfile.load_config`
    asks it of every config file, so ``tiering check / ls / stat / verify / gc`` take the adapter's JSON.

    Returns:
        ``(``:func:`stack_config` ``, a line saying how the file was read)``, or None for another object.

    Raises:
        ValueError: a bad ``adapter_params`` (named, as :func:`parse_params` does).
    """
    if not isinstance(raw, Mapping) or raw.get("module_path") != ADAPTER_MODULE or "adapter_params" not in raw:
        return None
    config = stack_config(parse_params(raw["adapter_params"]))
    fields = ", ".join(f"{k}={config[k]}" for k in ("model", "kv_layout", "block_bytes"))
    return config, (
        "LMCache's --l2-adapter object: read as the stack tiering's adapter opens (adapter_params.tier as "
        f"secondary_tiers[0], in the adapter's namespace: {fields})"
    )
