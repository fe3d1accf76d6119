"""An I/O worker pool with separate read and write queues.

Reads (loads, lookup probes) are on a request's critical path; writes
(stores) only keep primary slots pinned. So :class:`IOPool` keeps two
queues and two groups of threads:

- every idle thread takes queued reads first (writers too, unless
  ``writers_prefer_writes``), so a burst of loads gets every thread;
- readers with no read queued help with writes, ``reader_help_batch`` items
  at a time (default 1; joined across submissions as below), so a load
  arriving waits for at most that much write work;
- a submission is split into shares (:func:`~tiering.core.store.jobs.split_batches`)
  and each worker takes one share at once, calling the batch function with
  the whole share: a job's blocks cost one queue lock round per share, and
  the batch function can record their outcomes in one
  :meth:`~tiering.core.store.jobs.JobState.record` call. A submission is
  split only across threads that wait for work: when every thread is busy,
  a job stays one share (up to ``max_batch`` items), so a burst of jobs
  costs one lock round per job, not per block, while an idle pool still
  spreads a single job over its threads;
- a submission wakes as many waiting threads as it has shares (the
  kind's own threads first), not every thread, and takes the pool's lock
  only to do that: while every thread is busy, submitting is one atomic
  ``deque.extend`` (the scheduler thread never waits for a worker holding
  the lock); a thread about to sleep looks at the queues again after it
  has counted itself as waiting, so no submission is left unwoken;
- submissions made with ``merge=True`` are *cross-job* shares: when no
  thread waits for work (every one is busy, so splitting could not spread
  the work further), a worker taking such a unit also takes the units
  queued right behind it with the same batch function, up to ``max_batch``
  items. A burst of one-block jobs then costs one batch call per share of
  up to ``max_batch`` blocks instead of one per job. The batch function of
  a merged unit gets items of several submissions and must group them
  itself (``items`` keep their submission order).

No thread dies silently: an exception from a batch function is logged and
passed to the submission's ``on_error`` with the items it was given (which a
tier turns into failed blocks). :meth:`IOPool.shutdown` hands every
still-queued item to its ``on_error`` exactly once (with
:class:`PoolShutdownError`), lets running batches finish, and joins the
threads.

A pool is bound to the process that built it: in a child forked after that
(where none of its threads exist and its lock may be held forever),
:meth:`IOPool.submit` hands the items to ``on_error`` at once with
:class:`~tiering.core.store.forks.ForkedStackError`, :meth:`IOPool.shutdown`
does nothing, and :meth:`IOPool.pending` / :meth:`IOPool.wait_idle` raise it.

The two-queue layout follows vLLM's fs tier ``DualQueueThreadPool``
(``vllm/v1/kv_offload/tiering/fs/thread_pool.py``).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

from tiering.core.store.forks import ProcessOwner
from tiering.core.store.shares import split_batches

logger = logging.getLogger(__name__)

Kind = Literal["read", "write"]
BatchFn = Callable[[Sequence[Any]], None]
ErrorFn = Callable[[Sequence[Any], BaseException], None]


class PoolShutdownError(RuntimeError):
    """Given to ``on_error`` for items still queued when the pool shut down (they never ran)."""


@dataclasses.dataclass(slots=True)
class _Unit:
    fn: BatchFn
    items: list[Any]
    on_error: ErrorFn
    merge: bool = False


class IOPool:
    """Read and write worker threads over two queues (see the module docstring).

    Args:
        n_read_threads: reader threads, >= 1.
        n_write_threads: writer threads, >= 0 (0: readers do the writes too).
        name: thread name prefix (``<name>-read-<i>``, ``<name>-write-<i>``).
        max_batch: most items in one share.
        min_batch: fewest items a submission is split into shares of, when idle threads would take
            smaller ones (default 1: one per idle thread). A tier whose batch function has a fixed
            cost per share and little per item (a native batch call) sets more.
        reader_help_batch: most write items a reader takes at once when helping.
        writers_prefer_writes: writers take queued writes before reads
            (vLLM's store-priority threads); default False (reads first everywhere).

    Raises:
        ValueError: a thread count or batch size is out of range.
    """

    def __init__(
        self,
        n_read_threads: int,
        n_write_threads: int,
        *,
        name: str = "tiering-io",
        max_batch: int = 16,
        min_batch: int = 1,
        reader_help_batch: int = 1,
        writers_prefer_writes: bool = False,
    ) -> None:
        if n_read_threads < 1 or n_write_threads < 0:
            raise ValueError(f"need >= 1 reader and >= 0 writers, got {n_read_threads} and {n_write_threads}")
        if max_batch < 1 or reader_help_batch < 1:
            raise ValueError(f"max_batch and reader_help_batch must be >= 1, got {max_batch}, {reader_help_batch}")
        self.n_read_threads = n_read_threads
        self.n_write_threads = n_write_threads
        self.max_batch = max_batch
        self.min_batch = max(1, min(min_batch, max_batch))
        self.reader_help_batch = reader_help_batch
        self.writers_prefer_writes = writers_prefer_writes
        self._lock = threading.Lock()
        self._readers_cv = threading.Condition(self._lock)
        self._writers_cv = threading.Condition(self._lock)
        self._idle_cv = threading.Condition(self._lock)
        self._reads: collections.deque[_Unit] = collections.deque()
        self._writes: collections.deque[_Unit] = collections.deque()
        self._running = 0
        # Threads blocked in wait() and not yet notified: readers (True), writers (False). The notifier
        # decrements, so two submissions in a row never count the same sleeping thread twice.
        self._waiting = {True: 0, False: 0}
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self.owner = ProcessOwner(f"I/O pool {name!r}")
        for i in range(n_read_threads):
            self._start(f"{name}-read-{i}", True)
        for i in range(n_write_threads):
            self._start(f"{name}-write-{i}", False)

    def _start(self, thread_name: str, is_reader: bool) -> None:
        thread = threading.Thread(target=self._worker, args=(is_reader,), name=thread_name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def submit(self, kind: Kind, fn: BatchFn, items: Sequence[Any], on_error: ErrorFn, *, merge: bool = False) -> None:
        """Queue ``items`` to be processed by ``fn`` in shares, on the ``kind`` queue.

        Args:
            kind: ``"read"`` or ``"write"``.
            fn: called on a worker with one share (a list of items); must
                handle per-item failures itself; an exception it raises fails
                the whole share through ``on_error``.
            items: the work, e.g. ``(job state, block index)`` pairs.
            on_error: called with the items of a share that raised (with the
                exception) or never ran (:class:`PoolShutdownError`), exactly once per item.
            merge: ``fn`` accepts items of several submissions in one share: a busy pool may
                join this submission's shares with queued ones of the same ``fn`` and ``on_error``
                (see the module docstring).

        After :meth:`shutdown`, and in a child forked after the pool was built (with
        :class:`~tiering.core.store.forks.ForkedStackError`), ``on_error`` is called at once, on the caller's thread.
        """
        if not items:
            return
        if self.owner.forked:  # no thread of ours runs in this process: the work would wait forever
            forked = self.owner.error()
            logger.error("%s", forked)
            self._fail([_Unit(fn, list(items), on_error, merge)], forked)
            return
        is_read = kind == "read"
        n = len(items)
        idle = self._waiting[True] + self._waiting[False]  # a racy snapshot is fine: it only sizes the shares
        if n == 1 or (idle <= 1 and n <= self.max_batch):
            units = [_Unit(fn, list(items), on_error, merge)]  # one share: no splitting to do
        else:
            threads = self.n_read_threads if is_read else max(1, self.n_write_threads)
            parts = max(1, min(idle, threads, -(-n // self.min_batch)))
            units = [
                _Unit(fn, [items[i] for i in share], on_error, merge)
                for share in split_batches(range(n), parts, self.max_batch)
            ]
        if self._stopping:
            self._fail(units, PoolShutdownError("the I/O pool is shut down"))
            return
        # No lock while every thread is busy: deque.extend is atomic, and a thread about to wait looks at the
        # queues again after counting itself in _waiting (see _worker), so reading _waiting after the extend
        # never misses a thread that needs waking.
        (self._reads if is_read else self._writes).extend(units)
        if self._waiting[True] or self._waiting[False]:
            with self._lock:
                self._wake(is_read, len(units))
        if self._stopping:  # shut down meanwhile: what its drain missed is failed here (popped once, locked)
            with self._lock:
                dropped = self._pop_all()
            self._fail(dropped, PoolShutdownError("the I/O pool shut down before this work ran"))

    def _wake(self, is_read: bool, n: int) -> None:
        """Notify up to ``n`` waiting threads, the kind's own first (lock held)."""
        for readers in (is_read, not is_read):
            k = min(n, self._waiting[readers])
            if k:
                self._waiting[readers] -= k
                (self._readers_cv if readers else self._writers_cv).notify(k)
                n -= k

    def submit_call(self, kind: Kind, call: Callable[[], None]) -> None:
        """Queue a single callable (e.g. a lookup cache's resolution); its exception is logged."""

        def run(_items: Sequence[Any]) -> None:
            call()

        def failed(_items: Sequence[Any], exc: BaseException) -> None:
            if not isinstance(exc, PoolShutdownError):
                logger.error("I/O pool: %r raised", call, exc_info=exc)

        self.submit(kind, run, (None,), failed)

    @staticmethod
    def _fail(units: Sequence[_Unit], exc: BaseException) -> None:
        for unit in units:
            try:
                unit.on_error(unit.items, exc)
            except Exception:
                logger.exception("I/O pool: on_error raised for %d items", len(unit.items))

    def _take(self, is_reader: bool) -> _Unit | None:
        """The next unit for this thread (lock held), None when there is none or the pool is stopping."""
        reads, writes = self._reads, self._writes
        if self._stopping:
            return None
        if self.writers_prefer_writes and not is_reader and writes:
            return self._pop(writes)
        if reads:
            return self._pop(reads)
        if writes:
            if not is_reader:
                return self._pop(writes)
            if len(writes[0].items) <= self.reader_help_batch:
                return self._pop(writes, self.reader_help_batch)
            head = writes[0]
            part = _Unit(head.fn, head.items[: self.reader_help_batch], head.on_error)
            del head.items[: self.reader_help_batch]
            return part
        return None

    def _pop(self, queue: collections.deque[_Unit], limit: int | None = None) -> _Unit:
        """The unit at the head of ``queue``, joined with mergeable ones behind it while no thread waits (lock held).

        A joined unit holds at most ``limit`` items (default ``max_batch``).
        """
        limit = self.max_batch if limit is None else limit
        unit = queue.popleft()
        if not unit.merge or self._waiting[True] or self._waiting[False]:
            return unit
        while queue:
            head = queue[0]
            if not (head.merge and head.fn == unit.fn and head.on_error == unit.on_error):
                break
            if len(unit.items) + len(head.items) > limit:
                break
            unit.items.extend(queue.popleft().items)
        return unit

    def _worker(self, is_reader: bool) -> None:
        cv = self._readers_cv if is_reader else self._writers_cv
        while True:
            with self._lock:
                unit = self._take(is_reader)
                while unit is None:
                    if self._stopping:
                        return
                    self._waiting[is_reader] += 1  # the thread that notifies us takes it back
                    if self._reads or self._writes:  # queued by a submit that read _waiting before the increment
                        self._waiting[is_reader] -= 1  # not waiting after all: _take may join units again
                        unit = self._take(is_reader)
                        continue
                    cv.wait()
                    unit = self._take(is_reader)
                self._running += 1
            try:
                unit.fn(unit.items)
            except BaseException as exc:  # never let a worker die silently
                logger.exception("I/O pool: a batch of %d items raised", len(unit.items))
                self._fail((unit,), exc)
            finally:
                with self._lock:
                    self._running -= 1
                    self._idle_cv.notify_all()

    def _pop_all(self) -> list[_Unit]:
        """Pop every queued unit (lock held: each is taken by one caller, also with concurrent submits)."""
        dropped: list[_Unit] = []
        for queue in (self._reads, self._writes):
            while queue:
                dropped.append(queue.popleft())
        return dropped

    def pending(self) -> int:
        """Items queued (not yet taken by a worker).

        Raises:
            ForkedStackError: called in a child forked after the pool was built.
        """
        self.owner.check()
        with self._lock:
            return sum(len(u.items) for u in self._reads) + sum(len(u.items) for u in self._writes)

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block until nothing is queued or running; False when ``timeout_s`` passed first.

        Raises:
            ForkedStackError: called in a child forked after the pool was built.
        """
        self.owner.check()
        with self._idle_cv:
            return self._idle_cv.wait_for(lambda: not (self._reads or self._writes or self._running), timeout_s)

    def shutdown(self, wait: bool = True) -> None:
        """Stop: queued items go to their ``on_error`` (once), running batches finish, threads are joined.

        Idempotent. In a child forked after the pool was built it does nothing: the
        threads, the queued work and the lock are the parent's.
        """
        if self.owner.forked:
            return
        with self._lock:
            already = self._stopping
            self._stopping = True
            self._waiting = {True: 0, False: 0}
            self._readers_cv.notify_all()
            self._writers_cv.notify_all()
            self._idle_cv.notify_all()
            dropped = self._pop_all()
        self._fail(dropped, PoolShutdownError("the I/O pool shut down before this work ran"))
        if wait and not already:
            current = threading.current_thread()
            for thread in self._threads:
                if thread is not current:
                    thread.join()
