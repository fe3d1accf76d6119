"""An S3 secondary tier on boto3: blocks are objects, I/O runs on a bounded thread pool.

Object layout under ``bucket``::

    <prefix>/<namespace digest>/namespace.json       all Namespace fields, clear text
    <prefix>/<namespace digest>/<shard>/<key hex>    one block: core header + payload

``<shard>`` is two hex digits of the XXH3-64 of the key (256 key prefixes,
spreading load over S3 partitions). A block object is
:func:`tiering.core.format.encode_header` followed by the primary slot's
bytes and is verified with :func:`tiering.core.format.verify_block` on every
load; an object that does not verify is a miss, is deleted, and is counted
by cause.

Every scheduler-facing method only touches in-memory state under one lock
and hands I/O to the pool; nothing on the caller's thread waits for S3.
Retries, timeouts and connection pooling are botocore's, configured through
:class:`botocore.config.Config`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext, SecondaryTierManager
from tiering.core.format import (
    HEADER_SIZE,
    BlockFormatError,
    TruncatedBlockError,
    encode_header,
    verify_block,
)
from tiering.core.inspection import TierInspector
from tiering.core.spec import OffloadingSpec
from tiering.s3.client import DELETE_BATCH, S3Client, ServerFeatures
from tiering.s3.config import ConnectionSettings, _check_int
from tiering.s3.errors import ERROR_CLASSES, S3RequestError, classify_error
from tiering.s3.layout import Layout

logger = logging.getLogger(__name__)

NEGATIVE_LOOKUP_TTL_S = 5.0
"""How long a HEAD that found nothing answers ``lookup`` with False before asking again."""
_STAT_NAMES = (
    "lookups_hit",
    "lookups_miss",
    "lookups_pending",
    "heads_sent",
    "heads_skipped",
    "blocks_stored",
    "bytes_stored",
    "stores_already_present",
    "stores_failed",
    "stores_rejected_capacity",
    "blocks_loaded",
    "bytes_loaded",
    "loads_failed",
    "loads_missing",
    "corrupt_truncated",
    "corrupt_checksum",
    "corrupt_foreign",
    "evictions",
    "delete_requests",
    "objects_deleted",
    "delete_failures",
    "startup_listed_blocks",
)


class _Job:
    """Bookkeeping of one submitted job: blocks left and whether all succeeded."""

    __slots__ = ("job_id", "keys", "loaded", "ok", "remaining")

    def __init__(self, job_id: int, keys: Sequence[OffloadKey], is_load: bool) -> None:
        self.job_id = job_id
        self.keys = keys
        self.remaining = len(keys)
        self.ok = True
        self.loaded: set[bytes] | None = set() if is_load else None


class S3SecondaryTierManager(SecondaryTierManager):
    """A secondary tier that keeps blocks as objects in an S3 (or S3-compatible) bucket.

    Config (the ``secondary_tiers`` entry): ``{"type": "s3", "bucket": "b",
    ...}``; every key is documented in the package README and below.

    Args:
        offloading_spec: the stack's spec (block geometry, namespace).
        primary_kv_view: the primary tier's ``(num_blocks, block_bytes)`` host buffer.
        tier_type: the registered name (injected by the factory).
        bucket: the bucket name (required; must exist).
        prefix: key prefix inside the bucket (``"kv/tenantA"``); leading and
            trailing ``/`` are ignored. Nothing outside it is read or written.
        endpoint_url: ``http(s)://host:port`` of a non-AWS server; None: AWS.
        region_name: the bucket's region; None: boto3's default chain.
        addressing_style: ``"auto"``, ``"path"`` or ``"virtual"``.
        aws_access_key_id: explicit access key id; None: boto3's default
            chain (environment, profile, instance role). Never logged or shown.
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
        request_checksum_calculation: ``"when_supported"`` or
            ``"when_required"``; None: ``when_required`` with a custom
            ``endpoint_url``, ``when_supported`` on AWS.
        response_checksum_validation: same values and default.
        capacity_bytes: cap on the bytes of this tier's objects (headers
            included); None: unbounded. Least recently used blocks are evicted.
        head_fallback: on an index miss, ask the server with HEAD (other
            writers share the prefix); ``lookup`` answers None meanwhile.

    Raises:
        ValueError: a config value has the wrong type or range (the message names the key).
        S3StartupError: the startup probe failed (wrong endpoint, bucket,
            region, credentials, permissions or TLS); the message says which.
    """

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
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        self._conn = conn = ConnectionSettings(
            bucket=bucket,
            prefix=prefix,
            endpoint_url=endpoint_url,
            region_name=region_name,
            addressing_style=addressing_style,
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token,
            profile_name=profile_name,
            ca_bundle=ca_bundle,
            verify=verify,
            max_concurrency=max_concurrency,
            retry_mode=retry_mode,
            max_attempts=max_attempts,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            request_checksum_calculation=request_checksum_calculation,
            response_checksum_validation=response_checksum_validation,
        )
        self._redact = conn.redact
        conn.validate()
        self.object_bytes = HEADER_SIZE + self.block_bytes
        if capacity_bytes is not None:
            _check_int("capacity_bytes", capacity_bytes, self.object_bytes)
        if not isinstance(head_fallback, bool):
            raise ValueError(f"s3 tier: config key 'head_fallback' must be true or false, got {head_fallback!r}")

        self.bucket = conn.bucket_name
        self.prefix = conn.normalized_prefix
        self.endpoint_url = endpoint_url
        self.capacity_bytes = capacity_bytes
        self.head_fallback = head_fallback
        self.max_concurrency = max_concurrency
        namespace = offloading_spec.namespace
        self._namespace = namespace
        self._digest = namespace.digest_bytes
        self.layout = Layout(self.prefix, namespace.digest)
        self.base = self.layout.base
        self._client = S3Client(conn, max_concurrency + 1)  # + the deleter thread
        self.features = ServerFeatures()

        # -- state, all guarded by self._lock ---------------------------------
        self._lock = threading.Lock()
        self._index: collections.OrderedDict[bytes, int] = collections.OrderedDict()  # key -> size, LRU first
        self._used = 0  # bytes of index entries + reservations
        self._reserved: dict[bytes, int] = {}  # stores in flight: key -> reserved bytes
        self._store_refs: collections.Counter[bytes] = collections.Counter()
        self._store_ok: set[bytes] = set()
        self._loading: collections.Counter[bytes] = collections.Counter()  # pins against eviction
        self._heads: dict[bytes, float | None] = {}  # None: HEAD in flight; float: absent since
        self._heads_inflight = 0
        self._delete_queue: dict[bytes, str] = {}  # key -> reason, not yet sent
        self._deleting: dict[bytes, threading.Event] = {}  # queued or in flight; set when done
        self._delete_scheduled = False
        self._jobs: dict[int, _Job] = {}
        self._finished: list[JobResult] = []
        self._closed = False
        self._stats: collections.Counter[str] = collections.Counter()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_concurrency, thread_name_prefix="tiering-s3")
        self._deleter = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tiering-s3-delete")

        started = time.monotonic()
        try:
            self._probe()
            listed = self._rebuild_index()
        except BaseException:
            self._executor.shutdown(wait=False)
            self._deleter.shutdown(wait=False)
            self._client.close()
            raise
        self.startup_seconds = time.monotonic() - started
        with self._lock:
            self._make_room(0)
        logger.info(
            "s3 tier %r ready: s3://%s/%s (endpoint %s), %d blocks (%d bytes) found in %.2f s, capacity %s",
            tier_type,
            bucket,
            self.base,
            endpoint_url or "AWS",
            listed,
            self._used,
            self.startup_seconds,
            capacity_bytes if capacity_bytes is not None else "unbounded",
        )

    @classmethod
    def inspector(cls, tier_config: Mapping[str, Any]) -> TierInspector:
        """An :class:`~tiering.s3.inspection.S3Inspector` of a config entry's prefix (``tiering ls/gc/verify``)."""
        from tiering.s3.inspection import S3Inspector

        return S3Inspector.from_config(tier_config)

    # -- naming ------------------------------------------------------------
    def object_key(self, key: bytes) -> str:
        """The object key of block ``key``: ``<prefix>/<digest>/<shard>/<key hex>``."""
        return self.layout.block(key)

    @property
    def conditional_put_supported(self) -> bool:
        """Whether the server honours ``If-None-Match`` (found by the start-up probe)."""
        return self.features.conditional_put

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(bucket={self.bucket!r}, base={self.base!r}, "
            f"endpoint_url={self.endpoint_url!r}, capacity_bytes={self.capacity_bytes!r})"
        )

    # -- startup -----------------------------------------------------------
    def _probe(self) -> None:
        self._client.check_bucket(self.layout.listing_prefix)
        self.features = self._client.probe_features(self.layout.new_probe())
        body = json.dumps(
            {**self._namespace.to_dict(), "digest": self._namespace.digest}, indent=1, sort_keys=True
        ).encode()
        try:
            name, conditional = self.layout.namespace_object, self.features.conditional_put
            self._client.put(name, body, if_absent=conditional, content_type="application/json")
        except S3RequestError as exc:
            raise self._client.startup_error("PutObject of namespace.json", exc, self.layout.listing_prefix) from None

    def probe_report(self) -> list[str]:
        """What the start-up probe found, one line each (for ``tiering check --probe``); never a credential."""
        return [f"s3://{self.bucket}/{self.base}", *self.features.describe()]

    def _rebuild_index(self) -> int:
        entries: list[tuple[float, bytes, int]] = []
        bad: list[bytes] = []
        try:
            for page in self._client.list_pages(self.layout.listing_prefix):
                for obj in page.get("Contents", ()):
                    key = self.layout.parse(obj["Key"])
                    if key is None:
                        continue
                    if obj["Size"] != self.object_bytes:
                        bad.append(key)
                        continue
                    entries.append((obj["LastModified"].timestamp(), key, obj["Size"]))
        except S3RequestError as exc:
            raise self._client.startup_error(
                "ListObjectsV2 of the namespace prefix", exc, self.layout.listing_prefix
            ) from None
        entries.sort()
        with self._lock:
            for _, key, size in entries:
                self._index[key] = size
                self._used += size
            for key in bad:
                self._stats["corrupt_truncated"] += 1
                self._queue_delete(key, "bad_size")
        self._stats["startup_listed_blocks"] = len(entries)
        return len(entries)

    # -- capacity (call with the lock held) ----------------------------------
    def _make_room(self, need: int) -> bool:
        """Evict LRU, unpinned blocks until ``need`` more bytes fit; False if they cannot."""
        if self.capacity_bytes is None:
            return True
        if self._used + need <= self.capacity_bytes:
            return True
        victims = []
        freed = 0
        for key, size in self._index.items():
            if self._used - freed + need <= self.capacity_bytes:
                break
            if self._loading[key]:
                continue
            victims.append(key)
            freed += size
        if self._used - freed + need > self.capacity_bytes:
            return False
        for key in victims:
            self._used -= self._index.pop(key)
            self._stats["evictions"] += 1
            self._queue_delete(key, "eviction")
        return True

    def _index_add(self, key: bytes, size: int) -> None:
        if key in self._index:
            self._index.move_to_end(key)
            return
        self._index[key] = size
        self._used += size
        self._heads.pop(key, None)

    def _index_remove(self, key: bytes) -> None:
        size = self._index.pop(key, None)
        if size is not None:
            self._used -= size

    def _queue_delete(self, key: bytes, reason: str) -> None:
        self._delete_queue[key] = reason
        self._deleting.setdefault(key, threading.Event())
        self._heads.pop(key, None)
        if not self._delete_scheduled:
            self._delete_scheduled = True
            try:
                self._deleter.submit(self._delete_loop)
            except RuntimeError:  # shut down: shutdown() drains the queue itself
                self._delete_scheduled = False

    def _delete_loop(self) -> None:
        """Send queued deletes as DeleteObjects batches until the queue is empty (deleter thread)."""
        while True:
            with self._lock:
                batch = list(self._delete_queue)[:DELETE_BATCH]
                if not batch:
                    self._delete_scheduled = False
                    return
                for key in batch:
                    del self._delete_queue[key]
            self._delete_batch(batch)

    def _delete_batch(self, batch: list[bytes]) -> None:
        failed = len(batch)
        try:
            errors = self._client.delete_many([self.object_key(k) for k in batch])
            failed = len(errors)
            for name, code in list(errors.items())[:3]:
                logger.warning("s3 tier: delete of %s failed: %s", name, code)
        except BaseException as exc:
            self._count_error(exc, f"DeleteObjects of {len(batch)} keys")
        finally:
            with self._lock:
                self._stats["delete_requests"] += 1
                self._stats["objects_deleted"] += len(batch) - failed
                self._stats["delete_failures"] += failed
                for key in batch:
                    event = self._deleting.pop(key, None)
                    if event is not None:
                        event.set()

    # -- error accounting ----------------------------------------------------
    def _count_error(self, exc: BaseException, what: str) -> str:
        cls = classify_error(exc)
        with self._lock:
            self._stats[f"errors_{cls}"] += 1
        if cls == "other":
            logger.error("s3 tier: %s failed: %s", what, self._redact(repr(exc)))
        else:
            logger.warning("s3 tier: %s failed (%s): %s", what, cls, self._redact(exc))
        return cls

    # -- the contract ----------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """Whether ``key`` is stored: from the in-memory index, else a background HEAD.

        Returns:
            True: present (in the index). False: absent (or evicted, or the
            tier is shut down). None: a store of it or a HEAD probe is in
            flight; ask again.
        """
        with self._lock:
            if self._closed:
                return False
            if key in self._index:
                self._index.move_to_end(key)
                self._stats["lookups_hit"] += 1
                return True
            if key in self._reserved:
                self._stats["lookups_pending"] += 1
                return None
            if key in self._deleting or not self.head_fallback:
                self._stats["lookups_miss"] += 1
                return False
            state = self._heads.get(key, float("-inf"))
            if state is None:
                self._stats["lookups_pending"] += 1
                return None
            now = time.monotonic()
            if now - state < NEGATIVE_LOOKUP_TTL_S:
                self._stats["lookups_miss"] += 1
                return False
            if len(self._heads) > 100_000:
                self._heads = {k: v for k, v in self._heads.items() if v is None or now - v < NEGATIVE_LOOKUP_TTL_S}
            if self._heads_inflight >= 4 * self.max_concurrency:
                self._stats["lookups_miss"] += 1
                self._stats["heads_skipped"] += 1
                return False
            self._heads[key] = None
            self._heads_inflight += 1
            self._stats["lookups_pending"] += 1
            self._stats["heads_sent"] += 1
        try:
            self._executor.submit(self._head, key)
        except RuntimeError:  # shut down concurrently
            with self._lock:
                self._heads.pop(key, None)
                self._heads_inflight -= 1
            return False
        return None

    def _head(self, key: bytes) -> None:
        found: int | None = None
        try:
            if not self._closed:
                found = self._client.head(self.object_key(key))
        except BaseException as exc:
            self._count_error(exc, "HEAD")
        finally:
            with self._lock:
                self._heads_inflight -= 1
                if found == self.object_bytes and key not in self._deleting:
                    self._index_add(key, found)
                    self._make_room(0)
                else:
                    self._heads[key] = time.monotonic()
                    if found is not None and found != self.object_bytes:
                        self._stats["corrupt_truncated"] += 1
                        self._queue_delete(key, "bad_size")

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` most recently used (eviction order)."""
        with self._lock:
            for key in keys:
                if key in self._index:
                    self._index.move_to_end(key)

    def _new_job(self, job: JobMetadata) -> _Job:
        tracker = _Job(job.job_id, job.keys, job.is_promotion)
        self._jobs[job.job_id] = tracker
        if not job.keys:
            self._finish_block(tracker, True)
        return tracker

    def _finish_block(self, tracker: _Job, ok: bool, key: bytes | None = None) -> None:
        """Record one block's outcome (lock held); report the job when its last block is done."""
        tracker.ok = tracker.ok and ok
        tracker.remaining -= 1
        if ok and tracker.loaded is not None and key is not None:
            tracker.loaded.add(key)
        if tracker.remaining <= 0:
            self._jobs.pop(tracker.job_id, None)
            successful = None
            if not tracker.ok and tracker.loaded:
                successful = [k for k in tracker.keys if k in tracker.loaded]
            self._finished.append(JobResult(tracker.job_id, tracker.ok, successful))

    def _spawn(self, tracker: _Job, is_store: bool, key: bytes, block_id: int) -> None:
        """Run one block's PUT (``is_store``) or GET on the pool; any exception becomes a failed block, counted."""
        kind = "store" if is_store else "load"
        fn: Callable[[bytes, int], bool] = self._put if is_store else self._get

        def run() -> None:
            ok = False
            try:
                ok = (not self._closed) and fn(key, block_id)
            except BaseException as exc:
                cause = self._count_error(exc, f"{kind} of block {key.hex()[:16]}")
                with self._lock:
                    self._stats[f"{kind}_failed_{cause}"] += 1
            finally:
                with self._lock:
                    self._after_block(is_store, key, ok)
                    self._finish_block(tracker, ok, key)

        try:
            self._executor.submit(run)
        except RuntimeError:  # shut down between the check and here
            with self._lock:
                self._after_block(is_store, key, False)
                self._finish_block(tracker, False)

    def _after_block(self, is_store: bool, key: bytes, ok: bool) -> None:
        """Index bookkeeping after a PUT (``is_store``) or GET (lock held)."""
        if is_store:
            self._store_refs[key] -= 1
            if ok:
                self._store_ok.add(key)
            if self._store_refs[key] <= 0:
                del self._store_refs[key]
                reserved = self._reserved.pop(key, 0)
                self._used -= reserved
                if key in self._store_ok:
                    self._store_ok.discard(key)
                    self._index_add(key, self.object_bytes)
                    self._make_room(0)
                self._heads.pop(key, None)
            if not ok:
                self._stats["stores_failed"] += 1
        else:
            self._loading[key] -= 1
            if self._loading[key] <= 0:
                del self._loading[key]
            if ok:
                self._index_add(key, self.object_bytes)
            else:
                self._stats["loads_failed"] += 1

    def submit_store(self, job: JobMetadata) -> None:
        """Queue one conditional PUT per block not yet stored; return at once.

        A key already in the index counts as stored without I/O; a PUT
        answered 412 (another writer got there first) counts as stored. With
        ``capacity_bytes``, least recently used blocks are evicted to make
        room; a block that cannot fit (everything else pinned by loads) fails
        the job and is counted in ``stores_rejected_capacity``.
        """
        with self._lock:
            tracker = self._new_job(job)
            for key, block_id in zip(job.keys, job.block_ids, strict=True):
                if self._closed:
                    self._finish_block(tracker, False)
                    continue
                if key in self._index:
                    self._index.move_to_end(key)
                    self._stats["stores_already_present"] += 1
                    self._finish_block(tracker, True)
                    continue
                if key not in self._reserved:
                    if not self._make_room(self.object_bytes):
                        self._stats["stores_rejected_capacity"] += 1
                        self._stats["store_failed_no_space"] += 1
                        self._finish_block(tracker, False)
                        continue
                    self._reserved[key] = self.object_bytes
                    self._used += self.object_bytes
                self._store_refs[key] += 1
                self._spawn(tracker, True, key, block_id)

    def _put(self, key: bytes, block_id: int) -> bool:
        with self._lock:
            pending_delete = self._deleting.get(key)
        if pending_delete is not None:  # an eviction of this key is queued or in flight: let it finish
            pending_delete.wait()
        slot = self.block(block_id)
        body = b"".join((encode_header(self._digest, key, slot), slot))
        if self._client.put(self.object_key(key), body, if_absent=self.features.conditional_put):
            with self._lock:
                self._stats["blocks_stored"] += 1
                self._stats["bytes_stored"] += len(body)
        else:
            with self._lock:
                self._stats["stores_already_present"] += 1
        return True

    def submit_load(self, job: JobMetadata) -> None:
        """Queue one GET per block; each is verified before its bytes reach the slot.

        A missing, truncated, corrupt or foreign object fails the job; the
        object is deleted and the key answers False from then on.
        """
        with self._lock:
            tracker = self._new_job(job)
            for key, block_id in zip(job.keys, job.block_ids, strict=True):
                if self._closed or key in self._deleting:
                    self._stats["loads_failed"] += 1
                    self._finish_block(tracker, False)
                    continue
                if key in self._index:
                    self._index.move_to_end(key)
                self._loading[key] += 1
                self._spawn(tracker, False, key, block_id)

    def _get(self, key: bytes, block_id: int) -> bool:
        data = self._client.get(self.object_key(key))
        if data is None:
            with self._lock:
                self._stats["loads_missing"] += 1
                self._stats["load_failed_missing"] += 1
                self._index_remove(key)
                self._heads[key] = time.monotonic()
            return False
        slot = self.block(block_id)
        view = memoryview(data)
        try:
            if len(data) != self.object_bytes:
                raise TruncatedBlockError(f"object is {len(data)} bytes, expected {self.object_bytes}")
            verify_block(view[:HEADER_SIZE], view[HEADER_SIZE:], self._digest, key, stored_size=len(data))
        except BlockFormatError as exc:
            logger.warning("s3 tier: block %s is unusable (%s): %s; deleting it", self.object_key(key), exc.reason, exc)
            with self._lock:
                self._stats[f"corrupt_{exc.reason}"] += 1
                self._stats[f"load_failed_{exc.reason}"] += 1
                self._index_remove(key)
                self._queue_delete(key, exc.reason)
                self._heads[key] = time.monotonic()  # absent for the negative-lookup TTL
            return False
        slot[:] = view[HEADER_SIZE:]
        with self._lock:
            self._stats["blocks_loaded"] += 1
            self._stats["bytes_loaded"] += len(data)
        return True

    def get_finished(self) -> Iterable[JobResult]:
        """The jobs finished since the last call; each job appears exactly once."""
        with self._lock:
            finished, self._finished = self._finished, []
        return finished

    def has_pending_work(self) -> bool:
        """Whether any job is still in flight."""
        with self._lock:
            return bool(self._jobs)

    def stats(self) -> dict[str, int | float]:
        """Counters: lookups, blocks/bytes stored and loaded, evictions, corruption and errors by class.

        Keys: ``lookups_hit``, ``lookups_miss``, ``lookups_pending``,
        ``heads_sent``, ``heads_skipped``, ``blocks_stored``, ``bytes_stored``,
        ``stores_already_present``, ``stores_failed``,
        ``stores_rejected_capacity``, ``blocks_loaded``, ``bytes_loaded``,
        ``loads_failed``, ``loads_missing``, ``corrupt_truncated``,
        ``corrupt_checksum``, ``corrupt_foreign``, ``evictions``,
        ``delete_requests``, ``objects_deleted``, ``delete_failures``,
        ``errors_<class>`` for every class of
        :data:`tiering.s3.errors.ERROR_CLASSES`, ``resident_blocks``,
        ``resident_bytes``, ``capacity_bytes`` (0: unbounded),
        ``inflight_jobs``, ``inflight_stores``, ``inflight_loads``,
        ``startup_listed_blocks``, ``startup_seconds``,
        ``conditional_put_supported`` (1/0); and, per the core convention,
        ``store_failed_<cause>`` / ``load_failed_<cause>`` (blocks; cause: an
        error class, ``no_space``, ``missing``, ``checksum``, ``truncated``,
        ``foreign``), present once non-zero.
        """
        with self._lock:
            out: dict[str, int | float] = {name: self._stats[name] for name in _STAT_NAMES}
            out.update(
                {k: v for k, v in self._stats.items() if k.startswith(("corrupt_", "store_failed_", "load_failed_"))}
            )
            out.update({f"errors_{c}": self._stats[f"errors_{c}"] for c in ERROR_CLASSES})
            out["resident_blocks"] = len(self._index)
            out["resident_bytes"] = sum(self._index.values())
            out["capacity_bytes"] = self.capacity_bytes or 0
            out["inflight_jobs"] = len(self._jobs)
            out["inflight_stores"] = sum(self._store_refs.values())
            out["inflight_loads"] = sum(self._loading.values())
        out["startup_seconds"] = round(getattr(self, "startup_seconds", 0.0), 3)
        out["conditional_put_supported"] = int(self.features.conditional_put)
        out["batch_delete_supported"] = int(self._client.batch_delete)
        return out

    def shutdown(self) -> None:
        """Stop: queued blocks fail fast, running requests finish, queued deletes are sent; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._executor.shutdown(wait=True)
        self._deleter.shutdown(wait=True)
        self._delete_loop()  # anything queued after the deleter stopped
        self._client.close()
        logger.info("s3 tier %r shut down: %s", self.tier_type, self.stats())
