"""The fs tier's block engine: the in-memory index, job book-keeping and the worker threads.

:class:`BlockWorkers` keeps which blocks exist (an LRU index with a byte
cap), splits jobs into blocks, runs them on read and write threads and
reports each job once. The subclass moves one block
(``_write_block`` / ``_read_block``) and deletes one (``_delete``).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from tiering.core.base import JobMetadata, JobResult, OffloadKey
from tiering.fs.errors import LOAD_CAUSES, STORE_CAUSES
from tiering.fs.scanner import ScanResult

logger = logging.getLogger(__name__)

NEGATIVE_PROBE_TTL_S = 1.0
_MAX_NEGATIVE = 65536
_MAX_TASKS_PER_TAKE = 16  # blocks (or probes) one worker takes off a queue at a time

BASE_COUNTERS = (
    "lookups_hit",
    "lookups_miss",
    "lookups_pending",
    "blocks_stored",
    "bytes_stored",
    "stores_skipped_present",
    "blocks_loaded",
    "bytes_loaded",
    "store_jobs_failed",
    "load_jobs_failed",
    "bad_files_removed",
    "bad_files_kept",
    "evictions",
    "evicted_bytes",
    "temps_removed",
    "scans",
)


class Job:
    """Book-keeping of one submitted job, split into one task per block."""

    __slots__ = ("cause", "failed_at", "loaded", "lock", "meta", "ok", "remaining")

    def __init__(self, meta: JobMetadata) -> None:
        self.meta = meta
        self.remaining = len(meta.keys)
        self.ok = True
        self.cause = ""
        self.failed_at: int | None = None  # lowest block index that failed
        self.loaded: list[int] = []  # indices of blocks loaded and verified
        self.lock = threading.Lock()


class BlockWorkers:
    """Index, jobs and threads of a block tier (see the module doc)."""

    block_bytes: int
    stored_block_bytes: int
    capacity_bytes: int | None
    lookup_fallback: str
    _scan_done: threading.Event

    def __init__(self, n_read_threads: int, n_write_threads: int) -> None:
        self.n_read_threads = n_read_threads
        self.n_write_threads = n_write_threads
        self._lock = threading.Lock()
        self._readers_cv = threading.Condition(self._lock)
        self._writers_cv = threading.Condition(self._lock)
        self._space = threading.Condition(self._lock)
        self._index: collections.OrderedDict[OffloadKey, int] = collections.OrderedDict()  # LRU first
        self._resident_bytes = 0
        self._reserved_bytes = 0
        self._writing: collections.Counter[OffloadKey] = collections.Counter()
        self._probing: set[OffloadKey] = set()
        self._negative: collections.OrderedDict[OffloadKey, float] = collections.OrderedDict()
        self._unremovable: set[OffloadKey] = set()
        self._added_during_scan: set[OffloadKey] | None = None
        self._removed_during_scan: set[OffloadKey] | None = None
        self._counters: collections.Counter[str] = collections.Counter()
        for name in (*BASE_COUNTERS, *(f"store_failed_{c}" for c in STORE_CAUSES)):
            self._counters[name] = 0
        for cause in LOAD_CAUSES:
            self._counters[f"load_failed_{cause}"] = 0
        self._in_flight_jobs = 0
        self._loads: collections.deque[tuple[Job, int]] = collections.deque()
        self._stores: collections.deque[tuple[Job, int]] = collections.deque()
        self._probes: collections.deque[OffloadKey] = collections.deque()
        self._finished: collections.deque[JobResult] = collections.deque()
        self._stopping = False
        self._last_scan_s = 0.0
        self._threads: list[threading.Thread] = []

    # -- hooks of the subclass -------------------------------------------------------
    def _write_block(self, key: OffloadKey, block_id: int) -> None:
        raise NotImplementedError

    def _read_block(self, key: OffloadKey, block_id: int) -> int:
        raise NotImplementedError

    def _remove_bad(self, key: OffloadKey, exc: BaseException) -> bool | None:
        raise NotImplementedError

    def _delete(self, key: OffloadKey) -> bool:
        raise NotImplementedError

    def _stored_size(self, key: OffloadKey) -> int | None:
        raise NotImplementedError

    def _cause(self, exc: BaseException, load: bool, in_index: bool) -> str:
        raise NotImplementedError

    # -- threads --------------------------------------------------------------------
    def start_workers(self) -> None:
        """Start the reader and writer threads."""
        for i in range(self.n_read_threads):
            self._start_thread(f"tiering-fs-read-{i}", True)
        for i in range(self.n_write_threads):
            self._start_thread(f"tiering-fs-write-{i}", False)

    def _start_thread(self, name: str, is_reader: bool) -> None:
        thread = threading.Thread(target=self._worker, args=(is_reader,), name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _is_stopping(self) -> bool:
        return self._stopping

    # -- lookups ----------------------------------------------------------------------
    def _lookup_index(self, key: OffloadKey) -> bool | None:
        with self._lock:
            if self._writing.get(key):
                self._counters["lookups_pending"] += 1
                return None
            if key in self._index:
                self._index.move_to_end(key)
                self._counters["lookups_hit"] += 1
                return True
            if key in self._unremovable:
                self._counters["lookups_miss"] += 1
                return False
            mode = self.lookup_fallback
            if mode == "off":
                if self._scan_done.is_set():
                    self._counters["lookups_miss"] += 1
                    return False
                self._counters["lookups_pending"] += 1
                return None
            if mode == "async":
                expiry = self._negative.get(key)
                if expiry is not None and expiry > time.monotonic():
                    self._counters["lookups_miss"] += 1
                    return False
                if key not in self._probing and not self._stopping:
                    self._probing.add(key)
                    self._probes.append(key)
                    self._readers_cv.notify()
                self._counters["lookups_pending"] += 1
                return None
        # "stat": outside the lock, a few microseconds on a local filesystem.
        found = self._stat_adopt(key)
        with self._lock:
            self._counters["lookups_hit" if found else "lookups_miss"] += 1
        return found

    def _stat_adopt(self, key: OffloadKey) -> bool:
        """Check the filesystem for ``key``; index it when a complete-sized file exists."""
        try:
            size = self._stored_size(key)
        except OSError:
            return False
        if size != self.stored_block_bytes:
            return False
        with self._lock:
            if self._writing.get(key):
                return False
            self._index_add(key, size)
        return True

    def _index_add(self, key: OffloadKey, size: int) -> None:
        """Add or refresh ``key`` as most recently used (caller holds the lock)."""
        old = self._index.get(key)
        if old is not None:
            self._resident_bytes -= old
        self._index[key] = size
        self._index.move_to_end(key)
        self._resident_bytes += size
        self._negative.pop(key, None)
        if self._added_during_scan is not None:
            self._added_during_scan.add(key)

    def _index_drop(self, key: OffloadKey) -> bool:
        """Forget ``key`` (caller holds the lock); True when it was indexed."""
        if self._removed_during_scan is not None:
            # A scan in progress may have listed its file already: do not let it resurrect the key.
            self._removed_during_scan.add(key)
        size = self._index.pop(key, None)
        if size is None:
            return False
        self._resident_bytes -= size
        return True

    def _touch(self, keys: Sequence[OffloadKey]) -> None:
        with self._lock:
            for key in keys:
                if key in self._index:
                    self._index.move_to_end(key)

    # -- jobs -----------------------------------------------------------------------
    def _enqueue(self, job: JobMetadata, load: bool) -> None:
        """Queue one task per block of ``job``."""
        state = Job(job)
        with self._lock:
            if self._stopping or not job.keys:
                self._finished.append(JobResult(job.job_id, not self._stopping))
                return
            self._in_flight_jobs += 1
            queue = self._loads if load else self._stores
            for i, key in enumerate(job.keys):
                if load:
                    if key in self._index:
                        self._index.move_to_end(key)
                elif key not in self._index:
                    self._writing[key] += 1
                queue.append((state, i))
            n = len(job.keys)
            self._readers_cv.notify(n)
            self._writers_cv.notify(n)

    def _take_finished(self) -> list[JobResult]:
        out: list[JobResult] = []
        while True:
            try:
                out.append(self._finished.popleft())
            except IndexError:
                return out

    def has_pending_work(self) -> bool:
        """Whether a job is queued or running."""
        with self._lock:
            return self._in_flight_jobs > 0

    @staticmethod
    def _take(queue: collections.deque[Any], parts: int) -> list[Any]:
        """Pop ``1/parts`` of ``queue`` (caller holds the lock): 1 to :data:`_MAX_TASKS_PER_TAKE` tasks."""
        take = min(_MAX_TASKS_PER_TAKE, max(1, len(queue) // parts))
        return [queue.popleft() for _ in range(take)]

    def _worker(self, is_reader: bool) -> None:
        # Writers take their whole share of stores; loads are taken a quarter share at a time, so no
        # thread is left with a long tail of blocks (a promotion is done when its last block is).
        load_parts = 4 * (self.n_read_threads + self.n_write_threads)
        while True:
            with self._lock:
                while True:
                    if self._loads:
                        kind, tasks = "load", self._take(self._loads, load_parts)
                        break
                    if is_reader and self._probes:
                        kind, tasks = "probe", self._take(self._probes, self.n_read_threads)
                        break
                    if self._stores:
                        # A reader helps one block at a time, to be back for the next load soon.
                        kind = "store"
                        tasks = (
                            [self._stores.popleft()] if is_reader else self._take(self._stores, self.n_write_threads)
                        )
                        break
                    if self._stopping:
                        return
                    (self._readers_cv if is_reader else self._writers_cv).wait()
            for task in tasks:
                if self._stopping and kind != "probe":
                    self._finish_block(task[0], task[1], False, "shutdown")  # taken, not started
                    continue
                try:
                    if kind == "probe":
                        self._probe(task)
                    else:
                        self._run_block(task[0], task[1], load=kind == "load")
                except BaseException:  # never let a worker die silently
                    logger.exception("fs tier worker: unexpected error in %s task", kind)
                    if kind != "probe":
                        self._finish_block(task[0], task[1], False, "internal")

    def _run_block(self, state: Job, i: int, load: bool) -> None:
        if load and state.failed_at is not None and i > state.failed_at:
            # Blocks after a failed one are not used by the request (it recomputes from there).
            self._finish_block(state, i, False, "")
            return
        key = state.meta.keys[i]
        try:
            if load:
                self._load_one(key, state.meta.block_ids[i])
            else:
                self._store_one(key, state.meta.block_ids[i])
        except Exception as exc:
            with self._lock:
                in_index = key in self._index
            cause = self._cause(exc, load, in_index)
            if cause == "internal":
                logger.exception("fs tier: %s of %s failed", "load" if load else "store", key.hex())
            else:
                logger.warning("fs tier: %s of %s failed (%s): %s", "load" if load else "store", key.hex(), cause, exc)
            if load:
                self._on_load_failure(key, exc)
            self._finish_block(state, i, False, cause)
            return
        self._finish_block(state, i, True, "")

    def _finish_block(self, state: Job, i: int, ok: bool, cause: str) -> None:
        """Count one block of ``state`` done; report the job when it was the last one."""
        meta = state.meta
        with self._lock:
            if not meta.is_promotion:
                key = meta.keys[i]
                if self._writing.get(key):
                    self._writing[key] -= 1
                    if not self._writing[key]:
                        del self._writing[key]
            if cause and cause != "shutdown":
                self._counters[f"{'load' if meta.is_promotion else 'store'}_failed_{cause}"] += 1
        with state.lock:
            state.remaining -= 1
            if ok and meta.is_promotion:
                state.loaded.append(i)
            if not ok:
                state.failed_at = i if state.failed_at is None else min(state.failed_at, i)
                if state.ok:
                    state.ok = False
                    state.cause = cause
            done = state.remaining == 0
        if done:
            with self._lock:
                self._in_flight_jobs -= 1
                if not state.ok:
                    self._counters["load_jobs_failed" if meta.is_promotion else "store_jobs_failed"] += 1
                successful = None
                if not state.ok and meta.is_promotion and state.loaded:
                    successful = [meta.keys[i] for i in sorted(state.loaded)]
                self._finished.append(JobResult(meta.job_id, state.ok, successful))

    # -- one block ------------------------------------------------------------------
    def _store_one(self, key: OffloadKey, block_id: int) -> None:
        with self._lock:
            if key in self._index:
                self._counters["stores_skipped_present"] += 1
                return
        size = self.stored_block_bytes
        self._reserve(size)
        try:
            self._write_block(key, block_id)
        except BaseException:
            with self._lock:
                self._reserved_bytes -= size
                self._space.notify_all()
            raise
        with self._lock:
            self._reserved_bytes -= size
            self._index_add(key, size)
            self._unremovable.discard(key)
            self._counters["blocks_stored"] += 1
            self._counters["bytes_stored"] += self.block_bytes
            self._space.notify_all()

    def _reserve(self, size: int) -> None:
        """Reserve ``size`` bytes under the cap, evicting least recently used blocks first."""
        if self.capacity_bytes is None:
            with self._lock:
                self._reserved_bytes += size
            return
        cap = self.capacity_bytes
        while True:
            victims: list[tuple[OffloadKey, int]] = []
            with self._lock:
                while self._index and self._resident_bytes + self._reserved_bytes + size > cap:
                    key, vsize = next(iter(self._index.items()))
                    self._index_drop(key)
                    victims.append((key, vsize))
                fits = self._resident_bytes + self._reserved_bytes + size <= cap
                reserved = fits or self._reserved_bytes == 0 or self._stopping
                if reserved:
                    self._reserved_bytes += size
                self._counters["evictions"] += len(victims)
                self._counters["evicted_bytes"] += sum(v for _, v in victims)
            for key, _ in victims:
                self._delete(key)
            if reserved:
                return
            # Every byte of the cap is held by writes in flight: wait for one to publish.
            with self._lock:
                self._space.wait(0.05)

    def _load_one(self, key: OffloadKey, block_id: int) -> None:
        size = self._read_block(key, block_id)
        with self._lock:
            self._index_add(key, size)
            self._counters["blocks_loaded"] += 1
            self._counters["bytes_loaded"] += self.block_bytes

    def _on_load_failure(self, key: OffloadKey, exc: BaseException) -> None:
        """Invalidate ``key``; remove its file when the file itself is bad."""
        removed = self._remove_bad(key, exc)
        with self._lock:
            self._index_drop(key)
            if removed is not None:
                self._counters["bad_files_removed" if removed else "bad_files_kept"] += 1
            if removed is False:
                # Never answer True again for a file we could not remove (no retry loop).
                self._unremovable.add(key)

    def _probe(self, key: OffloadKey) -> None:
        """Background existence check for ``lookup_fallback="async"``."""
        try:
            size = self._stored_size(key)
        except Exception:
            logger.warning("fs tier: existence probe of %s failed", key.hex(), exc_info=True)
            size = None
        with self._lock:
            self._probing.discard(key)
            if size == self.stored_block_bytes and not self._writing.get(key):
                self._index_add(key, size)
            elif key not in self._index:
                self._negative[key] = time.monotonic() + NEGATIVE_PROBE_TTL_S
                self._negative.move_to_end(key)
                while len(self._negative) > _MAX_NEGATIVE:
                    self._negative.popitem(last=False)

    # -- scans ----------------------------------------------------------------------
    def _begin_scan(self) -> float:
        with self._lock:
            self._added_during_scan = set()
            self._removed_during_scan = set()
        return time.monotonic()

    def _end_scan(self, started: float, result: ScanResult) -> tuple[int, int, tuple[int, int]]:
        """Merge a scan into the index; returns (new keys, vanished keys, (resident blocks, bytes))."""
        found = result.blocks
        with self._lock:
            added = self._added_during_scan or set()
            removed = self._removed_during_scan or set()
            self._added_during_scan = self._removed_during_scan = None
            new = [
                OffloadKey(k)
                for k in found
                if k not in self._index
                and k not in removed
                and k not in self._unremovable
                and not self._writing.get(OffloadKey(k))
            ]
            new.sort(key=lambda k: found[k][1], reverse=True)  # newest first, each pushed to the LRU end
            for key in new:
                size = found[key][0]
                self._index[key] = size
                self._index.move_to_end(key, last=False)
                self._resident_bytes += size
            vanished = [k for k in self._index if k not in found and k not in added] if result.complete else []
            for key in vanished:
                self._index_drop(key)
            self._counters["temps_removed"] += result.temps_removed
            self._counters["bad_files_removed"] += result.bad_removed
            self._counters["scans"] += 1
            self._last_scan_s = time.monotonic() - started
            return len(new), len(vanished), (len(self._index), self._resident_bytes)

    def _evict_to_cap(self) -> None:
        if self.capacity_bytes is None:
            return
        victims: list[OffloadKey] = []
        with self._lock:
            while self._index and self._resident_bytes + self._reserved_bytes > self.capacity_bytes:
                key, size = next(iter(self._index.items()))
                self._index_drop(key)
                victims.append(key)
                self._counters["evictions"] += 1
                self._counters["evicted_bytes"] += size
        for key in victims:
            self._delete(key)

    # -- figures and shutdown -----------------------------------------------------------
    def _stats(self) -> dict[str, int | float]:
        with self._lock:
            out: dict[str, int | float] = dict(self._counters)
            out["resident_blocks"] = len(self._index)
            out["resident_bytes"] = self._resident_bytes
            out["capacity_bytes"] = self.capacity_bytes or 0
            out["in_flight_jobs"] = self._in_flight_jobs
            out["last_scan_s"] = self._last_scan_s
        return out

    def _stop_workers(self) -> bool:
        """Stop the threads; queued blocks fail their jobs. False when already stopped."""
        with self._lock:
            if self._stopping:
                return False
            self._stopping = True
            dropped = list(self._loads) + list(self._stores)
            self._loads.clear()
            self._stores.clear()
            self._probes.clear()
            self._probing.clear()
            for cv in (self._readers_cv, self._writers_cv, self._space):
                cv.notify_all()
        for state, i in dropped:
            self._finish_block(state, i, False, "shutdown")
        for thread in self._threads:
            thread.join()
        return True
