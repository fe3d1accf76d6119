"""The default stack of ``tiering bench``: a CPU primary tier plus one capped persistent tier.

Core names no backend: the persistent tier is the first installed tier
(by name, in :meth:`~tiering.core.factory.Registry.known_names` order) whose
class returns a configuration from
``default_local_config(directory)``; a tier that keeps nothing on a local
disk returns None. ``tiering ls/stat/gc/verify --root DIR`` open the same
stack, so they see what ``tiering bench --root DIR`` wrote.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from tiering.cli.bench.workload import MOONCAKE_BLOCK_TOKENS
from tiering.core.base import SecondaryTierManager
from tiering.core.capabilities import LocalTier
from tiering.core.factory import SecondaryTierFactory

DEFAULT_BENCH_BLOCK_BYTES = 16 * 1024
"""Bytes per block of the default stack (16 KiB)."""

DEFAULT_BENCH_PRIMARY_BLOCKS = 1024
"""Slots of the default stack's CPU primary tier."""

DEFAULT_BENCH_CAPACITY_BYTES = 256 * 1024 * 1024
"""Cap of the default stack's persistent tier (256 MiB; a tier's own default cap wins when lower).

The first 2,000 requests of the conversation trace store about 39,000 blocks
(about 800 MB as files of 16 KiB plus a trailer): under this cap the tier
evicts while the replay runs, on its own threads, and the temporary
directory holds about a third of them at the end, which keeps its removal
short (file deletes cost milliseconds each on some disks)."""

DEFAULT_BENCH_CAPACITY_PRIMARIES = 4
"""The default stack's persistent tier holds at least this many times the primary tier's bytes.

With real block sizes (``--block-bytes 64MiB``) 256 MiB is 3 blocks: a block
the primary tier evicts is gone from the persistent tier too before a later
request asks for it, so the tier serves nothing."""

CAPACITY_RULE = f"max({DEFAULT_BENCH_CAPACITY_BYTES >> 20} MiB, {DEFAULT_BENCH_CAPACITY_PRIMARIES} x the primary tier)"
"""The default persistent tier's cap, in words (the report's header prints it)."""


def bench_capacity_bytes(primary_bytes: int) -> int:
    """The default stack's persistent tier cap in bytes: :data:`CAPACITY_RULE` for a primary of ``primary_bytes``."""
    return max(DEFAULT_BENCH_CAPACITY_BYTES, DEFAULT_BENCH_CAPACITY_PRIMARIES * primary_bytes)


def default_local_tier(
    directory: str | Path, capacity_bytes: int = DEFAULT_BENCH_CAPACITY_BYTES
) -> dict[str, Any] | None:
    """The ``secondary_tiers`` entry of the first installed tier with a default local configuration.

    Each installed tier class is asked ``default_local_config(directory)``;
    the first non-None answer wins, with ``type`` set to the tier's name
    (unless the answer has one) and, when the class accepts
    ``capacity_bytes``, a cap of ``capacity_bytes`` (:func:`bench_capacity_bytes` of the primary tier): at
    :data:`DEFAULT_BENCH_CAPACITY_BYTES` the tier's own default cap wins when lower; a larger one, which
    larger blocks need, wins over it.

    Returns:
        The entry, or None when no installed tier keeps blocks in a local directory.

    Raises:
        ImportError, TypeError: an installed tier's entry point is broken.
    """
    for name in SecondaryTierFactory.known_names():
        cls = SecondaryTierFactory.get_class(name)
        config = cls.default_local_config(str(directory)) if isinstance(cls, LocalTier) else None
        if config is None:
            continue
        entry: dict[str, Any] = {"type": name, **dict(config)}
        if _accepts(cls, "capacity_bytes"):
            own = entry.get("capacity_bytes")
            floor = capacity_bytes <= DEFAULT_BENCH_CAPACITY_BYTES
            entry["capacity_bytes"] = min(own, capacity_bytes) if own and floor else capacity_bytes
        return entry
    return None


def _accepts(cls: type[SecondaryTierManager], key: str) -> bool:
    if cls.config_schema is not None:
        return key in cls.config_schema.keys
    params = inspect.signature(cls).parameters
    return key in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def bench_config(
    tiers: list[dict[str, Any]], block_bytes: int = DEFAULT_BENCH_BLOCK_BYTES, cpu_bytes: int | None = None
) -> dict[str, Any]:
    """The default stack's config around ``tiers``: a primary of 1,024 blocks, Mooncake block geometry.

    Args:
        tiers: the ``secondary_tiers`` entries.
        block_bytes: bytes per block.
        cpu_bytes: bytes of the primary tier; None: 1,024 blocks.
    """
    return {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": cpu_bytes if cpu_bytes is not None else DEFAULT_BENCH_PRIMARY_BLOCKS * block_bytes,
        "block_bytes": block_bytes,
        "block_size": MOONCAKE_BLOCK_TOKENS,
        "eviction_policy": "lru",
        "secondary_tiers": tiers,
    }
