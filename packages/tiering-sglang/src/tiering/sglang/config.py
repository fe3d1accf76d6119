"""SGLang's extra config for the tiering backend, and the namespace of SGLang's pages (no SGLang import).

The backend reads these keys of ``--hicache-storage-backend-extra-config``:

- ``backend_name``, ``module_path``, ``class_name``: SGLang's own (they select the class);
- ``interface_v1`` (0 or 1): SGLang's switch between the zero-copy calls
  (``batch_get_v1`` / ``batch_set_v1``, page buffers of the host pool) and
  the flat-page calls (``batch_get`` / ``batch_set``); it is part of the
  namespace, since the two write a page's bytes in different orders;
- ``tiering``: the tiering config as users write it for vLLM or ``tiering
  bench`` (an object with ``secondary_tiers``, optionally ``cpu_bytes_to_use``
  and ``model_revision``), or the path of a JSON file holding one
  (:func:`tiering.core.configfile.load_config`: a whole vLLM
  ``--kv-transfer-config`` file works too);
- ``tiering_job_timeout_s`` (seconds, default 120): how long one blocking
  call waits for a tier's job before it reports the pages failed.

``cpu_bytes_to_use`` sizes the staging buffer the tiers read and write (at
least one page; default :data:`DEFAULT_STAGING_PAGES` pages). Keys SGLang
decides (the page geometry, dtype, layout, ranks) are refused; keys only vLLM
reads are ignored, so one file can serve both engines.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from tiering.core.configfile import load_config
from tiering.core.factory import resolve_tier
from tiering.core.fields import structured
from tiering.core.policies.admission import refuse_admission
from tiering.core.registry import closest_name
from tiering.core.spec import VLLM_KEYS

logger = logging.getLogger(__name__)

ENGINE = "sglang"
"""The engine name every namespace of this binding starts with (``kv_layout`` ``sglang/...``)."""

SGLANG_KEYS = frozenset(
    {
        "backend_name",
        "module_path",
        "class_name",
        "interface_v1",
        "prefetch_threshold",
        "prefetch_timeout_base",
        "prefetch_timeout_per_ki_token",
        "hicache_storage_pass_prefix_keys",
        "tp_lcm_size",
    }
)
"""Keys of the extra config that SGLang itself reads (it removes most before the backend sees them)."""
OWN_KEYS = frozenset({"tiering", "tiering_job_timeout_s"})
"""Keys of the extra config that this backend reads."""

DECIDED_KEYS = ("block_size", "block_bytes", "kv_dtype", "kv_layout", "rank", "world_size")
"""Tiering config keys SGLang decides (from its host pool and ranks): refused in the ``tiering`` config."""
IGNORED_KEYS = VLLM_KEYS | {"spec_name", "spec_module_path", "eviction_policy", "cache_policy_module_path"}
"""Tiering config keys only vLLM's binding reads: ignored here, so one file serves both engines."""

DEFAULT_STAGING_PAGES = 64
DEFAULT_TIMEOUT_S = 120.0


@dataclasses.dataclass(frozen=True)
class BackendConfig:
    """The backend's part of SGLang's extra config, checked.

    Attributes:
        tiering: the tiering config (``secondary_tiers``, optional
            ``cpu_bytes_to_use``, ``model``, ``model_revision``), ignored keys removed.
        interface_v1: SGLang calls the zero-copy interface (``interface_v1``: 1).
        timeout_s: seconds one call waits for a tier's job (> 0).
    """

    tiering: dict[str, Any]
    interface_v1: bool
    timeout_s: float


def parse_extra_config(extra_config: Mapping[str, Any] | None) -> BackendConfig:
    """Check SGLang's extra config and read the tiering config it holds or names.

    Every tier entry is resolved and checked against its schema, nothing is built.

    Raises:
        ValueError: a key is unknown (with a "did you mean"), ``tiering`` is
            missing or not an object or a readable JSON file, a key SGLang
            decides is set, ``secondary_tiers`` is empty, or a value is wrong;
            the message names the key.
        TypeError, ImportError: a tier entry names no usable tier (named ``secondary_tiers[N]``).
    """
    extra = dict(extra_config or {})
    known = SGLANG_KEYS | OWN_KEYS
    for key in sorted(set(extra) - known):
        match = closest_name(key, known)
        hint = f" (did you mean {match!r}?)" if match else ""
        raise ValueError(f"HiCache extra config: unknown key {key!r}{hint}; known keys: {', '.join(sorted(known))}")
    interface_v1 = extra.get("interface_v1", 0)
    if interface_v1 not in (0, 1) or isinstance(interface_v1, float):
        raise ValueError(f"HiCache extra config: 'interface_v1' must be 0 or 1, got {interface_v1!r}")
    timeout_s = extra.get("tiering_job_timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ValueError(f"HiCache extra config: 'tiering_job_timeout_s' must be seconds > 0, got {timeout_s!r}")
    return BackendConfig(tiering_config(extra.get("tiering")), bool(interface_v1), float(timeout_s))


def tiering_config(value: Any) -> dict[str, Any]:
    """The tiering config given as the ``tiering`` key: an object, or the path of a JSON file.

    Raises:
        ValueError, TypeError, ImportError: see :func:`parse_extra_config`.
    """
    if value is None:
        raise ValueError(
            "HiCache extra config: key 'tiering' is required: the tiering config "
            '(e.g. {"secondary_tiers": [{"type": "fs", "root": "/mnt/kv"}]}) or the path of a JSON file holding it'
        )
    if isinstance(value, str):
        notes: list[str] = []
        config = load_config(value, notes)
        for line in notes:
            logger.info("tiering config %s: %s", value, line)
    elif isinstance(value, Mapping):
        config = dict(value)
    else:
        raise ValueError(f"HiCache extra config: 'tiering' must be an object or a file path, got {value!r}")
    for key in DECIDED_KEYS:
        if key in config:
            raise ValueError(f"tiering config: key {key!r} is decided by SGLang (its host pool and ranks); remove it")
    ignored = sorted(set(config) & IGNORED_KEYS)
    if ignored:
        logger.info("tiering config: keys %s are vLLM's; ignored under SGLang", ", ".join(ignored))
    config = {k: v for k, v in config.items() if k not in IGNORED_KEYS}
    tiers = config.get("secondary_tiers")
    if not isinstance(tiers, list) or not tiers:
        raise ValueError("tiering config: 'secondary_tiers' must be a non-empty list of tier entries")
    for index, entry in enumerate(tiers):
        resolve_tier(entry, index)
        refuse_admission(entry, f"secondary_tiers[{index}]", "SGLang's HiCache (its --hicache-write-policy)")
    return config


@dataclasses.dataclass(frozen=True)
class Ranks:
    """Where this SGLang worker sits: SGLang's ``HiCacheStorageConfig`` fields the namespace needs.

    Attributes:
        tp_rank, tp_size: (attention) tensor-parallel rank and size.
        pp_rank, pp_size: pipeline-parallel stage and stages.
        cp_rank, cp_size: attention context-parallel rank and size.
        is_mla: the KV cache is replicated across TP ranks (MLA): one copy for
            all of them (SGLang lets only rank 0, its storage writer, back pages up).
    """

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    cp_rank: int = 0
    cp_size: int = 1
    is_mla: bool = False

    @property
    def writer(self) -> bool:
        """Whether this rank is SGLang's storage writer (every rank; only rank 0 with MLA): it clears the namespace."""
        return not self.is_mla or self.tp_rank == 0


def kv_layout(ranks: Ranks, layout: str, interface_v1: bool) -> str:
    """The namespace's ``kv_layout`` of SGLang pages: JSON text of its fields (:func:`~tiering.core.fields.structured`).

    E.g. ``{"engine":"sglang","layout":"layer_first","pages":"page-buffers","tp":"0of2","pp":"0of1","cp":"0of1"}``.
    Its ``engine`` is ``sglang``, which no vLLM layout's is, so SGLang's
    pages and vLLM's blocks never share a namespace. With MLA ``tp`` is
    ``mla`` (one copy for every TP rank).
    """
    return structured(
        {
            "engine": ENGINE,
            "layout": layout,
            "pages": "page-buffers" if interface_v1 else "flat-page",
            "tp": "mla" if ranks.is_mla else f"{ranks.tp_rank}of{ranks.tp_size}",
            "pp": f"{ranks.pp_rank}of{ranks.pp_size}",
            "cp": f"{ranks.cp_rank}of{ranks.cp_size}",
        }
    )


def spec_config(
    config: BackendConfig,
    ranks: Ranks,
    *,
    model: str | None,
    dtype: str,
    layout: str,
    page_size: int,
    page_bytes: int,
) -> dict[str, Any]:
    """The config of the tiering spec for SGLang's pages: one block per page, SGLang's namespace fields.

    Args:
        config: the checked backend config.
        ranks: this worker's ranks.
        model: SGLang's model name for storage (None: the ``model`` of the tiering config, else ``"unknown"``).
        dtype: the host pool's dtype name (``"bfloat16"``).
        layout: the host pool's layout (``"layer_first"``, ``"page_first"``...).
        page_size: tokens per page.
        page_bytes: bytes per page (all layers, K and V).

    Raises:
        ValueError: the tiering config's ``model`` differs from SGLang's.
    """
    tiering = dict(config.tiering)
    own_model = tiering.pop("model", None)
    if model and own_model is not None and own_model != model:
        raise ValueError(f"tiering config: 'model' is {own_model!r} but SGLang serves {model!r}; remove the key")
    tiering.setdefault("cpu_bytes_to_use", DEFAULT_STAGING_PAGES * page_bytes)
    return {
        **tiering,
        "model": model or own_model or "unknown",
        "kv_dtype": dtype,
        "kv_layout": kv_layout(ranks, layout, config.interface_v1),
        "block_size": page_size,
        "block_bytes": page_bytes,
        "rank": 0 if ranks.is_mla else ranks.tp_rank,
        "world_size": 1 if ranks.is_mla else ranks.tp_size,
    }
