"""The sizes ``tiering check`` echoes for a config: each tier's caps, pin bound and tenants' quotas, with warnings.

- :func:`size_lines`: every size key of one tier entry, as resolved (bytes and binary units, "the default"
  where the entry left it out), each tenant's ``quota_bytes``; then warnings: a quota above the cap, a size
  written with a decimal unit (``"4GB"``: says the binary value and the integer to write).
- :func:`spec_size_warnings`: the same decimal-unit warning for the spec's own sizes.
- :func:`sized_by_engine`: whether the engine sets the config's block size (a vLLM config without
  ``block_bytes``), so no bound can be compared with one block yet.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tiering.core.configfile import VLLM_SPEC
from tiering.core.declared import tenant_quotas
from tiering.core.units import decimal_unit_note, format_bytes

__all__ = ["size_lines", "sized_by_engine", "spec_size_warnings"]


def sized_by_engine(path: str) -> bool:
    """Whether the engine sets the block size of the config at ``path`` (no bound is compared with a block then).

    That is a config for the vLLM binding (a ``--kv-transfer-config`` object, or one naming its spec) without
    ``block_bytes``, which the binding computes from the model when the engine starts.
    """
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return False
    inner = raw.get("kv_connector_extra_config") if isinstance(raw, dict) else None
    config = inner if isinstance(inner, dict) else raw
    engine = isinstance(inner, dict) or (isinstance(config, dict) and config.get("spec_name") == VLLM_SPEC[0])
    return engine and isinstance(config, dict) and "block_bytes" not in config


def _shown(n: int) -> str:
    """``"268435456 bytes (256.0 MiB)"``."""
    return f"{n} bytes ({format_bytes(n)})"


def size_lines(label: str, schema: Any, entry: Mapping[str, Any], values: Mapping[str, Any]) -> list[str]:
    """What ``tiering check`` echoes of one tier's sizes: every size key, the tenants' quotas, and warnings.

    Args:
        label: the entry label (``"secondary_tiers[0]"``).
        schema: the tier's :class:`~tiering.core.schema.ConfigSchema`.
        entry: the entry as the config wrote it (``"4GB"`` still a string).
        values: the entry as the schema normalized it (integers of bytes, defaults filled in).

    Returns:
        Lines such as ``"  capacity_bytes: 268435456 bytes (256.0 MiB; the default)"``, then warning lines
        (``"warning: secondary_tiers[0].tenants.default.quota_bytes: ... is above capacity_bytes ..."``).
    """
    lines, warnings = [], []
    for name, key in schema.keys.items():
        if not key.size:
            continue
        value = values.get(name)
        what = "no bound" if value is None else "pinning off" if name == "max_pinned_bytes" and value == 0 else ""
        shown = "none" if value is None else str(value) if what else f"{value} bytes"
        what = "; ".join(w for w in (what or ("" if value is None else format_bytes(value)),
                                     "" if name in entry else "the default") if w)  # fmt: skip
        lines.append(f"  {name}: {shown} ({what})")
        note = decimal_unit_note(entry[name]) if isinstance(entry.get(name), str) else None
        if note:
            warnings.append(f"warning: {label}.{name}: {note}")
    cap = values.get("capacity_bytes")
    raw_tenants = entry.get("tenants")
    for where, quota in tenant_quotas(values.get("tenants")):
        lines.append(f"  tenants.{where}: {_shown(quota)}")
        if isinstance(cap, int) and quota > cap:
            warnings.append(
                f"warning: {label}.tenants.{where}: {_shown(quota)} is above capacity_bytes ({_shown(cap)}); "
                "the cap evicts first, so the quota is never reached"
            )
    for where, raw in _raw_quotas(raw_tenants):
        note = decimal_unit_note(raw)
        if note:
            warnings.append(f"warning: {label}.tenants.{where}: {note}")
    return lines + warnings


def _raw_quotas(tenants: Any) -> list[tuple[str, str]]:
    """``(key path, text)`` of each ``quota_bytes`` written as a string in a ``tenants`` value."""
    if not isinstance(tenants, Mapping):
        return []
    overrides = tenants.get("overrides")
    limits = [("default", tenants.get("default"))]
    limits += [(f"overrides.{n}", v) for n, v in overrides.items()] if isinstance(overrides, Mapping) else []
    return [
        (f"{where}.quota_bytes", v["quota_bytes"])
        for where, v in limits
        if isinstance(v, Mapping) and isinstance(v.get("quota_bytes"), str)
    ]


def spec_size_warnings(config: Mapping[str, Any]) -> list[str]:
    """Warnings for the spec's own sizes written with a decimal unit (``"cpu_bytes_to_use": "4GB"``)."""
    return [
        f"warning: {key}: {note}"
        for key, value in config.items()
        if key.endswith("_bytes") or key == "cpu_bytes_to_use"
        for note in [decimal_unit_note(value) if isinstance(value, str) else None]
        if note
    ]
