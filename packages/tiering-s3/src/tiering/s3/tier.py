"""An S3 secondary tier: the indexed block store (:mod:`tiering.core.store`) on a bucket (:mod:`tiering.s3.medium`).

The store's knobs for s3: reservations on the scheduler thread, no periodic rescan (a listing costs requests),
a blocking start-up scan (a bucket that cannot be listed fails the constructor), and keys missing from the
index asked with background HEADs (``head_fallback``). Nothing on the scheduler's thread waits for S3.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from tiering.core.base import OffloadKey
from tiering.core.inspection import TierInspector
from tiering.core.schema import ConfigSchema
from tiering.core.spec import OffloadingSpec
from tiering.core.store import IndexedTier, StoreSettings
from tiering.core.store.lookup_cache import LookupCache
from tiering.s3.client import ServerFeatures
from tiering.s3.config import CREDENTIAL_KEYS, SCHEMA, ConnectionSettings
from tiering.s3.medium import S3Medium
from tiering.s3.probe import probe_report

logger = logging.getLogger(__name__)

NEGATIVE_LOOKUP_TTL_S = 5.0
"""How long a HEAD that found nothing answers ``lookup`` with False before asking again."""


class _Entry(dict[str, Any]):
    """A checked config entry whose ``repr`` shows no credential (the tier keeps it as ``config``)."""

    def __repr__(self) -> str:
        return repr({k: "<redacted>" if k in CREDENTIAL_KEYS and v else v for k, v in self.items()})


class S3SecondaryTierManager(IndexedTier):
    """A secondary tier that keeps blocks as objects in an S3 (or S3-compatible) bucket.

    Config: ``{"type": "s3", "bucket": "b", ...}``; the keyword arguments after ``tier_type`` are the keys of
    :data:`tiering.s3.config.SCHEMA` (documented in the package README). ``capacity_bytes`` counts whole
    objects; least recently used blocks are evicted, and a block is PUT only once the objects evicted for its
    room are deleted.

    Args:
        offloading_spec: the stack's spec; primary_kv_view: the primary ``(num_blocks, block_bytes)`` buffer;
        tier_type: the registered name (injected by the factory).

    Attributes:
        blocks: the :class:`~tiering.s3.medium.S3Medium`; startup_listed_blocks: complete block objects the
        start-up listing found; startup_seconds: seconds the constructor took.

    Raises:
        TierConfigError: a wrong config value (a ``ValueError`` naming the key, never a credential's value).
        S3StartupError: the start-up probe failed (endpoint, bucket, region, credentials, permissions or TLS).
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
        logger.info("s3 tier %r ready: %s, %d blocks (%d bytes) found in %.2f s, capacity %s", tier_type,
                    self.probe_report(False)[0], self.startup_listed_blocks, self.index.resident_bytes,
                    self.startup_seconds, self.capacity_bytes or "unbounded")  # fmt: skip

    # -- the store's hooks ------------------------------------------------------------------------
    def check_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Every key of :data:`~tiering.s3.config.SCHEMA`, defaults filled in; raises TierConfigError naming a key."""
        return _Entry(SCHEMA.validate(config))

    def store_settings(self, config: Any) -> StoreSettings:
        """``max_concurrency`` I/O threads, HEAD lookups (``head_fallback``), one blocking scan, 10 s waits for room."""
        return StoreSettings.from_config(
            config,
            n_read_threads=config["max_concurrency"],
            n_write_threads=0,
            lookup_fallback="async" if config["head_fallback"] else "off",
            startup_scan="blocking",
            rescan_interval_s=0.0,
            room_wait_s=10.0,  # a DeleteObject takes a round trip, more under load
            max_batch=1,  # one request per block: blocks spread over the threads, never queued behind one another
        )

    def open_medium(self, config: Any) -> S3Medium:
        """Connect and probe the bucket (:class:`~tiering.s3.medium.S3Medium`)."""
        return S3Medium(ConnectionSettings.from_entry(config), self.namespace, self.block_bytes)

    def make_lookup_cache(self) -> LookupCache:
        """HEADs of keys missing from the index, in small batches resolved side by side on the read threads."""
        n = self.settings.n_read_threads
        submit = lambda fn: self.pool.submit_call("read", fn)  # noqa: E731
        return LookupCache(self._resolve, submit, negative_ttl_s=NEGATIVE_LOOKUP_TTL_S, max_pending=4 * n,
                           max_batch=4, parallel=n)  # fmt: skip

    def forget(self, keys: Sequence[OffloadKey], reason: str) -> None:
        """Keys known gone from the bucket (or not whole yet): a miss for the negative-lookup TTL, without a HEAD."""
        super().forget(keys, reason)
        if keys and self.lookup_cache is not None and reason != "forgotten":  # forgotten ones are still there
            self.lookup_cache.mark_absent(keys)

    # -- s3's own -----------------------------------------------------------------------------------
    @classmethod
    def probe(cls, tier_config: Mapping[str, Any]) -> str:
        """Bucket, credentials and server features of an entry, creating nothing (:func:`.probe.probe_entry`)."""
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
        """What the probes found, one line each (:func:`tiering.s3.probe.probe_report`); never a credential."""
        return probe_report(self.blocks.client, self.base, check_credentials)

    def stats(self) -> dict[str, int | float]:
        """The store's figures (:meth:`IndexedTier.stats`, the medium's among them) and the start-up listing's."""
        out = super().stats()
        out.update(startup_listed_blocks=self.startup_listed_blocks, startup_seconds=round(self.startup_seconds, 3))
        return out

    def __repr__(self) -> str:
        settings = self.blocks.client.settings
        return (
            f"{type(self).__name__}(bucket={settings.bucket!r}, base={self.base!r}, "
            f"endpoint_url={settings.redact(settings.endpoint_url)!r}, capacity_bytes={self.capacity_bytes!r})"
        )
