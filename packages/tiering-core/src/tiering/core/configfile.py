"""Config files and tier entries as the ``tiering`` command reads, checks and shows them.

- :func:`load_config`: a JSON file (a whole ``--kv-transfer-config`` object is
  unwrapped to its ``kv_connector_extra_config``); tier entries written in the
  vLLM binding's form (``"type": "tiering_fs"``, ``"module_path":
  "tiering.core.vllm.tiers"``) are read as the plain tier (``"fs"``), and the
  binding's spec (``"spec_name": "TieringSpec"``) as tiering's, with one line
  saying so, without importing vLLM; the keys the binding consumes
  (``model_revision``, ``locality``, ...) are checked as the binding's.
- :func:`install_hint`: the published and the from-a-clone install forms.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from tiering.core.factory import SecondaryTierFactory, entry_policies
from tiering.core.schema import ConfigKey, ConfigSchema
from tiering.core.units import parse_size

VLLM_TIERS_MODULE = "tiering.core.vllm.tiers"
"""The ``module_path`` of the vLLM binding's tier names."""

VLLM_PREFIX = "tiering_"

# The keys of a vLLM-form tier entry that belong to the binding (or to vLLM), not to the tiering tier:
# ``type``/``module_path`` select the class in vLLM's factory; BINDING_KEYS are consumed by the binding's
# wrapper (tiering.core.vllm.tier) and by vLLM; every other key is the tiering tier's own. Declared here,
# without importing vLLM, so ``tiering check`` validates a vLLM config without vLLM installed.

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
    other = _other_form(path, config)
    if other is not None:
        config, lines = other
        _note(lines, notes)
        return config
    wrapped = isinstance(config, dict) and isinstance(config.get("kv_connector_extra_config"), dict)
    if wrapped:
        config = config["kv_connector_extra_config"]
    if not isinstance(config, dict):
        raise ValueError(f"config {path} must hold a JSON object")
    if wrapped or config.get("spec_name") == VLLM_SPEC[0]:
        _check_vllm_byte_counts(path, config)
    _note(plain_spec(config) + plain_tier_entries(config), notes)
    return config


def _note(lines: list[str], notes: list[str] | None) -> None:
    """Give what :func:`load_config` says of the file to ``notes``, or print it to stderr when None."""
    if notes is None:
        for line in lines:
            print(line, file=sys.stderr)
    else:
        notes.extend(lines)


CONFIG_FORMS_GROUP = "tiering.config_forms"
"""Entry-point group of readers of other programs' config objects (an engine's adapter JSON): each is called
with the file's JSON value and returns ``(tiering config, a line saying how it was read)``, or None when the
value is not its form. Core names no adapter: the adapter's distribution declares its reader."""


def _other_form(path: str, raw: Any) -> tuple[dict[str, Any], list[str]] | None:
    """The tiering config of ``raw`` when an installed reader (:data:`CONFIG_FORMS_GROUP`) knows its form.

    Raises:
        ValueError: a reader refused the value (its message), or ``raw`` is an adapter's object (it has
            ``adapter_params``) that no installed reader knows: the message names its ``module_path``.
    """
    for entry_point in entry_points(group=CONFIG_FORMS_GROUP):
        found = entry_point.load()(raw)
        if found is not None:
            config, line = found
            return config, [f"config {path}: {line}"]
    if isinstance(raw, dict) and "adapter_params" in raw:
        raise ValueError(
            f"config {path} is an engine's adapter object (it has adapter_params) for module_path "
            f"{raw.get('module_path')!r}, which no installed distribution reads as a tiering config: install the "
            "distribution of that adapter beside the tiering command"
        )
    return None


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
    ``backpressure``: :data:`BINDING_KEYS`) are
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
        entry_policies().refuse_admission(own, f"secondary_tiers[{index}]", "vLLM's own manager")
        tiers[index] = {"type": plain, **{k: v for k, v in own.items() if k not in ("type", "module_path")}}
        line = (
            f"secondary_tiers[{index}]: {name!r} with module_path {VLLM_TIERS_MODULE!r} is the vLLM binding's "
            f'form of tier {plain!r}; checked as "type": {plain!r}'
        )
        if binding:
            line += f"; binding keys {', '.join(sorted(binding))} checked (the binding's and vLLM's, not the tier's)"
        lines.append(line)
    return lines
