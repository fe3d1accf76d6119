"""The worker behind the LMCache adapter: one thread that owns a tiering tier and runs the adapter's tasks on it.

Imports nothing from LMCache: a task's objects are anything with a
``byte_array`` (LMCache's ``MemoryObj``), and results go back through the
``on_complete`` callback. Tiers are driven from this one thread only, as an
engine's scheduler drives them; objects move through a host staging buffer
(the tier's primary view) of fixed rows (:mod:`tiering.lmcache.keys`).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext
from tiering.core.base import SecondaryTierManager as TieringTier
from tiering.core.capabilities import take_events
from tiering.core.events import BlockRemoved
from tiering.lmcache.keys import pack_row, row_payload

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.05
_MIN_POLL_S = 0.0002
_MAX_POLL_S = 0.005
_TICK_S = 1.0
_RESTORE_PER_TICK = 10_000  # keys a restore asks the tier about per tick: LMCache's tasks never wait long on it
CLOSE_WAIT_S = 60.0
"""How long :meth:`TierWorker.stop` waits for the tier's jobs in flight before failing their tasks."""


def flat(obj: Any) -> memoryview:
    """An LMCache ``MemoryObj``'s bytes (its ``byte_array``, the physical size) as a flat view, no copy."""
    return memoryview(obj.byte_array).cast("B")


@dataclasses.dataclass
class Task:
    """One store, load or lookup task of the adapter.

    Attributes:
        kind: ``"store"``, ``"load"``, ``"lookup"`` or ``"restore"`` (which of
            ``okeys``, listed at start, the tier holds: no lock, no deadline).
        task_id: the id handed to LMCache.
        keys: LMCache's ``ObjectKey`` s (opaque here).
        okeys: our key of each (:func:`~tiering.lmcache.keys.encode_key`).
        tenants: the cache salt of each key, the tenant of the tier jobs and
            lookups (a job holds keys of one tenant).
        objects: store: the objects to read; load: the buffers to fill (one per key).
        hits: lookup: the indices found; load: the indices loaded and verified.
        failed: store: some object was not stored (the task fails as a whole).
        bytes_done: store: object bytes stored.
        stored: store: indices stored.
    """

    kind: str
    task_id: int
    keys: Sequence[Any]
    okeys: list[OffloadKey]
    tenants: Sequence[str] = ()
    objects: Sequence[Any] = ()
    hits: set[int] = dataclasses.field(default_factory=set)
    failed: bool = False
    bytes_done: int = 0
    stored: list[int] = dataclasses.field(default_factory=list)
    submitted: int = 0  # keys handed to the tier so far (store, load)
    outstanding: int = 0  # tier jobs not reported yet
    completed: bool = False
    abandoned: bool = False  # reported failed already; its jobs still in flight only free their rows
    pending: list[int] = dataclasses.field(default_factory=list)  # lookup: keys still "not known yet"
    deadline: float = 0.0

    def tenant(self, index: int) -> str:
        """The tenant (cache salt) of key ``index``; ``""`` when the task names none."""
        return self.tenants[index] if self.tenants else ""

    def done(self) -> bool:
        """Every key handed to the tier and every job reported."""
        return self.submitted == len(self.keys) and self.outstanding == 0


class TierWorker:
    """Runs tasks on ``tier`` from one thread, through the staging rows of ``view``.

    Args:
        tier: the tiering tier, built over ``view``.
        view: the staging buffer, ``(rows, block_bytes)``, format ``"B"``.
        lookup_timeout_s: how long a lookup waits on keys the tier does not know yet.
        object_bytes: the largest object a store accepts (default: all a row holds).
        on_complete: called once per task, on the worker thread, when it is
            done (or failed at stop or after an internal error).
        on_removed: called with the keys the tier reports removed (its evictions).
        on_tick: called about once a second.
    """

    def __init__(
        self,
        tier: TieringTier,
        view: memoryview,
        *,
        lookup_timeout_s: float,
        object_bytes: int | None = None,
        on_complete: Callable[[Task], None],
        on_removed: Callable[[list[OffloadKey]], None],
        on_tick: Callable[[], None],
    ) -> None:
        self.tier, self._view, self._lookup_timeout_s = tier, view, lookup_timeout_s
        self._object_bytes = object_bytes
        self._on_complete, self._on_removed, self._on_tick = on_complete, on_removed, on_tick
        self.errors = 0  # internal errors and tier calls that raised (written by the worker thread only)
        self._incoming: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        # Loads first: LMCache waits on them to serve a request, stores only free L1 later.
        self._waiting: dict[str, collections.deque[Task]] = {"load": collections.deque(), "store": collections.deque()}
        self._lookups: list[Task] = []
        self._restores: list[Task] = []
        self._jobs: dict[int, tuple[Task, list[int], list[int]]] = {}
        self._free_rows = list(range(len(view)))
        self._job_ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="tiering-lmcache", daemon=True)
        self._thread.start()

    def submit(self, task: Task) -> None:
        """Queue ``task``; never blocks."""
        self._incoming.put(task)

    def stop(self) -> None:
        """Finish the jobs in flight (at most :data:`CLOSE_WAIT_S`), fail the tasks not started, end the thread."""
        self._incoming.put(None)
        self._thread.join()

    def is_alive(self) -> bool:
        """Whether the worker thread runs."""
        return self._thread.is_alive()

    def _row(self, row: int) -> memoryview:
        return self._view[row : row + 1].cast("B")

    def _context(self, task: Task, index: int) -> ReqContext:
        return ReqContext(f"lmcache-{task.kind}-{task.task_id}", tenant=task.tenant(index))

    # -- the loop ---------------------------------------------------------------------
    def _run(self) -> None:
        delay, stopping, next_tick = _MIN_POLL_S, False, time.monotonic() + _TICK_S
        stop_deadline = float("inf")
        while True:
            busy = bool(self._jobs or self._lookups)
            try:
                item = self._incoming.get(timeout=delay if busy else _IDLE_WAIT_S)
                while True:
                    if item is None:
                        stopping, stop_deadline = True, time.monotonic() + CLOSE_WAIT_S
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
                if time.monotonic() >= next_tick:
                    self._poll_restores()
                    self._on_tick()
                    next_tick = time.monotonic() + _TICK_S
            except Exception:
                # A bug here must not leave LMCache waiting forever: fail everything in flight.
                logger.exception("tiering L2 adapter worker failed a step; failing the tasks in flight")
                self.errors += 1
                try:
                    self._fail_all()
                except Exception:
                    logger.exception("tiering L2 adapter could not report the tasks in flight")
                progress = True
            delay = _MIN_POLL_S if progress else min(delay * 2, _MAX_POLL_S)

    def _accept(self, task: Task) -> None:
        if task.kind in ("lookup", "restore"):
            task.pending = list(range(len(task.keys)))
            task.deadline = time.monotonic() + self._lookup_timeout_s
            (self._lookups if task.kind == "lookup" else self._restores).append(task)
        else:
            self._waiting[task.kind].append(task)

    def _step(self, stopping: bool) -> bool:
        progress = False
        if not stopping:
            progress |= self._start_jobs()
            progress |= self._poll_lookups()
        results = list(self.tier.get_finished())
        for result in results:
            self._finish_job(result)
        removed = [k for event in take_events(self.tier) if isinstance(event, BlockRemoved) for k in event.keys]
        if removed:
            self._on_removed(removed)
        return progress or bool(results)

    # -- stores and loads ---------------------------------------------------------------
    def _start_jobs(self) -> bool:
        started = False
        while self._free_rows and (waiting := self._waiting["load"] or self._waiting["store"]):
            task = waiting[0]
            count = min(len(self._free_rows), len(task.keys) - task.submitted)
            indices = list(range(task.submitted, task.submitted + count))
            task.submitted += count
            if task.submitted == len(task.keys):
                waiting.popleft()
            rows = [self._free_rows.pop() for _ in indices]
            if task.kind == "store":
                indices, rows = self._pack(task, indices, rows)
            if indices:
                self._submit_job(task, indices, rows)
            if task.done():  # nothing left in flight: an empty task, or every object refused
                self._complete(task)
            started = True
        return started

    def _pack(self, task: Task, indices: list[int], rows: list[int]) -> tuple[list[int], list[int]]:
        """Copy the objects into their rows; an object that does not fit fails the task (its row is freed)."""
        kept_i, kept_r = [], []
        for index, row in zip(indices, rows, strict=True):
            try:
                pack_row(self._row(row), flat(task.objects[index]), self._object_bytes)
            except ValueError as exc:
                logger.error("tiering L2 adapter: store task %d: %s", task.task_id, exc)
                task.failed = True
                self._free_rows.append(row)
                continue
            kept_i.append(index)
            kept_r.append(row)
        return kept_i, kept_r

    def _submit_job(self, task: Task, indices: list[int], rows: list[int]) -> None:
        """One tier job per tenant (cache salt) of ``indices``: a job's context names one tenant."""
        groups: dict[str, tuple[list[int], list[int]]] = {}
        for index, row in zip(indices, rows, strict=True):
            group = groups.setdefault(task.tenant(index), ([], []))
            group[0].append(index)
            group[1].append(row)
        for group_indices, group_rows in groups.values():
            self._submit_one(task, group_indices, group_rows)

    def _submit_one(self, task: Task, indices: list[int], rows: list[int]) -> None:
        job = JobMetadata(
            job_id=next(self._job_ids),
            keys=[task.okeys[i] for i in indices],
            block_ids=rows,
            is_promotion=task.kind == "load",
            req_context=self._context(task, indices[0]),
        )
        self._jobs[job.job_id] = (task, indices, rows)
        task.outstanding += 1
        try:
            (self.tier.submit_load if job.is_promotion else self.tier.submit_store)(job)
        except Exception:
            logger.exception("tiering L2 adapter: the tier refused %s job %d", task.kind, job.job_id)
            self.errors += 1
            self._finish_job(JobResult(job.job_id, False))

    def _finish_job(self, result: JobResult) -> None:
        entry = self._jobs.pop(result.job_id, None)
        if entry is None:
            logger.error("tiering L2 adapter: the tier reported unknown job %d; dropped", result.job_id)
            self.errors += 1
            return
        task, indices, rows = entry
        if not task.abandoned:
            if task.kind == "load":
                retry = self._unpack(task, indices, rows, result)
                if retry:
                    # A tier reports a failed load's successes only as a leading run, while LMCache
                    # takes every object that loaded (a bitmap): the rest go again, one job each.
                    for index, row in retry:
                        self._submit_job(task, [index], [row])
                    kept = {row for _, row in retry}
                    rows = [row for row in rows if row not in kept]
            elif result.success:
                for index, row in zip(indices, rows, strict=True):
                    task.bytes_done += len(row_payload(self._row(row)))
                    task.stored.append(index)
            else:
                task.failed = True
            task.outstanding -= 1
        self._free_rows.extend(rows)
        if not task.abandoned and task.done():
            self._complete(task)

    def _unpack(self, task: Task, indices: list[int], rows: list[int], result: JobResult) -> list[tuple[int, int]]:
        """Copy each verified row's payload into its L1 buffer; a row of another length is a miss.

        Returns:
            The (index, row) pairs the tier did not report loaded, when the
            job had more than one (each is worth a job of its own); else none.
        """
        loaded = None if result.success else {bytes(k) for k in result.successful_keys or ()}
        retry = []
        for index, row in zip(indices, rows, strict=True):
            if loaded is not None and task.okeys[index] not in loaded:
                if len(indices) > 1:
                    retry.append((index, row))
                continue
            try:
                payload = row_payload(self._row(row))
                target = flat(task.objects[index])
                if len(payload) != len(target):
                    raise ValueError(f"stored object is {len(payload)} bytes, the L1 buffer {len(target)}")
                target[:] = payload
            except (ValueError, TypeError) as exc:
                logger.warning("tiering L2 adapter: load task %d key %d refused: %s", task.task_id, index, exc)
                continue
            task.hits.add(index)
        return retry

    # -- lookups ------------------------------------------------------------------------
    def _poll_lookups(self) -> bool:
        progress, now, still = False, time.monotonic(), []
        for task in self._lookups:
            pending = []
            for index in task.pending:
                verdict = self._lookup(task, index)
                if verdict is None:
                    pending.append(index)
                elif verdict:
                    task.hits.add(index)
            progress |= len(pending) != len(task.pending)
            task.pending = pending
            if pending and now < task.deadline:
                still.append(task)
                continue
            self._complete(task)
            progress = True
        self._lookups = still
        return progress

    def _lookup(self, task: Task, index: int) -> bool | None:
        try:
            return self.tier.lookup(task.okeys[index], self._context(task, index))
        except Exception:
            logger.exception("tiering L2 adapter: tier lookup raised; a miss")
            self.errors += 1
            return False

    def _poll_restores(self) -> None:
        """Once a tick: which keys listed at start the tier holds (it may still be scanning: ask again later)."""
        budget = _RESTORE_PER_TICK
        for task in self._restores:
            asked, rest = task.pending[:budget], task.pending[budget:]
            budget -= len(asked)
            undecided = []
            for index in asked:
                verdict = self._lookup(task, index)
                if verdict is None:
                    undecided.append(index)
                elif verdict:
                    task.hits.add(index)
            task.pending = rest + undecided
            if not task.pending:
                self._complete(task)
        self._restores = [task for task in self._restores if task.pending]

    # -- completion -----------------------------------------------------------------------
    def _complete(self, task: Task) -> None:
        if not task.completed:
            task.completed = True
            self._on_complete(task)

    def _fail_all(self) -> None:
        """Report every task not yet completed as failed (stores) or all-miss (lookups, loads).

        Jobs the tier still runs keep their rows until the tier reports them
        (it may still be writing into them); only then are the rows reused.
        """
        waiting = [*self._waiting["load"], *self._waiting["store"]]
        tasks = {id(t): t for t in [*waiting, *self._lookups, *self._restores, *(e[0] for e in self._jobs.values())]}
        for queued in self._waiting.values():
            queued.clear()
        self._lookups, self._restores = [], []
        for task in tasks.values():
            if task.completed:
                continue
            task.abandoned = task.failed = True
            task.stored.clear()
            task.hits.clear()
            task.pending = []
            self._complete(task)
