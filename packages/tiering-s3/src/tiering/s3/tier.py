"""An S3 secondary tier: the indexed block store (:mod:`tiering.core.store`) on a bucket.

The block store owns the protocol (index and cap, reservations on the
scheduler thread, lookups, jobs, deletes with retries, scans, stats,
shutdown); :class:`~tiering.s3.medium.S3Medium` owns the requests. This
module holds the config schema's use and the store's knobs for s3: no
periodic rescans (a listing costs requests; :meth:`S3SecondaryTierManager.rescan`
runs one), a blocking start-up scan (a bucket that cannot be listed fails
the constructor), and lookups of keys missing from the index answered by
background HEADs (``head_fallback``). Nothing on the scheduler's thread waits for S3.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from tiering.core.base import OffloadKey
from tiering.core.inspection import TierInspector
from tiering.core.spec import OffloadingSpec
from tiering.core.store import IndexedTier, StoreSettings
from tiering.core.toolkit import ConfigSchema, LookupCache
from tiering.s3.client import ServerFeatures
from tiering.s3.config import CREDENTIAL_KEYS, SCHEMA, ConnectionSettings
from tiering.s3.medium import S3Medium

logger = logging.getLogger(__name__)


class _Entry(dict[str, Any]):
    """A checked config entry whose ``repr`` shows no credential (the tier keeps it as ``config``)."""

    def __repr__(self) -> str:
        return repr({k: "<redacted>" if k in CREDENTIAL_KEYS and v else v for k, v in self.items()})


NEGATIVE_LOOKUP_TTL_S = 5.0
"""How long a HEAD that found nothing answers ``lookup`` with False before asking again."""


class S3SecondaryTierManager(IndexedTier):
    """A secondary tier that keeps blocks as objects in an S3 (or S3-compatible) bucket.

    Config (the ``secondary_tiers`` entry): ``{"type": "s3", "bucket": "b", ...}``; the keyword arguments
    after ``tier_type`` are the keys of :data:`tiering.s3.config.SCHEMA`, documented in the package README.
    ``capacity_bytes`` counts whole objects (header included); least recently used blocks are evicted, and
    a block is PUT only once the objects evicted for its room are deleted.

    Args:
        offloading_spec: the stack's spec (block geometry, namespace).
        primary_kv_view: the primary tier's ``(num_blocks, block_bytes)`` host buffer.
        tier_type: the registered name (injected by the factory).

    Attributes:
        blocks: the :class:`~tiering.s3.medium.S3Medium`.
        startup_listed_blocks: complete block objects the start-up listing found.
        startup_seconds: seconds the constructor took (probe and listing).

    Raises:
        TierConfigError: a config value has the wrong type or range (a ``ValueError``; names the key).
        S3StartupError: the startup probe failed (wrong endpoint, bucket, region, credentials, permissions or
            TLS); the message says which, never a credential.
    """

    medium: ClassVar[str] = "storage"
    config_schema: ClassVar[ConfigSchema | None] = SCHEMA
    reserve_on_scheduler: ClassVar[bool] = True
    locality: ClassVar[str] = "fleet"  # a bucket is shared: a block one engine stores is a hit for every engine
    blocks: S3Medium

    def __init__(self, offloading_spec: OffloadingSpec, primary_kv_view: memoryview, tier_type: str, **config: Any):
        started = time.monotonic()
        super().__init__(offloading_spec, primary_kv_view, tier_type, **config)
        self.startup_seconds = time.monotonic() - started
        self.startup_listed_blocks = self.blocks.listed_blocks
        logger.info(
            "s3 tier %r ready: %s, %d blocks (%d bytes) found in %.2f s, capacity %s",
            tier_type,
            self.probe_report(check_credentials=False)[0],
            self.startup_listed_blocks,
            self.index.resident_bytes,
            self.startup_seconds,
            self.capacity_bytes if self.capacity_bytes is not None else "unbounded",
        )

    # -- the store's hooks ------------------------------------------------------------------------
    def check_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Every key of :data:`~tiering.s3.config.SCHEMA` (defaults filled in), kept as ``self.config``.

        Raises:
            TierConfigError: a wrong, missing or unknown key (names it, never a credential's value).
        """
        return _Entry(SCHEMA.validate(config))

    def store_settings(self, config: Any) -> StoreSettings:
        """``max_concurrency`` I/O threads; HEAD lookups with ``head_fallback``; a blocking start-up scan only."""
        return StoreSettings.from_config(
            config,
            n_read_threads=config["max_concurrency"],
            n_write_threads=0,
            lookup_fallback="async" if config["head_fallback"] else "off",
            startup_scan="blocking",
            rescan_interval_s=0.0,
        )

    def open_medium(self, config: Any) -> S3Medium:
        """Connect and probe the bucket (:class:`~tiering.s3.medium.S3Medium`)."""
        return S3Medium(ConnectionSettings.from_entry(config), self.namespace, self.block_bytes)

    def make_lookup_cache(self) -> LookupCache:
        """HEADs of keys missing from the index, in batches resolved side by side on the read threads."""
        n = self.settings.n_read_threads
        return LookupCache(
            self._resolve,
            lambda fn: self.pool.submit_call("read", fn),
            negative_ttl_s=NEGATIVE_LOOKUP_TTL_S,
            max_pending=4 * n,
            max_batch=4,
            parallel=n,
        )

    def forget(self, keys: Sequence[OffloadKey], reason: str) -> None:
        """Keys known gone from the bucket (or not whole yet): a miss for the negative-lookup TTL, without a HEAD."""
        super().forget(keys, reason)
        if keys and self.lookup_cache is not None and reason != "forgotten":  # forgotten ones are still there
            self.lookup_cache.mark_absent(keys)

    # -- s3's own -----------------------------------------------------------------------------------
    @classmethod
    def probe(cls, tier_config: Mapping[str, Any]) -> str:
        """Bucket, credentials and server features of an entry, creating nothing (``tiering check --probe``).

        See :func:`tiering.s3.probe.probe_entry` (one probe object, removed at once; no ``namespace.json``).

        Raises:
            TierConfigError: a wrong value or unknown key (a ``ValueError``).
            S3StartupError: the bucket cannot be used (the message says why, without credentials).
        """
        from tiering.s3.probe import probe_entry

        return probe_entry(tier_config)

    @classmethod
    def inspector(cls, tier_config: Mapping[str, Any]) -> TierInspector:
        """An :class:`~tiering.s3.inspection.S3Inspector` of a config entry's prefix (``tiering ls/gc/verify``)."""
        from tiering.s3.inspection import S3Inspector

        return S3Inspector.from_config(tier_config)

    @property
    def base(self) -> str:
        """The namespace's folder in the bucket: ``<prefix>/<digest>``."""
        return self.blocks.layout.base

    def object_key(self, key: bytes) -> str:
        """The object name of block ``key``: ``<prefix>/<digest>/<shard>/<key hex>``."""
        return self.blocks.name(key)

    @property
    def features(self) -> ServerFeatures:
        """What the server supports of the optional features the tier uses (start-up probe, refusals since)."""
        return self.blocks.client.features()

    def probe_report(self, check_credentials: bool = True) -> list[str]:
        """What the probes found, one line each (``tiering check --probe``); see :meth:`S3Medium.probe_report`."""
        return self.blocks.probe_report(check_credentials)

    def rescan(self) -> None:
        """List the namespace now and reconcile the index with it; retries failed deletes; evicts to the cap.

        Raises:
            S3StartupError: the listing failed.
        """
        self.scans.scan(False)

    def stats(self) -> dict[str, int | float]:
        """The store's figures (:meth:`IndexedTier.stats`), the medium's and the start-up listing's; see the README."""
        return {
            **super().stats(),
            "startup_listed_blocks": self.startup_listed_blocks,
            "startup_seconds": round(self.startup_seconds, 3),
        }

    def __repr__(self) -> str:
        settings = self.blocks.client.settings
        return (
            f"{type(self).__name__}(bucket={settings.bucket!r}, base={self.base!r}, "
            f"endpoint_url={settings.redact(settings.endpoint_url)!r}, capacity_bytes={self.capacity_bytes!r})"
        )
