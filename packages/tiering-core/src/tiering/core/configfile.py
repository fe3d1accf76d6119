"""Config files and tier entries as the ``tiering`` command reads, checks and shows them.

- :func:`load_config`: a JSON file (a whole ``--kv-transfer-config`` object is
  unwrapped to its ``kv_connector_extra_config``); tier entries written in the
  vLLM binding's form (``"type": "tiering_fs"``, ``"module_path":
  "tiering.core.vllm.tiers"``) are read as the plain tier (``"fs"``), and the
  binding's spec (``"spec_name": "TieringSpec"``) as tiering's, with one line
  saying so, without importing vLLM; the keys the binding consumes
  (``model_revision``, ``locality``, ...) are checked as the binding's.
- :func:`redact_text`: every error text the command prints goes through
  :mod:`tiering.core.redact`, with the secret keys each tier declares in its
  schema (whole configs go through
  :func:`tiering.core.factory.redact_offloading_config`).
- :func:`install_hint`: the published and the from-a-clone install forms.
- :func:`size_lines`: the sizes a tier entry resolved to (caps, pin bound, tenants' quotas), as ``tiering
  check`` echoes them, with warnings (a quota above the cap, a decimal unit such as ``"4GB"``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from tiering.core import redact
from tiering.core.admission import refuse_admission
from tiering.core.factory import SecondaryTierFactory
from tiering.core.toolkit.declared import tenant_quotas
from tiering.core.units import decimal_unit_note, format_bytes, parse_size
from tiering.core.vllm.entry import split_binding_keys

VLLM_TIERS_MODULE = "tiering.core.vllm.tiers"
"""The ``module_path`` of the vLLM binding's tier names."""

VLLM_PREFIX = "tiering_"


def install_hint(dist: str, extra: str | None = None) -> str:
    """How to install a distribution: ``pip install tiering-fs`` and, from a clone, ``pip install ./packages/...``.

    Args:
        dist: the distribution name (``"tiering-fs"``).
        extra: an optional extra (``"plot"``).
    """
    suffix = f"[{extra}]" if extra else ""
    published = f"'{dist}{suffix}'" if extra else dist
    local = f"'./packages/{dist}{suffix}'" if extra else f"./packages/{dist}"
    return f"pip install {published} (from a clone of the repository: pip install {local})"


def documentation_url(page: str = "") -> str:
    """The ``Documentation`` URL of tiering-core's metadata (``[project.urls]``), with ``page`` appended."""
    from importlib.metadata import PackageNotFoundError, metadata

    try:
        urls = metadata("tiering-core").get_all("Project-URL") or []
    except PackageNotFoundError:
        urls = []
    base = next((u.split(",", 1)[1].strip() for u in urls if u.lower().startswith("documentation,")), "")
    return f"{base.rstrip('/')}/{page}" if base else page


def load_config(path: str, notes: list[str] | None = None) -> dict[str, Any]:
    """Read a JSON config file; unwrap ``kv_connector_extra_config``; read vLLM-form tier entries as plain ones.

    Args:
        path: the file.
        notes: receives one line per tier entry rewritten from the vLLM form;
            when None, the lines are printed to stderr.

    Raises:
        ValueError: a directory (the message points to ``--root``), an unreadable
            file, not a JSON object, or a vLLM-form entry naming no installed
            tier (the message names the file or entry).
    """
    if os.path.isdir(path):
        raise ValueError(
            f"config {path} is a directory, not a JSON config file; a tier's directory (what `tiering bench "
            f"--root DIR` wrote) is given as --root: tiering ls --root {path}"
        )
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read config {path}: {exc}") from exc
    wrapped = isinstance(config, dict) and isinstance(config.get("kv_connector_extra_config"), dict)
    if wrapped:
        config = config["kv_connector_extra_config"]
    if not isinstance(config, dict):
        raise ValueError(f"config {path} must hold a JSON object")
    if wrapped or config.get("spec_name") == VLLM_SPEC[0]:
        _check_vllm_byte_counts(path, config)
    lines = plain_spec(config) + plain_tier_entries(config)
    if notes is None:
        for line in lines:
            print(line, file=sys.stderr)
    else:
        notes.extend(lines)
    return config


def _check_vllm_byte_counts(path: str, config: dict[str, Any]) -> None:
    """Refuse a size with a unit where vLLM, not tiering, reads the key (vLLM takes an integer of bytes only).

    That is a config for the vLLM binding: a ``--kv-transfer-config`` object, or one naming its spec
    (``TieringSpec``), which vLLM's offloading connector builds from the same keys.
    """
    for key in VLLM_BYTE_KEYS:
        value = config.get(key)
        if not isinstance(value, str):
            continue
        try:
            hint = f"write {parse_size(value)}"
        except ValueError:
            hint = "write an integer of bytes"
        raise ValueError(
            f"config {path}: {key}: {value!r}: vLLM reads this key of kv_connector_extra_config itself "
            f"(a config for the vLLM binding's {VLLM_SPEC[0]}) and takes an integer of bytes only; {hint}"
        )


VLLM_BYTE_KEYS = ("cpu_bytes_to_use",)
"""Byte-count keys vLLM reads itself from ``kv_connector_extra_config``: an integer there, no unit."""


VLLM_SPEC = ("TieringSpec", "tiering.core.vllm.spec")
"""``(spec_name, spec_module_path)`` of the binding's spec for vLLM (:mod:`tiering.core.vllm.spec`, needs vLLM)."""


def plain_spec(config: dict[str, Any]) -> list[str]:
    """Rewrite, in place, the binding's vLLM spec (``TieringSpec`` of ``tiering.core.vllm.spec``) to tiering's own.

    That spec is vLLM's ``TieringOffloadingSpec`` plus a worker and needs vLLM
    to import; its keys are the ones tiering's ``TieringOffloadingSpec``
    checks, so the config is checked with that spec, without vLLM.

    Returns:
        One line saying so, or none when the config names another spec.
    """
    if (config.get("spec_name"), config.get("spec_module_path")) != VLLM_SPEC:
        return []
    del config["spec_module_path"]
    config["spec_name"] = "TieringOffloadingSpec"
    return [
        f"spec_name {VLLM_SPEC[0]!r} with spec_module_path {VLLM_SPEC[1]!r} is the vLLM binding's spec; "
        "its keys are checked as tiering's 'TieringOffloadingSpec' (without vLLM)"
    ]


def _plain_name(name: str) -> str | None:
    """The tiering tier name behind a vLLM binding name, or None."""
    known = SecondaryTierFactory.known_names()
    if name.startswith(VLLM_PREFIX):
        return name.removeprefix(VLLM_PREFIX)
    if name.startswith("Tiering"):
        wanted = name.removeprefix("Tiering").lower()
        return next((k for k in known if k.replace("_", "").replace("-", "").lower() == wanted), None)
    for known_name in known:  # a tiering tier's class name
        try:
            if SecondaryTierFactory.get_class(known_name).__name__ == name:
                return known_name
        except (ImportError, TypeError, ValueError, AttributeError):
            continue
    return None


def plain_tier_entries(config: dict[str, Any]) -> list[str]:
    """Rewrite, in place, every ``secondary_tiers`` entry of the vLLM binding's form to the plain form.

    ``{"type": "tiering_fs", "module_path": "tiering.core.vllm.tiers", ...}``
    becomes ``{"type": "fs", ...}``: the tier the binding would load inside
    vLLM, checked here without vLLM. The keys the binding or vLLM consume
    (``model_revision``, ``kv_layout``, ``locality``, ``enable_kv_events``,
    ``backpressure``: :data:`tiering.core.vllm.entry.BINDING_KEYS`) are
    checked here and removed from the entry, never passed to the tier's schema.

    Returns:
        One line per rewritten entry.

    Raises:
        ValueError: an entry of that form names no installed tiering tier, or a
            binding key's value is wrong (``secondary_tiers[N].<key>: ...``).
    """
    tiers = config.get("secondary_tiers")
    if not isinstance(tiers, list):
        return []
    lines = []
    for index, entry in enumerate(tiers):
        if not isinstance(entry, dict) or entry.get("module_path") != VLLM_TIERS_MODULE:
            continue
        name = entry.get("type")
        plain = _plain_name(name) if isinstance(name, str) else None
        if plain is None:
            known = ", ".join(VLLM_PREFIX + k for k in SecondaryTierFactory.known_names()) or "none installed"
            raise ValueError(
                f"secondary_tiers[{index}]: type {name!r} with module_path {VLLM_TIERS_MODULE!r} names no "
                f"installed tiering tier; the vLLM binding's names are {known}"
            )
        binding, own = split_binding_keys(entry, str(name), f"secondary_tiers[{index}]")
        refuse_admission(own, f"secondary_tiers[{index}]", "vLLM's own manager")
        tiers[index] = {"type": plain, **{k: v for k, v in own.items() if k not in ("type", "module_path")}}
        line = (
            f"secondary_tiers[{index}]: {name!r} with module_path {VLLM_TIERS_MODULE!r} is the vLLM binding's "
            f'form of tier {plain!r}; checked as "type": {plain!r}'
        )
        if binding:
            line += f"; binding keys {', '.join(sorted(binding))} checked (the binding's and vLLM's, not the tier's)"
        lines.append(line)
    return lines


def secret_keys(config: Any) -> frozenset[str]:
    """The secret key names declared by the schemas of the tiers a config names (installed ones)."""
    keys: set[str] = set()
    tiers = config.get("secondary_tiers") if isinstance(config, Mapping) else None
    for entry in tiers if isinstance(tiers, list) else []:
        name = entry.get("type") if isinstance(entry, Mapping) else None
        if not isinstance(name, str) or name not in SecondaryTierFactory.known_names():
            continue
        try:
            schema = SecondaryTierFactory.get_class(name).config_schema
        except (ImportError, TypeError, ValueError, AttributeError):
            continue
        if schema is not None:
            keys.update(schema.secret_keys)
    return frozenset(keys)


def redact_text(text: object, config: Any = None) -> str:
    """``str(text)`` without any credential (of ``config``, URL passwords, ``key=value`` secrets)."""
    return redact.redact_text(text, config, secret_keys(config) if config is not None else ())


def tier_location(tier_config: Mapping[str, Any], index: int = 0) -> str | None:
    """Where a tier entry keeps its blocks (its inspector's location, credentials redacted); None: nowhere."""
    from tiering.core.inspection import inspector_for

    inspector = inspector_for(tier_config, index)
    return None if inspector is None else redact_text(inspector.location(), {"secondary_tiers": [tier_config]})


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
        schema: the tier's :class:`~tiering.core.toolkit.config.ConfigSchema`.
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
