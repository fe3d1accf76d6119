"""An S3 secondary tier on boto3: blocks are objects, requests run on the toolkit's I/O pool.

The object layout is :mod:`tiering.s3.layout`'s; every request goes through
:class:`tiering.s3.client.S3Client`. A block object is
:func:`tiering.core.format.encode_header` followed by the primary slot's
bytes and is verified with :func:`tiering.core.format.verify_block` on every
load. The machinery is the tier toolkit's (:mod:`tiering.core.toolkit`): job
tracking, the capacity index (reservations, delete-confirmed eviction,
epochs), the lookup cache for HEAD probes, the I/O pool, the stats
vocabulary and the KV event log; this module composes them with S3 requests.

Nothing on the scheduler's thread waits for S3. An object that is short or
unreadable is "not there yet" (a miss; another writer may still be writing
it on a server whose PUT is not atomic) and is never deleted for its size
alone: only an object read whole that fails verification is deleted, and
never while this process stores the same key (an object still being uploaded
may look short to a server whose PUT is not atomic).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from tiering.core.base import JobMetadata, OffloadKey, ReqContext, SecondaryTierManager
from tiering.core.format import HEADER_SIZE
from tiering.core.inspection import TierInspector
from tiering.core.spec import OffloadingSpec
from tiering.core.toolkit import (
    Admit,
    CapacityIndex,
    ConfigSchema,
    Counters,
    InvalidValueError,
    IOPool,
    JobReporting,
    JobTracker,
    KeyState,
    KVEventLog,
    LookupCache,
)
from tiering.core.toolkit.pins import PinBook, PinningTier
from tiering.core.toolkit.stats import failure_totals
from tiering.core.toolkit.tenancy import TenantPolicy, note_tenant
from tiering.s3.blocks import BlockIO, Task
from tiering.s3.client import S3Client, ServerFeatures
from tiering.s3.config import SCHEMA, ConnectionSettings
from tiering.s3.errors import ERROR_CLASSES
from tiering.s3.layout import Layout
from tiering.s3.pins import S3Pins

logger = logging.getLogger(__name__)

NEGATIVE_LOOKUP_TTL_S = 5.0
"""How long a HEAD that found nothing answers ``lookup`` with False before asking again."""
_COUNTERS = (
    "lookups_hit",
    "lookups_miss",
    "lookups_pending",
    "blocks_stored",
    "bytes_stored",
    "stores_already_present",
    "blocks_loaded",
    "bytes_loaded",
    "bad_blocks_removed",
    "short_objects_seen",
    "bad_blocks_kept_store_in_flight",
    "delete_requests",
    "objects_deleted",
    "scans",
    "in_flight_loads",
    *(f"errors_{c}" for c in ERROR_CLASSES),
)


class S3SecondaryTierManager(PinningTier, JobReporting, SecondaryTierManager):
    """A secondary tier that keeps blocks as objects in an S3 (or S3-compatible) bucket.

    Config (the ``secondary_tiers`` entry): ``{"type": "s3", "bucket": "b", ...}``; every key is documented in
    the package README and below.

    Args:
        offloading_spec: the stack's spec (block geometry, namespace).
        primary_kv_view: the primary tier's ``(num_blocks, block_bytes)`` host buffer.
        tier_type: the registered name (injected by the factory).
        bucket: the bucket name (required; must exist).
        prefix: key prefix inside the bucket (``"kv/tenantA"``); leading and trailing ``/`` are ignored.
            Nothing outside it is read or written.
        endpoint_url: ``http(s)://host:port`` of a non-AWS server; None: AWS.
        region_name: the bucket's region; None: boto3's default chain.
        addressing_style: ``"auto"``, ``"path"`` or ``"virtual"``.
        aws_access_key_id: explicit access key id; None: boto3's default chain (environment, profile,
            instance role). Never logged or shown.
        aws_secret_access_key: the secret of ``aws_access_key_id``. Never logged or shown.
        aws_session_token: the session token of temporary credentials. Never logged or shown.
        profile_name: a profile of the shared AWS config files.
        ca_bundle: path of a PEM CA bundle to verify the endpoint's TLS certificate.
        verify: False turns TLS certificate verification off (test servers only).
        max_concurrency: worker threads, and botocore ``max_pool_connections``.
        retry_mode: botocore retry mode: ``"standard"``, ``"adaptive"`` or ``"legacy"``.
        max_attempts: total attempts per request, first one included (>= 1).
        connect_timeout: seconds to open a connection.
        read_timeout: seconds to wait for bytes on an open connection.
        request_checksum_calculation: ``"when_supported"`` or ``"when_required"``; None: ``when_required``
            with a custom ``endpoint_url``, ``when_supported`` on AWS.
        response_checksum_validation: same values and default.
        capacity_bytes: cap on the bytes of this tier's objects (headers included); None: unbounded. Least
            recently used blocks are evicted.
        head_fallback: on an index miss, ask the server with HEAD (other writers share the prefix); ``lookup``
            answers None meanwhile.
        max_pinned_bytes: bound on the bytes of pinned blocks (0: pinning off; :mod:`tiering.s3.pins`).
        tenants: per-tenant byte quotas and TTL (:mod:`tiering.core.toolkit.tenancy`); None: off.

    Raises:
        ValueError: a config value has the wrong type or range (the message names the key).
        S3StartupError: the startup probe failed (wrong endpoint, bucket, region, credentials, permissions or
            TLS); the message says which.
    """

    medium: ClassVar[str] = "storage"
    config_schema: ClassVar[ConfigSchema | None] = SCHEMA

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        bucket: str | None = None,
        prefix: str = "",
        endpoint_url: str | None = None,
        region_name: str | None = None,
        addressing_style: str = "auto",
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        profile_name: str | None = None,
        ca_bundle: str | None = None,
        verify: bool = True,
        max_concurrency: int = 16,
        retry_mode: str = "standard",
        max_attempts: int = 3,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        request_checksum_calculation: str | None = None,
        response_checksum_validation: str | None = None,
        capacity_bytes: int | None = None,
        head_fallback: bool = True,
        max_pinned_bytes: int = 0,
        tenants: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        settings = {k: v for k, v in locals().items() if k in ConnectionSettings.__dataclass_fields__}
        self._conn = conn = ConnectionSettings(**settings)
        conn.validate()
        capacity_bytes = SCHEMA.check_value("capacity_bytes", capacity_bytes)
        SCHEMA.check_value("head_fallback", head_fallback)
        self.tenants = TenantPolicy.from_config(SCHEMA.check_value("tenants", tenants))
        self.object_bytes = HEADER_SIZE + self.block_bytes
        if capacity_bytes is not None and capacity_bytes < self.object_bytes:
            raise InvalidValueError(
                "s3", "capacity_bytes", f"must be >= one object ({self.object_bytes} bytes), got {capacity_bytes}"
            )
        self._redact = conn.redact
        self.bucket = conn.bucket_name
        self.prefix = conn.normalized_prefix
        self.endpoint_url = endpoint_url
        self.capacity_bytes = capacity_bytes
        self.head_fallback = head_fallback
        self.max_concurrency = max_concurrency
        self._namespace = offloading_spec.namespace
        self._digest = self._namespace.digest_bytes
        self.layout = Layout(self.prefix, self._namespace.digest)
        self.base = self.layout.base
        self._client = S3Client(conn, 2 * max_concurrency + 1)  # + the delete threads and the lookup resolver

        self._closed = False
        self._counters = Counters(_COUNTERS)
        self._index = CapacityIndex(capacity_bytes, self.tenants)
        pinned = SCHEMA.check_value("max_pinned_bytes", max_pinned_bytes)
        self.pins = PinBook(S3Pins(self._client, self.base), pinned, self.object_bytes, f"s3 tier {self.base}")
        self._index.keep = self.pins.protects
        self.jobs = JobTracker()
        # A bucket is shared: a block one engine stores is a hit for every engine of the namespace.
        self.events = KVEventLog(self.medium, tier=self.tier_type, locality="fleet")
        self._index.attach_events(self.events)
        self._pool = IOPool(max_concurrency, 0, name="tiering-s3")
        self._io = io = BlockIO(
            self._client, self.layout, self._namespace, self.block_bytes, self.block, self._index, self._counters,
            self._pool, self._redact,
        )  # fmt: skip
        self._lookups = LookupCache(
            io.resolve, negative_ttl_s=NEGATIVE_LOOKUP_TTL_S, max_pending=4 * max_concurrency, max_batch=64
        )
        io.attach_lookups(self._lookups)
        self.startup_listed_blocks = 0
        started = time.monotonic()
        try:
            io.probe()
            self.pins.refresh()  # before the rescan evicts down to the cap
            self.startup_listed_blocks = io.rescan()
        except BaseException:
            self._stop()
            raise
        self.startup_seconds = time.monotonic() - started
        logger.info(
            "s3 tier %r ready: s3://%s/%s (endpoint %s), %d blocks (%d bytes) found in %.2f s, capacity %s",
            tier_type,
            self.bucket,
            self.base,
            endpoint_url or "AWS",
            self.startup_listed_blocks,
            self._index.resident_bytes,
            self.startup_seconds,
            capacity_bytes if capacity_bytes is not None else "unbounded",
        )

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

    def object_key(self, key: bytes) -> str:
        """The object name of block ``key``: ``<prefix>/<digest>/<shard>/<key hex>``."""
        return self.layout.block(key)

    @property
    def features(self) -> ServerFeatures:
        """What the server supports of the optional features the tier uses (start-up probe, refusals since)."""
        return self._client.features()

    @property
    def conditional_put_supported(self) -> bool:
        """Whether the server honours ``If-None-Match`` (found by the start-up probe or on first use)."""
        return self._client.conditional_put

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(bucket={self.bucket!r}, base={self.base!r}, "
            f"endpoint_url={self._redact(self.endpoint_url)!r}, capacity_bytes={self.capacity_bytes!r})"
        )

    def probe_report(self, check_credentials: bool = True) -> list[str]:
        """What the probes found, one line each (for ``tiering check --probe``); never a credential.

        Args:
            check_credentials: also send one request signed with made-up credentials to learn
                whether the server checks them.
        """
        return self._io.probe_report(check_credentials)

    def rescan(self) -> int:
        """List the namespace and reconcile the index with it; retries failed deletes; evicts to the cap.

        Returns:
            The number of complete block objects listed.
        """
        return self._io.rescan()

    # -- lookups -----------------------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """Whether ``key`` is stored: from the index, else (``head_fallback``) a background HEAD.

        Returns:
            True: present. False: absent, being deleted, or the tier is shut down.
            None: a store of it or a HEAD is in flight; ask again.
        """
        if self._closed:
            return False
        state = self._index.lookup(key)
        if state is KeyState.RESIDENT:
            answer: bool | None = True
        elif state is KeyState.WRITING:
            answer = None
        elif state is KeyState.DELETING or not self.head_fallback:
            self._io.evict(self._index.take_expired())  # blocks past their tenant's TTL (none without tenants)
            answer = False
        else:
            answer = self._lookups.lookup(key)
            if answer:  # adopted by the probe and removed since: not servable
                answer = self._index.lookup(key) is KeyState.RESIDENT
        self._counters.inc("lookups_hit" if answer else "lookups_pending" if answer is None else "lookups_miss")
        return answer

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` most recently used (eviction order)."""
        self._index.touch(keys)

    # -- stores ---------------------------------------------------------------------------------
    def submit_store(self, job: JobMetadata) -> None:
        """Reserve room and queue one PUT per block not yet stored; return at once.

        A key already resident counts as stored without I/O; a PUT answered 412
        (another writer got there first) counts as stored. With ``capacity_bytes``,
        least recently used blocks are evicted to make room; a block that cannot
        fit fails the job (``store_failed_no_space``).
        """
        note_tenant(self.tenants, job.req_context.tenant)  # its keys carry only its tag: its name for stats
        state = self.jobs.start(job)
        tasks: list[Task] = []
        outcomes: list[tuple[int, bool, str]] = []
        for i, (key, slot) in enumerate(zip(job.keys, job.block_ids, strict=True)):
            if self._closed:
                outcomes.append((i, False, "shutdown"))
                continue
            reservation = self._index.reserve(key, self.object_bytes)
            self._io.evict(reservation.victims)
            if reservation.admit is Admit.PRESENT:
                self._counters.inc("stores_already_present")
                outcomes.append((i, True, ""))
            elif reservation.admit is Admit.NO_SPACE:
                outcomes.append((i, False, "no_space"))
            else:  # RESERVED, or DELETING: the worker waits for the old copy's delete first
                tasks.append((state, i, key, slot, reservation.admit is Admit.RESERVED))
        if outcomes:
            state.record(outcomes)
        if tasks:
            self._pool.submit("write", self._io.store_batch, tasks, self._io.tasks_failed)
        self.pins.refresh_soon(self._pool.submit_call)  # other processes' pins, read again now and then

    # -- loads ------------------------------------------------------------------------------------
    def submit_load(self, job: JobMetadata) -> None:
        """Queue one GET per block; each is verified before its bytes reach the slot.

        A missing or short object is a miss (not deleted); an object read whole
        that fails verification is deleted and counted. Either fails the job.
        """
        state = self.jobs.start(job)
        if self._closed:
            state.fail_rest("shutdown")
            return
        self._index.touch(job.keys)
        tasks = [(state, i, k, slot, False) for i, (k, slot) in enumerate(zip(job.keys, job.block_ids, strict=True))]
        self._counters.inc("in_flight_loads", len(tasks))
        self._pool.submit("read", self._io.load_batch, tasks, self._io.tasks_failed)

    # -- results, stats, shutdown ----------------------------------------------------------------

    def stats(self) -> dict[str, int | float]:
        """Counters under the core vocabulary (:mod:`tiering.core.toolkit.stats`) plus the S3 ones.

        Vocabulary keys: lookups, stores, loads, failures by cause, capacity, eviction and pin figures, work in
        flight, scans. S3's own: ``errors_<class>`` per :data:`tiering.s3.errors.ERROR_CLASSES` (failed requests),
        ``delete_requests``, ``objects_deleted``, ``short_objects_seen`` (listed or HEAD objects of the wrong
        size: not there yet, never deleted for it), ``bad_blocks_kept_store_in_flight``, ``startup_listed_blocks``,
        ``startup_seconds``, ``conditional_put_supported`` and ``batch_delete_supported`` (1/0); see the README.
        """
        out: dict[str, int | float] = dict(self._counters.snapshot())
        out.update(self._index.stats())
        out.update(self.jobs.stats())
        out.update(self.pins.stats(self._index.__contains__))
        lookups = self._lookups.stats()
        out["lookup_probes"] = lookups["lookup_probes"]
        out["lookup_probes_skipped"] = lookups["lookup_probes_skipped"]
        out.update(failure_totals(out))
        out["startup_listed_blocks"] = self.startup_listed_blocks
        out["startup_seconds"] = round(getattr(self, "startup_seconds", 0.0), 3)
        out["last_scan_s"] = round(self._io.last_scan_s, 3)
        out["conditional_put_supported"] = int(self._client.conditional_put)
        out["batch_delete_supported"] = int(self._client.batch_delete)
        return out

    def shutdown(self) -> None:
        """Stop: queued blocks fail, running requests finish, queued deletes are sent; idempotent.

        Does nothing in a child forked after the tier was built (the threads, connections and deletes are the parent's).
        """
        if self._closed or self.jobs.owner.forked:
            return
        self._closed = True
        self._stop()
        self.jobs.fail_all()
        logger.info("s3 tier %r shut down: %s", self.tier_type, self.stats())

    def _stop(self) -> None:
        self._closed = True
        self._lookups.close()
        self._io.close_reads()
        self._pool.shutdown()
        self._io.close()
        self._client.close()
