"""The LMCache L2 adapter: one tiering tier behind LMCache's ``L2AdapterInterface`` (LMCache 0.5.6).

LMCache's storage controllers call the adapter from two threads (store, and
prefetch: lookup-and-lock, load, unlock); every call returns at once with a
task id, and completion is signalled on three event fds. Here those calls
only queue work for the :class:`~tiering.lmcache.worker.TierWorker`,
one thread that owns the tier and moves objects through a host staging
buffer of ``staging_objects`` rows, so LMCache's threads never wait on I/O.
The buffer is faulted in once when the adapter starts
(:class:`~tiering.lmcache.staging.StagingBuffer`), so no store or load
pays a first touch of its pages, and its rows are whole multiples of 4 KiB
at page-aligned addresses, so a tier can move them with ``O_DIRECT``.

A store copies each object from LMCache's L1 buffer into a staging row
(:func:`~tiering.lmcache.keys.pack_row`); a load lets the tier read and
verify the row, then copies the payload into LMCache's own L1 buffer. An
object is only marked loaded when the tier verified every byte of its row
and the row's length equals the buffer's.

A lookup hit is locked for ``lock_ttl_s`` (:meth:`TieringL2Adapter._lock_hits`):
the lock pins the block in the tier (a tier with ``max_pinned_bytes`` never
evicts it before the pin's end; see :mod:`tiering.core.policies.pin_records`) and
bumps it in the tier's recency order (all a tier that cannot pin gets); the
last unlock ends the pin, and an unlock that never comes expires with the
pin instead of leaking (the pin's expiry lives with the tier's blocks). Eviction is the tier's own
(``capacity_bytes`` on the tier): the adapter declares no global capacity to
LMCache, and :meth:`TieringL2Adapter.get_usage` reports the bytes the tier
really holds, which a persistent tier recovers when it restarts, and the
bytes per cache salt, which the adapter counts again at start from the keys
the tier lists (:mod:`tiering.lmcache.usage`).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import AdapterUsage, L2AdapterInterface
from lmcache.v1.platform import create_event_notifier
from tiering.core.base import OffloadKey, ReqContext
from tiering.core.base import SecondaryTierManager as TieringTier
from tiering.core.capabilities import PinnableTier, can_pin
from tiering.core.factory import create_secondary_tier
from tiering.core.runtime.tiering_spec import TieringOffloadingSpec
from tiering.lmcache.keys import encode_key
from tiering.lmcache.params import AdapterParams, parse_params, stack_config
from tiering.lmcache.staging import StagingBuffer
from tiering.lmcache.usage import SaltUsage, scan_keys
from tiering.lmcache.worker import Task, TierWorker

logger = logging.getLogger(__name__)


def _bitmap(size: int, indices: set[int]) -> Any:
    bitmap = Bitmap(size)
    for index in sorted(indices):
        bitmap.set(index)
    return bitmap


class TieringL2Adapter(L2AdapterInterface):  # type: ignore[misc]
    """LMCache L2 adapter running one tiering tier (fs, s3, redis, example or out-of-tree).

    Built by LMCache's plugin loader from ``{"type": "plugin", "module_path":
    "tiering.lmcache.adapter", "class_name": "TieringL2Adapter",
    "adapter_params": {...}}``.

    Args:
        adapter_params: the plugin entry's ``adapter_params``
            (:func:`~tiering.lmcache.params.parse_params`): ``tier`` (a
            tiering tier entry, as in ``secondary_tiers``), ``object_bytes``
            (largest LMCache object, bytes or a size such as ``"4MiB"``),
            ``staging_objects`` (default 64), ``lock_ttl_s`` (default 300),
            ``lookup_timeout_s`` (default 5).
        l1_memory_desc: LMCache's L1 arena descriptor; unused (objects are
            copied through the staging buffer).
        **_unused: arguments later LMCache versions pass; ignored.

    Raises:
        ValueError, TypeError: a bad ``adapter_params`` key or value (named),
            or whatever the tier's constructor raises for its own keys.
    """

    def __init__(self, adapter_params: Mapping[str, Any], l1_memory_desc: Any = None, **_unused: Any) -> None:
        super().__init__(max_capacity_bytes=0)
        self.params: AdapterParams = parse_params(adapter_params)
        config = stack_config(self.params)  # the stack `tiering stat` opens from this adapter's JSON, too
        self.block_bytes: int = config["block_bytes"]
        # Page-aligned, pre-faulted rows of whole 4 KiB pages: O_DIRECT tiers use them as they are.
        self.staging = StagingBuffer(self.params.staging_objects, self.block_bytes)
        self._view = self.staging.view
        spec = TieringOffloadingSpec(config)
        self.namespace = spec.namespace
        try:
            self.tier: TieringTier = create_secondary_tier(self.params.tier, self._view, spec)
        except BaseException:
            self.staging.close()
            raise
        self._store_efd = create_event_notifier()
        self._lookup_efd = create_event_notifier()
        self._load_efd = create_event_notifier()
        self._lock = threading.Lock()  # guards everything the LMCache threads and the worker share
        self._ids = itertools.count()
        self._store_results: dict[int, Any] = {}
        self._lookup_results: dict[int, Any] = {}
        self._load_results: dict[int, Any] = {}
        self._locks: dict[OffloadKey, tuple[int, float]] = {}  # key -> (holders, expiry in monotonic seconds)
        self._locks_expired = 0
        self._to_unpin: list[OffloadKey] = []  # unlocked keys whose pins the worker thread ends
        self._usage = SaltUsage(self.block_bytes)  # rows the tier holds per cache salt
        self._closed = False
        self._worker = TierWorker(
            self.tier,
            self._view,
            lookup_timeout_s=self.params.lookup_timeout_s,
            object_bytes=self.params.object_bytes,
            on_complete=self._complete,
            on_removed=self._removed,
            on_tick=self._expire_locks,
        )
        logger.info(
            "tiering L2 adapter: tier %r, rows of %d bytes, %d staging rows (faulted in in %.3f s), namespace %s",
            self.params.tier["type"],
            self.block_bytes,
            self.params.staging_objects,
            self.staging.populate_s,
            self.namespace.digest,
        )
        threading.Thread(target=self._restore_usage, name="tiering-lmcache-scan", daemon=True).start()

    # -- event fds ---------------------------------------------------------------
    def get_store_event_fd(self) -> int:
        """The fd signalled when a store task completes."""
        return int(self._store_efd.fileno())

    def get_lookup_and_lock_event_fd(self) -> int:
        """The fd signalled when a lookup-and-lock task completes."""
        return int(self._lookup_efd.fileno())

    def get_load_event_fd(self) -> int:
        """The fd signalled when a load task completes."""
        return int(self._load_efd.fileno())

    # -- LMCache calls (any thread) ----------------------------------------------------
    def _submit(self, kind: str, keys: Sequence[Any], objects: Sequence[Any] = ()) -> int:
        if kind != "lookup" and len(objects) != len(keys):
            raise ValueError(f"{kind} task: {len(keys)} keys but {len(objects)} objects")
        okeys = [encode_key(k) for k in keys]
        tenants = [k.cache_salt for k in keys]
        with self._lock:
            # Queued under the lock that close() takes: no task can land behind the worker's stop mark.
            if self._closed:
                raise RuntimeError("TieringL2Adapter is closed")
            for salt in set(tenants):
                self._usage.learn(salt)
            task = Task(kind, next(self._ids), list(keys), okeys, tenants, list(objects))
            self._worker.submit(task)
        return task.task_id

    def submit_store_task(self, keys: list[Any], objects: list[Any], *args: Any, **kwargs: Any) -> int:
        """Queue a store of ``objects`` (LMCache ``MemoryObj``, read until the task completes) under ``keys``.

        Returns the task id; the result (:class:`L2StoreResult`: success and
        object bytes written) comes from :meth:`pop_completed_store_tasks`.
        A task fails as a whole when any object was not stored.

        Raises:
            ValueError: ``keys`` and ``objects`` differ in length.
            RuntimeError: the adapter is closed.
        """
        return self._submit("store", keys, objects)

    def pop_completed_store_tasks(self) -> dict[int, Any]:
        """Every store task completed since the last call: task id -> ``L2StoreResult``."""
        with self._lock:
            done, self._store_results = self._store_results, {}
        return done

    def submit_lookup_and_lock_task(self, keys: list[Any], *args: Any, **kwargs: Any) -> int:
        """Queue a lookup of ``keys``; hits are locked (see the module docs). Extra arguments are ignored."""
        return self._submit("lookup", keys)

    def query_lookup_and_lock_result(self, task_id: int) -> Any:
        """The hit bitmap of a lookup task once (then None again), or None while it runs."""
        with self._lock:
            return self._lookup_results.pop(task_id, None)

    def submit_unlock(self, keys: list[Any], *args: Any, **kwargs: Any) -> None:
        """Release one lock on each of ``keys``; never fails (unknown or expired keys are ignored)."""
        with self._lock:
            for key in keys:
                okey = encode_key(key)
                holders = self._locks.get(okey)
                if holders is None:
                    continue
                if holders[0] <= 1:
                    del self._locks[okey]
                    if can_pin(self.tier):
                        self._to_unpin.append(okey)  # ended on the worker thread: an unpin may wait on the tier
                else:
                    self._locks[okey] = (holders[0] - 1, holders[1])

    def submit_load_task(self, keys: list[Any], objects: list[Any], *args: Any, **kwargs: Any) -> int:
        """Queue a load of ``keys`` into ``objects`` (LMCache's L1 buffers, written until the task completes).

        Raises:
            ValueError: ``keys`` and ``objects`` differ in length.
            RuntimeError: the adapter is closed.
        """
        return self._submit("load", keys, objects)

    def query_load_result(self, task_id: int) -> Any:
        """The loaded bitmap of a load task once (then None again), or None while it runs."""
        with self._lock:
            return self._load_results.pop(task_id, None)

    # -- accounting and status -------------------------------------------------------
    def _tier_stats(self) -> dict[str, int | float]:
        try:
            return dict(self.tier.stats())
        except Exception:
            logger.exception("tiering L2 adapter: tier stats raised")
            return {}

    def get_usage(self) -> Any:
        """Bytes the tier holds (its ``resident_bytes``, recovered on restart), its cap, and bytes per cache salt.

        ``bytes_by_cache_salt`` counts one row (:func:`~tiering.lmcache.keys.row_bytes`) per
        object the tier holds: those this process stored and those the tier
        held at start (counted again from their keys once listed), minus
        those the tier removed since. A tier without ``resident_bytes``
        reports the sum of the rows counted instead.
        """
        stats = self._tier_stats()
        with self._lock:
            by_salt = self._usage.by_salt()
            counted = sum(by_salt.values()) + self._usage.unnamed_bytes()
        used = stats.get("resident_bytes")
        return AdapterUsage(
            total_bytes_used=int(used) if used is not None else counted,
            total_capacity_bytes=int(stats.get("capacity_bytes", 0) or 0),
            bytes_by_cache_salt=MappingProxyType(by_salt),
        )

    def report_status(self) -> dict[str, Any]:
        """Health (the worker thread is alive), locks held and expired, errors, the staging buffer, the tier's stats.

        ``staging_bytes`` is the staging buffer's size and ``staging_populate_s`` the seconds its pages took to
        fault in at start (paid once).
        """
        with self._lock:
            locks, expired = len(self._locks), self._locks_expired
        return {
            "is_healthy": self._worker.is_alive(),
            "type": type(self).__name__,
            "tier": self.params.tier["type"],
            "namespace": self.namespace.digest,
            "locked_keys": locks,
            "locks_expired": expired,
            "errors": self._worker.errors,
            "staging_bytes": self.staging.nbytes,
            "staging_populate_s": round(self.staging.populate_s, 6),
            "tier_stats": self._tier_stats(),
        }

    def close(self) -> None:
        """Finish the tier jobs in flight, fail the tasks not started, shut the tier down, close the fds.

        Calling it again does nothing.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._worker.stop()
        self.tier.shutdown()
        for efd in (self._store_efd, self._lookup_efd, self._load_efd):
            efd.close()
        try:
            self.staging.close()
        except BufferError:
            logger.debug("tiering L2 adapter: the tier still exports the staging buffer")

    # -- the worker's callbacks (worker thread) ---------------------------------------------
    def _complete(self, task: Task) -> None:
        """Publish a finished task's result, update locks and accounting, signal its fd."""
        if task.kind == "restore":
            with self._lock:
                new = self._usage.restored(task.okeys[i] for i in task.hits)
            logger.info("tiering L2 adapter: %d object(s) held by the tier at start counted per cache salt", new)
            return
        if task.kind == "store":
            with self._lock:
                new_keys = [task.keys[i] for i in task.stored if self._usage.stored(task.okeys[i], task.keys[i])]
                self._store_results[task.task_id] = L2StoreResult(not task.failed, task.bytes_done)
            if new_keys:
                self._notify_keys_stored(new_keys, [self.block_bytes] * len(new_keys))
            self._store_efd.notify()
            return
        bitmap = _bitmap(len(task.keys), task.hits)
        if task.kind == "load":
            with self._lock:
                self._load_results[task.task_id] = bitmap
            if task.hits:
                self._notify_keys_accessed([task.keys[i] for i in sorted(task.hits)])
            self._load_efd.notify()
            return
        self._lock_hits(task)
        with self._lock:
            self._lookup_results[task.task_id] = bitmap
        self._lookup_efd.notify()

    def _lock_hits(self, task: Task) -> None:
        """Lock a lookup's hits against eviction until their unlock, or ``lock_ttl_s`` at most (worker thread).

        A tier with pinning on (:class:`~tiering.core.capabilities.PinnableTier`) pins the hits for
        ``lock_ttl_s``; every tier is told of a use (the hits become the most recently used in its eviction
        order), one call each per tenant; each hit's holders are counted with an expiry that
        :meth:`submit_unlock` and :meth:`_expire_locks` honour.
        """
        by_tenant: dict[str, list[OffloadKey]] = {}
        for index in sorted(task.hits):
            by_tenant.setdefault(task.tenant(index), []).append(task.okeys[index])
        for tenant, okeys in by_tenant.items():
            try:
                if isinstance(self.tier, PinnableTier) and self.tier.pinning:  # else a refusal per lookup is noise
                    self.tier.pin(okeys, self.params.lock_ttl_s)
                self.tier.touch(okeys, ReqContext(f"lmcache-lookup-{task.task_id}", tenant=tenant))
            except Exception:
                logger.exception("tiering L2 adapter: tier pin or touch raised")
                self._worker.errors += 1
        expiry = time.monotonic() + self.params.lock_ttl_s
        with self._lock:
            for okeys in by_tenant.values():
                for okey in okeys:
                    self._locks[okey] = (self._locks.get(okey, (0, 0.0))[0] + 1, expiry)

    def _removed(self, keys: list[OffloadKey]) -> None:
        """The tier removed ``keys`` (its own eviction): take their bytes out of the per-salt accounting."""
        with self._lock:
            gone = self._usage.removed(keys)
        if gone:
            self._notify_keys_deleted(gone, [self.block_bytes] * len(gone))

    def _restore_usage(self) -> None:
        """List the keys the tier holds (its inspector, off the LMCache threads) and have them counted per salt."""
        try:
            okeys = scan_keys(self.params.tier, self.namespace.digest)
        except Exception:
            logger.exception(
                "tiering L2 adapter: listing the tier's objects at start failed; per-salt usage "
                "counts only objects stored from now on"
            )
            return
        if not okeys:
            return
        with self._lock:
            if self._closed:
                return
            self._worker.submit(Task("restore", next(self._ids), okeys, okeys))

    def _expire_locks(self) -> None:
        """End the pins of unlocked keys; drop locks whose unlock never came within ``lock_ttl_s`` (worker thread).

        An expired lock's pin ends by itself on the tier at the same time.
        """
        now = time.monotonic()
        with self._lock:
            expired = [key for key, (_, expiry) in self._locks.items() if expiry <= now]
            for key in expired:
                del self._locks[key]
            self._locks_expired += len(expired)
            unpin, self._to_unpin = self._to_unpin, []
        if unpin:
            try:
                if isinstance(self.tier, PinnableTier):
                    self.tier.unpin(unpin)
            except Exception:
                logger.exception("tiering L2 adapter: tier unpin raised")
                self._worker.errors += 1
        if expired:
            logger.warning("tiering L2 adapter: %d lock(s) expired without an unlock", len(expired))
