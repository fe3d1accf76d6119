"""A Redis secondary tier on redis-py: one key per block, shared by every engine replica that uses the server.

An indexed block store (:class:`~tiering.core.store.IndexedTier`: the index of
the blocks this process knows, jobs, reservations, deletes, scans, stats)
around a :class:`~tiering.redis.medium.RedisMedium` (the server's primitives;
key layout in :mod:`tiering.redis.layout`). This module maps the config keys
(:data:`tiering.redis.config.SCHEMA`) onto the store's knobs: lookups resolved
in background batches, ``max_connections`` I/O threads sending pipelines of
``pipeline_blocks`` blocks, stores reserved on the scheduler's thread. Nothing
on the scheduler's thread touches the network; a failed request (after
redis-py's retries, bounded by the timeouts) fails its blocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from tiering.core.base import OffloadKey
from tiering.core.inspection import TierInspector
from tiering.core.policies.tenancy import TenantPolicy
from tiering.core.schema import ConfigSchema
from tiering.core.spec import OffloadingSpec
from tiering.core.store import IndexedTier, StoreSettings
from tiering.core.store.lookup_cache import LookupCache
from tiering.redis.config import SCHEMA, RedisSettings
from tiering.redis.medium import RedisMedium

LOOKUP_BATCH = 8192
"""Most keys of one pipelined existence check. A scheduler step's lookups (thousands of keys) gather into one
check once it stopped asking: taking batches while it still asks (both threads then take turns holding the GIL)
left keys of a 4,096-key step unresolved at its next step."""

_STILL_THERE = ("forgotten", "evicted")
"""Reasons a key leaves the index while its block stays counted right (kept on the server, or the fleet took it)."""


class RedisSecondaryTierManager(IndexedTier):
    """A secondary tier keeping blocks as keys of a Redis server, Cluster or Sentinel-managed primary.

    Config (the ``secondary_tiers`` entry): ``{"type": "redis", "url":
    "redis://host:6379/0", ...}``; every key is in :data:`tiering.redis.config.SCHEMA`
    and the package README.

    Args:
        offloading_spec: the stack's spec (block geometry, namespace).
        primary_kv_view: the primary tier's ``(num_blocks, block_bytes)`` host buffer.
        tier_type: the registered name (injected by the factory).
        **config: the entry's keys (see :data:`~tiering.redis.config.SCHEMA`).

    Raises:
        tiering.core.schema.TierConfigError: a wrong, missing or unknown key (names it), among them
            ``capacity_bytes`` below one block (header included).
        RedisStartupError: the server is unreachable, refuses the credentials or the probe failed.
    """

    medium: ClassVar[str] = "memory"
    config_schema: ClassVar[ConfigSchema | None] = SCHEMA
    reserve_on_scheduler: ClassVar[bool] = True
    blocks: RedisMedium

    def __init__(
        self, offloading_spec: OffloadingSpec, primary_kv_view: memoryview, tier_type: str, **config: Any
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, **config)
        self.blocks.attach(self.pins, self.tenants)

    def open_medium(self, config: Mapping[str, Any]) -> RedisMedium:
        """Connect and probe the server (see :class:`~tiering.redis.medium.RedisMedium`)."""
        return RedisMedium(RedisSettings(config), self.namespace, self.block_bytes, self.reset)

    def store_settings(self, config: Mapping[str, Any]) -> StoreSettings:
        """The store's knobs: threads = connections, shares = pipelines, lookups in the background, no rescans."""
        self.locality = "fleet" if config["eviction"] == "tier" else "remote"  # type: ignore[misc]
        return StoreSettings.from_config(  # capacity_bytes, max_pinned_bytes and tenants keep their names
            config, n_read_threads=config["max_connections"], n_write_threads=0, lookup_fallback="async",
            startup_scan="background" if config["startup_scan"] else "off", startup_scan_wait_s=0.0,
            rescan_interval_s=0.0, max_batch=config["pipeline_blocks"], help_batch=config["pipeline_blocks"],
        )  # fmt: skip

    def index_tenants(self) -> TenantPolicy | None:
        """With eviction ``"tier"`` the fleet keeps the tenants' quotas (on the server); the index their TTLs."""
        return self.tenants.without_quotas() if self.tenants and self.blocks.fleet else self.tenants

    def make_lookup_cache(self) -> LookupCache:
        """Lookups the index cannot answer, asked of the server in batches (one packed ``STRLEN`` per node)."""
        return LookupCache(
            self._resolve,
            lambda fn: self.pool.submit_call("read", fn),
            negative_ttl_s=self.config["lookup_negative_ttl_s"],
            max_batch=LOOKUP_BATCH,
            max_pending=65536,
            gather_s=0.001,  # a scheduler step's lookups (a few microseconds apart) gather into full batches
            parallel=1,
        )

    def forget(self, keys: Sequence[OffloadKey], reason: str) -> None:
        """Keys known gone: out of the cached lookups and, with eviction ``"tier"``, out of the fleet's count."""
        super().forget(keys, reason)
        if reason not in _STILL_THERE:
            self.blocks.gone(keys)

    @classmethod
    def inspector(cls, tier_config: Mapping[str, Any]) -> TierInspector | None:
        """A :class:`~tiering.redis.inspection.RedisInspector` of a config entry (``tiering ls/stat/gc/verify``)."""
        from tiering.redis.inspection import RedisInspector

        return RedisInspector.from_config(tier_config)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(location={self.blocks.location!r}, prefix={self.blocks.layout.prefix!r}, "
            f"eviction={self.config['eviction']!r}, capacity_bytes={self.index.capacity_bytes!r})"
        )
