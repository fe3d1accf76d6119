"""The LMCache L2 adapter: one tiering tier behind LMCache's ``L2AdapterInterface`` (LMCache 0.5.6).

LMCache's storage controllers call the adapter from two threads (store, and
prefetch: lookup-and-lock, load, unlock); every call returns at once with a
task id, and completion is signalled on three event fds. Here those calls
only queue work: one worker thread owns the tier (tiers are driven from a
single thread, as an engine's scheduler drives them), moves objects through
a host staging buffer of ``staging_objects`` rows, submits the tier's jobs
and collects their results, so LMCache's threads never wait on I/O.

A store copies each object from LMCache's L1 buffer into a staging row
(:func:`~tiering.core.lmcache.keys.pack_row`); a load lets the tier read and
verify the row, then copies the payload into LMCache's own L1 buffer. An
object is only marked loaded when the tier verified every byte of its row
and the row's length equals the buffer's.

A lookup hit is locked for ``lock_ttl_s``: the lock bumps the block in the
tier's recency order (the tier's own eviction takes the least recently used
first) and an unlock that never comes expires instead of leaking. Eviction is
the tier's own (``capacity_bytes`` on the tier): the adapter declares no
global capacity to LMCache, and :meth:`TieringL2Adapter.get_usage` reports
the bytes the tier really holds, which a persistent tier recovers when it
restarts.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import mmap
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import AdapterUsage, L2AdapterInterface
from lmcache.v1.platform import create_event_notifier

from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext
from tiering.core.base import SecondaryTierManager as TieringTier
from tiering.core.lmcache.keys import encode_key, namespace_config, pack_row, row_payload
from tiering.core.lmcache.params import AdapterParams, parse_params
from tiering.core.spec import TieringOffloadingSpec
from tiering.core.tier_factory import create_secondary_tier
from tiering.core.toolkit.events import BlockRemoved

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.05
_MIN_POLL_S = 0.0002
_MAX_POLL_S = 0.005
_LOCK_SWEEP_S = 1.0
_CLOSE_WAIT_S = 60.0  # close() waits this long for the tier's jobs in flight


def _flat(obj: Any) -> memoryview:
    """An LMCache ``MemoryObj``'s bytes (its ``byte_array``, the physical size) as a flat view, no copy."""
    return memoryview(obj.byte_array).cast("B")


@dataclasses.dataclass
class _Task:
    """One LMCache task while the worker runs it."""

    kind: str  # "store", "load" or "lookup"
    task_id: int
    keys: Sequence[Any]
    okeys: list[OffloadKey]
    objects: Sequence[Any] = ()
    bitmap: Any = None
    submitted: int = 0  # keys handed to the tier so far (store, load)
    outstanding: int = 0  # tier jobs not reported yet
    failed: bool = False
    completed: bool = False
    abandoned: bool = False  # reported failed already; its jobs still in flight only free their rows
    bytes_done: int = 0
    stored: list[int] = dataclasses.field(default_factory=list)
    pending: list[int] = dataclasses.field(default_factory=list)  # lookup: keys still "not known yet"
    deadline: float = 0.0

    def done(self) -> bool:
        return self.submitted == len(self.keys) and self.outstanding == 0


class TieringL2Adapter(L2AdapterInterface):  # type: ignore[misc]
    """LMCache L2 adapter running one tiering tier (fs, s3, redis, example or out-of-tree).

    Built by LMCache's plugin loader from ``{"type": "plugin", "module_path":
    "tiering.core.lmcache.adapter", "class_name": "TieringL2Adapter",
    "adapter_params": {...}}``.

    Args:
        adapter_params: the plugin entry's ``adapter_params``
            (:func:`~tiering.core.lmcache.params.parse_params`): ``tier`` (a
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
        config = namespace_config(self.params.object_bytes)
        self.block_bytes: int = config["block_bytes"]
        rows = self.params.staging_objects
        # Page-aligned anonymous memory, so tiers that read with O_DIRECT can use the rows as they are.
        self._buffer = mmap.mmap(-1, rows * self.block_bytes)
        self._view = memoryview(self._buffer).cast("B", (rows, self.block_bytes))
        spec = TieringOffloadingSpec(
            {**config, "cpu_bytes_to_use": rows * self.block_bytes, "secondary_tiers": [dict(self.params.tier)]}
        )
        self.namespace = spec.namespace
        try:
            self.tier: TieringTier = create_secondary_tier(self.params.tier, self._view, spec)
        except BaseException:
            self._view.release()
            self._buffer.close()
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
        self._stored: dict[OffloadKey, tuple[Any, int]] = {}  # key -> (ObjectKey, payload bytes) stored here
        self._errors = 0
        self._closed = False
        # Worker-only state.
        self._incoming: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        # Loads first: LMCache waits on them to serve a request, stores only free L1 later.
        self._waiting: dict[str, collections.deque[_Task]] = {"load": collections.deque(), "store": collections.deque()}
        self._lookups: list[_Task] = []
        self._jobs: dict[int, tuple[_Task, list[int], list[int]]] = {}
        self._free_rows = list(range(rows))
        self._job_ids = itertools.count()
        self._worker = threading.Thread(target=self._run, name="tiering-lmcache", daemon=True)
        self._worker.start()
        logger.info(
            "tiering L2 adapter: tier %r, rows of %d bytes, %d staging rows, namespace %s",
            self.params.tier["type"],
            self.block_bytes,
            rows,
            self.namespace.digest,
        )

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
        with self._lock:
            # Queued under the lock that close() takes: no task can land behind the worker's stop mark.
            if self._closed:
                raise RuntimeError("TieringL2Adapter is closed")
            task = _Task(kind, next(self._ids), list(keys), okeys, list(objects))
            if kind != "store":
                task.bitmap = Bitmap(len(keys))
            self._incoming.put(task)
        return task.task_id

    def submit_store_task(self, keys: list[Any], objects: list[Any], *args: Any, **kwargs: Any) -> int:
        """Queue a store of ``objects`` (LMCache ``MemoryObj``, read until the task completes) under ``keys``.

        Returns the task id; the result (:class:`L2StoreResult`: success and
        payload bytes written) comes from :meth:`pop_completed_store_tasks`.
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

        ``bytes_by_cache_salt`` counts the payload bytes of objects this
        process stored and the tier still holds (removals the tier reports
        are subtracted). A tier without ``resident_bytes`` reports the sum of
        those instead.
        """
        base = super().get_usage()
        stats = self._tier_stats()
        used = stats.get("resident_bytes")
        return AdapterUsage(
            total_bytes_used=int(used) if used is not None else base.total_bytes_used,
            total_capacity_bytes=int(stats.get("capacity_bytes", 0) or 0),
            bytes_by_cache_salt=MappingProxyType(dict(base.bytes_by_cache_salt)),
        )

    def report_status(self) -> dict[str, Any]:
        """Health (the worker thread is alive), locks held and expired, errors, and the tier's stats."""
        with self._lock:
            locks, expired, errors = len(self._locks), self._locks_expired, self._errors
        return {
            "is_healthy": self._worker.is_alive(),
            "type": type(self).__name__,
            "tier": self.params.tier["type"],
            "namespace": self.namespace.digest,
            "locked_keys": locks,
            "locks_expired": expired,
            "errors": errors,
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
            self._incoming.put(None)
        self._worker.join()
        self.tier.shutdown()
        for efd in (self._store_efd, self._lookup_efd, self._load_efd):
            efd.close()
        try:
            self._view.release()
            self._buffer.close()
        except BufferError:
            logger.debug("tiering L2 adapter: the tier still exports the staging buffer")

    # -- the worker -------------------------------------------------------------------
    def _run(self) -> None:
        delay, stopping, next_sweep = _MIN_POLL_S, False, time.monotonic() + _LOCK_SWEEP_S
        stop_deadline = float("inf")
        while True:
            busy = bool(self._jobs or self._lookups)
            try:
                item = self._incoming.get(timeout=delay if busy else _IDLE_WAIT_S)
                while True:
                    if item is None:
                        stopping, stop_deadline = True, time.monotonic() + _CLOSE_WAIT_S
                    else:
                        self._accept(item)
                    item = self._incoming.get_nowait()
            except queue.Empty:
                pass
            try:
                progress = self._step(stopping)
                if stopping and (not self._jobs or time.monotonic() > stop_deadline):
                    if self._jobs:
                        logger.error("tiering L2 adapter: %d tier job(s) unreported at close", len(self._jobs))
                    self._fail_all()
                    return
                if time.monotonic() >= next_sweep:
                    self._expire_locks()
                    next_sweep = time.monotonic() + _LOCK_SWEEP_S
            except Exception:
                # A bug here must not leave LMCache waiting forever: fail everything in flight.
                logger.exception("tiering L2 adapter worker failed a step; failing the tasks in flight")
                with self._lock:
                    self._errors += 1
                try:
                    self._fail_all()
                except Exception:
                    logger.exception("tiering L2 adapter could not report the tasks in flight")
                progress = True
            delay = _MIN_POLL_S if progress else min(delay * 2, _MAX_POLL_S)

    def _accept(self, task: _Task) -> None:
        if task.kind == "lookup":
            task.pending = list(range(len(task.keys)))
            task.deadline = time.monotonic() + self.params.lookup_timeout_s
            self._lookups.append(task)
        else:
            self._waiting[task.kind].append(task)

    def _step(self, stopping: bool) -> bool:
        progress = False
        if not stopping:
            progress |= self._start_jobs()
            progress |= self._poll_lookups()
        progress |= self._collect()
        self._take_events()
        return progress

    def _context(self, task: _Task) -> ReqContext:
        return ReqContext(f"lmcache-{task.kind}-{task.task_id}")

    def _start_jobs(self) -> bool:
        started = False
        while self._free_rows and (queue_ := self._waiting["load"] or self._waiting["store"]):
            task = queue_[0]
            count = min(len(self._free_rows), len(task.keys) - task.submitted)
            indices = list(range(task.submitted, task.submitted + count))
            task.submitted += count
            if task.submitted == len(task.keys):
                queue_.popleft()
            rows = [self._free_rows.pop() for _ in indices]
            if task.kind == "store":
                indices, rows = self._pack(task, indices, rows)
            if task.kind == "load":
                # One job per object: a tier reports a failed load's successes only as a leading
                # run, while LMCache takes every object that loaded (a bitmap).
                for index, row in zip(indices, rows, strict=True):
                    self._submit_job(task, [index], [row])
            elif indices:
                self._submit_job(task, indices, rows)
            if task.done():  # nothing left in flight: an empty task, or every object refused
                self._complete(task)
            started = True
        return started

    def _pack(self, task: _Task, indices: list[int], rows: list[int]) -> tuple[list[int], list[int]]:
        """Copy the objects into their rows; an object that does not fit fails the task (its row is freed)."""
        kept_i, kept_r = [], []
        for index, row in zip(indices, rows, strict=True):
            try:
                pack_row(self._view[row : row + 1].cast("B"), _flat(task.objects[index]))
            except ValueError as exc:
                logger.error("tiering L2 adapter: store task %d: %s", task.task_id, exc)
                task.failed = True
                self._free_rows.append(row)
                continue
            kept_i.append(index)
            kept_r.append(row)
        return kept_i, kept_r

    def _submit_job(self, task: _Task, indices: list[int], rows: list[int]) -> None:
        job = JobMetadata(
            job_id=next(self._job_ids),
            keys=[task.okeys[i] for i in indices],
            block_ids=rows,
            is_promotion=task.kind == "load",
            req_context=self._context(task),
        )
        self._jobs[job.job_id] = (task, indices, rows)
        task.outstanding += 1
        try:
            (self.tier.submit_load if job.is_promotion else self.tier.submit_store)(job)
        except Exception:
            logger.exception("tiering L2 adapter: the tier refused %s job %d", task.kind, job.job_id)
            with self._lock:
                self._errors += 1
            self._finish_job(JobResult(job.job_id, False))

    def _collect(self) -> bool:
        results = list(self.tier.get_finished())
        for result in results:
            self._finish_job(result)
        return bool(results)

    def _finish_job(self, result: JobResult) -> None:
        entry = self._jobs.pop(result.job_id, None)
        if entry is None:
            logger.error("tiering L2 adapter: the tier reported unknown job %d; dropped", result.job_id)
            with self._lock:
                self._errors += 1
            return
        task, indices, rows = entry
        if task.abandoned:
            self._free_rows.extend(rows)
            return
        if task.kind == "store":
            if result.success:
                for index, row in zip(indices, rows, strict=True):
                    task.bytes_done += len(row_payload(self._view[row : row + 1].cast("B")))
                    task.stored.append(index)
            else:
                task.failed = True
        else:
            self._unpack(task, indices, rows, result)
        self._free_rows.extend(rows)
        task.outstanding -= 1
        if task.done():
            self._complete(task)

    def _unpack(self, task: _Task, indices: list[int], rows: list[int], result: JobResult) -> None:
        """Copy each verified row's payload into its L1 buffer; a row of another size is a miss."""
        loaded = None if result.success else {bytes(k) for k in result.successful_keys or ()}
        for index, row in zip(indices, rows, strict=True):
            if loaded is not None and task.okeys[index] not in loaded:
                continue
            try:
                payload = row_payload(self._view[row : row + 1].cast("B"))
                target = _flat(task.objects[index])
                if len(payload) != len(target):
                    raise ValueError(f"stored object is {len(payload)} bytes, the L1 buffer {len(target)}")
                target[:] = payload
            except (ValueError, TypeError) as exc:
                logger.warning("tiering L2 adapter: load task %d key %d refused: %s", task.task_id, index, exc)
                continue
            task.bitmap.set(index)

    def _poll_lookups(self) -> bool:
        progress, now, still = False, time.monotonic(), []
        for task in self._lookups:
            pending = []
            for index in task.pending:
                try:
                    verdict = self.tier.lookup(task.okeys[index], self._context(task))
                except Exception:
                    logger.exception("tiering L2 adapter: tier lookup raised; a miss")
                    verdict = False
                if verdict is None:
                    pending.append(index)
                elif verdict:
                    task.bitmap.set(index)
            progress |= len(pending) != len(task.pending)
            task.pending = pending
            if pending and now < task.deadline:
                still.append(task)
            else:
                self._complete(task)
                progress = True
        self._lookups = still
        return progress

    def _take_events(self) -> None:
        removed = [k for event in self.tier.take_events() if isinstance(event, BlockRemoved) for k in event.keys]
        gone = []
        with self._lock:
            for key in removed:
                entry = self._stored.pop(key, None)
                if entry is not None:
                    gone.append(entry)
        if gone:
            self._notify_keys_deleted([k for k, _ in gone], [s for _, s in gone])

    def _expire_locks(self) -> None:
        now = time.monotonic()
        with self._lock:
            expired = [key for key, (_, expiry) in self._locks.items() if expiry <= now]
            for key in expired:
                del self._locks[key]
            self._locks_expired += len(expired)
        if expired:
            logger.warning("tiering L2 adapter: %d lock(s) expired without an unlock", len(expired))

    def _complete(self, task: _Task) -> None:
        if task.completed:
            return
        task.completed = True
        if task.kind == "store":
            self._complete_store(task)
        elif task.kind == "load":
            with self._lock:
                self._load_results[task.task_id] = task.bitmap
            hits = task.bitmap.get_indices_list()
            if hits:
                self._notify_keys_accessed([task.keys[i] for i in hits])
            self._load_efd.notify()
        else:
            hits = task.bitmap.get_indices_list()
            expiry = time.monotonic() + self.params.lock_ttl_s
            with self._lock:
                for i in hits:
                    holders = self._locks.get(task.okeys[i], (0, 0.0))[0]
                    self._locks[task.okeys[i]] = (holders + 1, expiry)
                self._lookup_results[task.task_id] = task.bitmap
            if hits:
                try:
                    self.tier.touch([task.okeys[i] for i in hits], self._context(task))
                except Exception:
                    logger.exception("tiering L2 adapter: tier touch raised")
            self._lookup_efd.notify()

    def _complete_store(self, task: _Task) -> None:
        new_keys, sizes = [], []
        with self._lock:
            for index in task.stored:
                okey = task.okeys[index]
                if okey in self._stored:
                    continue
                size = len(_flat(task.objects[index]))
                self._stored[okey] = (task.keys[index], size)
                new_keys.append(task.keys[index])
                sizes.append(size)
            self._store_results[task.task_id] = L2StoreResult(not task.failed, task.bytes_done)
        if new_keys:
            self._notify_keys_stored(new_keys, sizes)
        self._store_efd.notify()

    def _fail_all(self) -> None:
        """Report every task not yet completed as failed (stores) or all-miss (lookups, loads).

        Jobs the tier still runs keep their rows until the tier reports them
        (it may still be writing into them); only then are the rows reused.
        """
        waiting = [*self._waiting["load"], *self._waiting["store"]]
        tasks = {id(t): t for t in [*waiting, *self._lookups, *(e[0] for e in self._jobs.values())]}
        for queued in self._waiting.values():
            queued.clear()
        self._lookups = []
        for task in tasks.values():
            if task.abandoned:
                continue
            task.abandoned = task.failed = True
            task.stored.clear()
            if task.bitmap is not None:
                task.bitmap = Bitmap(len(task.keys))
            task.pending = []
            self._complete(task)
