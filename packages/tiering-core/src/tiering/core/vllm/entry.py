"""The keys of a vLLM-form tier entry that belong to the binding (or to vLLM), not to the tiering tier.

A ``secondary_tiers`` entry written for vLLM (``"type": "tiering_fs",
"module_path": "tiering.core.vllm.tiers"``) mixes three kinds of keys:

- ``type`` and ``module_path``: vLLM's factory selects the class with them;
- :data:`BINDING_KEYS`: consumed by the binding's wrapper
  (:class:`tiering.core.vllm.tier.TieringSecondaryTier`) and by vLLM
  (``backpressure``, which vLLM's factory pops before calling the tier);
- everything else: the tiering tier's own keys, checked against its schema.

:func:`split_binding_keys` separates and checks the binding's keys, so
``tiering check`` validates a vLLM config without vLLM installed (importing
this module imports nothing from vLLM).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tiering.core.schema import ConfigKey, ConfigSchema

LOCALITIES = ("LOCAL", "REMOTE")
"""vLLM's ``Locality`` values (``vllm.v1.kv_offload``); the binding passes them to ``Locality(...)`` unchanged."""

BINDING_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "model_revision",
        (str,),
        non_empty=True,
        doc="the model revision in tiering's namespace (vLLM's config does not carry it)",
    ),
    ConfigKey("kv_layout", (str,), non_empty=True, doc="the KV layout name in tiering's namespace"),
    ConfigKey("locality", (str,), choices=LOCALITIES, doc="vLLM's Locality of the tier (tier filter, KV events)"),
    ConfigKey("enable_kv_events", (bool,), default=False, doc="publish the tier's KV events to vLLM"),
    ConfigKey("backpressure", (dict,), doc="vLLM's own backpressure block, consumed by vLLM's factory"),
)
"""Every key of a vLLM-form tier entry that does not reach the tiering tier (``type``/``module_path`` aside)."""

WRAPPER_KWARGS: tuple[str, ...] = tuple(k.name for k in BINDING_KEYS if k.name != "backpressure")
"""The binding keys the wrapper itself receives as keyword arguments (vLLM pops ``backpressure`` first)."""


def split_binding_keys(
    entry: Mapping[str, Any], tier_type: str, label: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate a vLLM-form entry's binding keys from the tier's own, checking the binding's values.

    Args:
        entry: the tier entry (``type``/``module_path`` may be present; they go with the tier's keys).
        tier_type: the entry's ``type`` as written (``"tiering_fs"``), for messages.
        label: the entry's label (``"secondary_tiers[0]"``), for messages.

    Returns:
        ``(binding keys given, every other key)``.

    Raises:
        InvalidTypeError, InvalidValueError: a binding key's value is wrong (the message names
            ``secondary_tiers[N].<key>`` and what a valid value looks like).
    """
    schema = ConfigSchema(tier_type, BINDING_KEYS)
    binding = {k: v for k, v in entry.items() if k in schema.keys}
    for key, value in binding.items():
        schema.check_value(key, value, label)
    return binding, {k: v for k, v in entry.items() if k not in schema.keys}
