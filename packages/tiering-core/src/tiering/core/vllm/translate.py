"""Translation from vLLM's offloading spec to tiering's: the primary view, the namespace, lookup verdicts.

vLLM hands each secondary tier its ``OffloadingSpec`` (``config`` is an
``OffloadingConfig``) and a view of the primary tier's /dev/shm region;
tiering's tiers want a :class:`~tiering.core.spec.OffloadingSpec` and a
``(num_blocks, block_bytes)`` byte view. This module builds both, and maps
tiering's lookup verdict to vLLM's ``LookupResult``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import numbers
from typing import Any

from tiering.core.fields import structured
from tiering.core.primary.buffer import as_block_view
from tiering.core.spec import OffloadingSpec
from tiering.core.vllm.compat import LookupResult

logger = logging.getLogger(__name__)


def primary_block_view(primary_kv_view: memoryview, vllm_spec: Any) -> memoryview:
    """Re-cast vLLM's primary view to tiering's ``(num_blocks, block_bytes)`` contract.

    vLLM 0.33 hands its tiers a 2-D int8 view of shape ``(num_chunks, R)``
    whose rows are ``R = strides[0]`` bytes: every worker's slot of the chunk
    plus page-alignment padding. A tiering block is that whole row, so the
    bytes a tier stores are exactly the bytes vLLM's workers write and read
    at ``chunk_id * R``. A 1-D byte view is split into rows of the spec's
    ``kv_bytes_per_chunk`` (the page-aligned row size). Zero-copy.

    Raises:
        ValueError: the view is read-only, not C-contiguous (rows separated
            by bytes outside the view), or not a whole number of rows.
    """
    if not primary_kv_view.c_contiguous:
        raise ValueError(
            f"vLLM's primary view (shape {primary_kv_view.shape}, strides {primary_kv_view.strides}) "
            "is not C-contiguous; tiering needs rows of strides[0] bytes back to back"
        )
    if primary_kv_view.ndim >= 2 or primary_kv_view.itemsize > 1:
        assert primary_kv_view.strides is not None
        row_bytes = int(primary_kv_view.strides[0])
    else:
        row_bytes = int(getattr(vllm_spec, "kv_bytes_per_chunk", 0))
    if row_bytes <= 0 or primary_kv_view.nbytes % row_bytes:
        raise ValueError(
            f"vLLM's primary view of {primary_kv_view.nbytes} bytes is not a whole number of {row_bytes}-byte rows"
        )
    return as_block_view(primary_kv_view, primary_kv_view.nbytes // row_bytes, row_bytes)


def _int_field(value: Any, name: str) -> int:
    """A namespace field that must be an integer (a bool is not one).

    Raises:
        TypeError: ``value`` is not an integer (e.g. a ``MagicMock`` of a
            test's fake spec, whose repr would differ between ranks); names
            the field.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"vLLM offloading spec field {name!r} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def _str_field(value: Any, name: str) -> str:
    """A namespace field that must be a str.

    Raises:
        TypeError: ``value`` is not a str; names the field.
    """
    if not isinstance(value, str):
        raise TypeError(f"vLLM offloading spec field {name!r} must be a str, got {type(value).__name__} {value!r}")
    return value


def _bool_field(value: Any, name: str) -> bool:
    """A namespace field that must be a bool.

    Raises:
        TypeError: ``value`` is not a bool; names the field.
    """
    if not isinstance(value, bool):
        raise TypeError(f"vLLM offloading spec field {name!r} must be a bool, got {type(value).__name__} {value!r}")
    return value


def _dtype_name(value: Any) -> str:
    """``config.model.dtype`` (a ``torch.dtype`` or its name) as a name without ``torch.``.

    Raises:
        TypeError: neither a str nor a ``torch.dtype``; names the field.
    """
    kind = type(value)
    if not isinstance(value, str) and (kind.__module__, kind.__name__) != ("torch", "dtype"):
        raise TypeError(
            "vLLM offloading spec field 'config.model.dtype' must be a torch.dtype or str, "
            f"got {kind.__name__} {value!r}"
        )
    return str(value).removeprefix("torch.")


def is_replicated(vllm_spec: Any) -> bool:
    """Whether vLLM lays rows out replicated: one copy of the KV, the same on every rank (e.g. MLA).

    vLLM's spec decides it (``replicated_layout``: the config asks for it and
    the primary region is shared); a spec without the attribute falls back to
    the config's flag.

    Raises:
        TypeError: the flag is not a bool.
    """
    if hasattr(vllm_spec, "replicated_layout"):
        return _bool_field(vllm_spec.replicated_layout, "replicated_layout")
    return _bool_field(vllm_spec.config.replicated_layout, "config.replicated_layout")


def layout_descriptor(vllm_spec: Any, kv_layout: str | None) -> str:
    """The ``kv_layout`` namespace field: the user's layout plus everything of vLLM's row layout.

    vLLM's own fs digest covers the model, dtype, group layer names and the
    parallel sizes but not the model revision nor the KV layout; tiering's
    namespace takes the revision from its own field and folds every vLLM
    fact that shapes a row's bytes into this string, so two engines that
    would lay a row out differently never share blocks. The result is
    JSON text (:func:`~tiering.core.fields.structured`), e.g.
    ``{"layout":"opaque","engine":"vllm","kv_cache_layout":"default",...}``.

    With vLLM's replicated layout (:func:`is_replicated`: every rank holds
    the same KV, one copy per row) the parallel sizes are left out, as
    vLLM's own ``FileMapper`` does, so engines of any TP size share blocks.

    Raises:
        TypeError: a field is not of its type (int, str, bool), e.g. a
            ``MagicMock`` spec of a test; the error names the field.
    """
    config = vllm_spec.config
    parallel = config.parallel
    replicated = is_replicated(vllm_spec)
    groups = [
        [
            _int_field(g.tokens_per_block, f"config.groups[{i}].tokens_per_block"),
            [_str_field(name, f"config.groups[{i}].layer_names") for name in g.layer_names],
            _int_field(g.group_id, f"config.groups[{i}].group_id"),
        ]
        for i, g in enumerate(config.groups)
    ]
    groups_digest = hashlib.sha256(json.dumps(groups, sort_keys=True).encode()).hexdigest()[:12]
    layout = config.kv_cache_layout
    facts: dict[str, str | int] = {
        "engine": "vllm",
        "kv_cache_layout": _str_field(layout, "config.kv_cache_layout") if layout else "default",
        "worker_bytes": _int_field(config.worker_kv_bytes_per_block, "config.worker_kv_bytes_per_block"),
        "slot_bytes": _int_field(getattr(vllm_spec, "cpu_page_size_per_worker", 0), "cpu_page_size_per_worker"),
        **{
            name: 1 if replicated else _int_field(getattr(parallel, f"{name}_size"), f"config.parallel.{name}_size")
            for name in ("tp", "pp", "pcp", "dcp")
        },
        "replicated": int(replicated),
        "canonical": int(_bool_field(config.canonical_layout, "config.canonical_layout")),
        "blocks_per_chunk": _int_field(config.cache.blocks_per_chunk, "config.cache.blocks_per_chunk"),
        "tokens_per_hash": _int_field(config.cache.tokens_per_hash, "config.cache.tokens_per_hash"),
        "groups": groups_digest,
    }
    # Structured, never joined: a user layout or a vLLM layout name holding "," ";" or "=" must not pass
    # for another combination of facts.
    return structured({"layout": kv_layout or "opaque", **facts})


def tiering_spec_from_vllm(
    vllm_spec: Any,
    view: memoryview,
    *,
    model_revision: str | None = None,
    kv_layout: str | None = None,
) -> OffloadingSpec:
    """Build tiering's :class:`~tiering.core.spec.OffloadingSpec` from vLLM's ``OffloadingSpec``.

    Args:
        vllm_spec: vLLM's spec (0.33: ``config`` is an ``OffloadingConfig``;
            there is no ``vllm_config``).
        view: the primary view already re-cast by :func:`primary_block_view`.
        model_revision: the model revision (vLLM's config does not carry it);
            None falls back to ``kv_connector_extra_config["model_revision"]``,
            then tiering's default ``"main"`` with a warning.
        kv_layout: the KV layout name (see :func:`layout_descriptor`); None
            falls back to ``kv_connector_extra_config["kv_layout"]``.

    Returns:
        A spec whose ``block_bytes`` is the row size, ``block_size`` the
        tokens per chunk, ``rank``/``world_size`` vLLM's (0 and 1 with the
        replicated layout, whose rows are the same on every rank), and whose
        ``extra_config`` is vLLM's ``kv_connector_extra_config`` with those
        keys set. ``engine_config`` is vLLM's ``OffloadingConfig``.

    Raises:
        TypeError: a namespace field of ``vllm_spec`` is not of its type
            (see :func:`layout_descriptor`); the error names the field.
    """
    config = vllm_spec.config
    extra: dict[str, Any] = dict(config.extra_config)
    revision = model_revision if model_revision is not None else extra.get("model_revision")
    layout = kv_layout if kv_layout is not None else extra.get("kv_layout")
    if revision is None:
        logger.warning(
            "tiering: no model_revision configured for %r; blocks of every revision of this model "
            'share one namespace. Set "model_revision" in the tier entry.',
            config.model.name,
        )
        extra.pop("model_revision", None)
    else:
        extra["model_revision"] = str(revision)
    assert view.shape is not None  # a memoryview over a buffer always has a shape
    num_blocks, block_bytes = int(view.shape[0]), int(view.shape[1])
    if config.groups:
        tokens_per_block = _int_field(config.groups[0].tokens_per_block, "config.groups[0].tokens_per_block")
    else:
        tokens_per_block = _int_field(extra.get("block_size", 16), "kv_connector_extra_config.block_size")
    replicated = is_replicated(vllm_spec)
    extra.update(
        {
            "block_size": tokens_per_block * _int_field(config.cache.blocks_per_chunk, "config.cache.blocks_per_chunk"),
            "block_bytes": block_bytes,
            "cpu_bytes_to_use": num_blocks * block_bytes,
            "model": _str_field(config.model.name, "config.model.name"),
            "kv_dtype": _dtype_name(config.model.dtype),
            "kv_layout": layout_descriptor(vllm_spec, None if layout is None else str(layout)),
            "rank": 0 if replicated else _int_field(config.parallel.rank, "config.parallel.rank"),
            "world_size": 1 if replicated else _int_field(config.parallel.world_size, "config.parallel.world_size"),
        }
    )
    return OffloadingSpec(extra, engine_config=config, strict=False)


def to_lookup_result(verdict: bool | None) -> Any:
    """Tiering's lookup verdict as vLLM's ``LookupResult``: True HIT, False MISS, None RETRY."""
    if verdict is None:
        return LookupResult.RETRY
    return LookupResult.HIT if verdict else LookupResult.MISS
