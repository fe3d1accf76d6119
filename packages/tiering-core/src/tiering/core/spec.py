"""The offloading spec: block geometry, namespace and raw config of a tier stack.

The shape follows vLLM's ``OffloadingSpec`` / ``TieringOffloadingSpec``
(``vllm/v1/kv_offload``): one object built from the JSON a user writes in
``kv_connector_extra_config``, handed to every tier. This module holds
the kernel's part: the geometry, the namespace and the keys every spec reads;
:class:`~tiering.core.runtime.tiering_spec.TieringOffloadingSpec` (the spec
that builds a stack) is the runtime's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from tiering.core.format import FORMAT_VERSION, NAMESPACE_DIGEST_BYTES
from tiering.core.redact import redact_config
from tiering.core.registry import closest_name
from tiering.core.units import size_value

SPEC_KEYS = frozenset(
    {
        "spec_name",
        "spec_module_path",
        "cpu_bytes_to_use",
        "block_size",
        "block_bytes",
        "model",
        "model_revision",
        "kv_dtype",
        "kv_layout",
        "rank",
        "world_size",
        "eviction_policy",
        "cache_policy_module_path",
        "secondary_tiers",
        "tenant_secret",
    }
)
"""Keys tiering reads from the offloading config (a subclass adds its own: :attr:`OffloadingSpec.config_keys`)."""

VLLM_KEYS = frozenset(
    {
        "blocks_per_chunk",
        "tier_poll_interval_s",
        "backpressure",
        "store_threshold",
        "max_tracker_size",
        "offload_prompt_only",
        "self_describing_kv_events",
        "canonical_layout",
    }
)
"""Keys of vLLM 0.33's ``kv_connector_extra_config`` that vLLM itself reads:
accepted and ignored standalone, so one config serves both."""

DEFAULT_BLOCK_SIZE = 16
DEFAULT_BLOCK_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class Namespace:
    """Everything that changes a block's bytes for the same key.

    Two stacks whose namespaces differ in any field never read each other's
    blocks: persistent tiers store blocks under :attr:`digest`.

    Attributes:
        model: model id (e.g. ``"meta-llama/Llama-3.1-8B"``).
        revision: model revision (commit, tag or ``"main"``).
        kv_dtype: KV-cache dtype name (``"bfloat16"``, ``"float8_e4m3fn"``...).
        kv_layout: the byte layout of a block inside a primary slot (see
            :mod:`tiering.core.transfer`), e.g. ``"layer-major/kv-nhd"``.
        block_size: tokens per block.
        block_bytes: bytes per block, all layers.
        rank: this worker's tensor/pipeline-parallel rank.
        world_size: number of workers.
        format_version: :data:`tiering.core.format.FORMAT_VERSION`.
    """

    model: str
    revision: str
    kv_dtype: str
    kv_layout: str
    block_size: int
    block_bytes: int
    rank: int = 0
    world_size: int = 1
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        """All fields, in clear text (what ``namespace.json`` files hold)."""
        return dataclasses.asdict(self)

    @staticmethod
    def config_keys(fields: Mapping[str, Any]) -> dict[str, Any]:
        """The offloading-config keys that give back the namespace of ``fields`` (a ``namespace.json``).

        An engine binding sets them from the engine's config when it starts (the vLLM binding: the model, dtype,
        row layout and size), so a config file alone does not say them; ``tiering stat --namespace DIGEST``
        reads them from the root instead.

        Raises:
            ValueError: a field is missing (a ``namespace.json`` of another format); the message names it.
        """
        keys = {"model": "model", "model_revision": "revision", "kv_dtype": "kv_dtype", "kv_layout": "kv_layout"}
        keys.update({name: name for name in ("block_size", "block_bytes", "rank", "world_size")})
        missing = [field for field in keys.values() if field not in fields]
        if missing:
            raise ValueError(f"namespace.json lacks {', '.join(missing)}: written by another format of tiering")
        return {key: fields[field] for key, field in keys.items()}

    @property
    def digest_bytes(self) -> bytes:
        """SHA-256 of the canonical JSON of :meth:`to_dict`, first 16 bytes."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).digest()[:NAMESPACE_DIGEST_BYTES]

    @property
    def digest(self) -> str:
        """:attr:`digest_bytes` as 32 hex characters (directory and prefix names)."""
        return self.digest_bytes.hex()


def _int_key(config: Mapping[str, Any], key: str, default: int | None, minimum: int, why: str = "") -> int:
    """``config[key]`` as an int >= ``minimum``; ``why`` says where the minimum comes from (in the message)."""
    value = config.get(key, default)
    if value is None:
        raise ValueError(f"config key {key!r} is required")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        because = f" ({why})" if why else ""
        raise ValueError(f"config key {key!r} must be an integer >= {minimum}{because}, got {value!r}")
    return value


def _bytes_key(config: Mapping[str, Any], key: str, default: int | None, minimum: int, why: str = "") -> int:
    """:func:`_int_key` for a byte count, which may also be written with a unit (``"4GiB"``, ``"500MB"``)."""
    value = config.get(key, default)
    if value is None:
        raise ValueError(f"config key {key!r} is required")
    return size_value(value, f"config key {key!r}", minimum, why)


def _str_key(config: Mapping[str, Any], key: str, default: str) -> str:
    value = config.get(key, default)
    if not isinstance(value, str) or not value:
        raise ValueError(f"config key {key!r} must be a non-empty string, got {value!r}")
    return value


class OffloadingSpec:
    """Block geometry, namespace and raw configuration of a tier stack.

    Config keys read here (all optional but ``cpu_bytes_to_use``):

    - ``cpu_bytes_to_use`` (int, bytes): size of the primary tier's host buffer.
    - ``block_size`` (int, tokens, default 16) and ``block_bytes`` (int,
      bytes per block for all layers, default 65536; an engine binding
      supplies the real figure).
    - Both byte counts may be written with a unit (``"4GiB"``, ``"500MB"``;
      :func:`tiering.core.units.size_value`).
    - ``model`` (default ``"unknown"``), ``model_revision`` (``"main"``),
      ``kv_dtype`` (``"bfloat16"``), ``kv_layout`` (``"opaque"``), ``rank`` (0),
      ``world_size`` (1): namespace fields.

    Args:
        extra_config: the JSON object (vLLM's ``kv_connector_extra_config`` shape).
        engine_config: the engine's own config object, kept reachable as
            :attr:`engine_config` (vLLM passes its ``VllmConfig`` / ``OffloadingConfig``).
        strict: reject keys that neither tiering nor vLLM reads (a typo such
            as ``secondary_tier``); an engine binding, which passes the
            engine's whole config, turns it off.

    Raises:
        ValueError: a key has the wrong type or range, or (strict) is unknown; the message names it.
    """

    config_keys: ClassVar[frozenset[str]] = SPEC_KEYS
    """The keys this spec reads (strict mode refuses any other that vLLM does not read either)."""

    def __init__(self, extra_config: Mapping[str, Any], engine_config: Any = None, *, strict: bool = True) -> None:
        if not isinstance(extra_config, Mapping):
            raise ValueError(f"offloading config must be a JSON object, got {type(extra_config).__name__}")
        known = type(self).config_keys
        unknown = sorted(set(extra_config) - known - VLLM_KEYS)
        if unknown and strict:
            hints = [
                f"{key!r} (did you mean {match!r}?)" if (match := closest_name(key, known)) else repr(key)
                for key in unknown
            ]
            raise ValueError(f"unknown config key {', '.join(hints)}; known keys: {', '.join(sorted(known))}")
        self.extra_config: Mapping[str, Any] = extra_config
        self.engine_config = engine_config
        self.block_size = _int_key(extra_config, "block_size", DEFAULT_BLOCK_SIZE, 1)
        self.block_bytes = _bytes_key(extra_config, "block_bytes", DEFAULT_BLOCK_BYTES, 1)
        self.cpu_bytes_to_use = _bytes_key(
            extra_config,
            "cpu_bytes_to_use",
            None,
            self.block_bytes,
            f"the primary tier must hold at least one block of block_bytes {self.block_bytes}",
        )
        self.num_primary_blocks = self.cpu_bytes_to_use // self.block_bytes
        self.namespace = Namespace(
            model=_str_key(extra_config, "model", "unknown"),
            revision=_str_key(extra_config, "model_revision", "main"),
            kv_dtype=_str_key(extra_config, "kv_dtype", "bfloat16"),
            kv_layout=_str_key(extra_config, "kv_layout", "opaque"),
            block_size=self.block_size,
            block_bytes=self.block_bytes,
            rank=_int_key(extra_config, "rank", 0, 0),
            world_size=_int_key(extra_config, "world_size", 1, 1),
        )

    def __repr__(self) -> str:
        """The class, namespace digest and config, credentials redacted (:func:`tiering.core.redact.redact_config`)."""
        return f"{type(self).__name__}(digest={self.namespace.digest!r}, config={redact_config(self.extra_config)!r})"
