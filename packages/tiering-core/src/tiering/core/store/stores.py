"""Stores of an indexed block store: reservations, room for them, one medium call per share, settlement.

A store job's blocks go to the I/O pool's write queue. Where the
reservation happens is the store's choice:

- on the I/O thread (the default): ``submit_store`` only queues the blocks
  (the scheduler thread touches no index lock; a lookup of a queued key
  answers None, as for one being written), and the worker that takes a share
  (consecutive blocks of a job, or of several queued jobs when every worker
  is busy) reserves it in one index lock round;
- on the scheduler thread (``reserve_on_scheduler``): ``submit_store``
  reserves each block at once, a block already stored or without room is
  settled there, and the worker writes the reserved ones.

Either way the victims the reservations took are deleted first, and a block
whose reservation took a victim's room is written only once that room is
free (a bounded wait, :data:`ROOM_WAIT_S`; else it fails ``no_space``): the
cap holds on the medium also while deletes are slow or failing. One medium
call writes the share; the index (and its KV events), the counters and the
job outcomes then take one lock round each.

**Every wait for room is bounded.** A block refused for room that writes in
flight hold (or whose old copy is being deleted) is tried again on the I/O
thread for at most ``room_wait_s`` in all, then fails ``no_space``: the room
it waits for may be held by reservations queued behind it on the very
threads it occupies, which would otherwise never run. Victims of
reservations made on the scheduler thread are deleted on the delete pool,
or (without one) by the worker that takes their share before it waits: a
delete is never queued behind the stores that wait for the room it frees.

**A full medium.** ``capacity_bytes`` may be more than the medium holds (or
it is shared). A write refused for lack of space (:meth:`Medium.is_full`)
lowers the index's cap to the bytes the store holds at that moment plus what
the medium reports free (never below one stored block); the block is
reserved again, evicting least recently used blocks, and written once more.
The cap is never raised again while the store lives.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.store.deletes import Deletes
from tiering.core.store.index import Admit, CapacityIndex, Reservation, Victim
from tiering.core.store.jobs import SHUTDOWN, JobState
from tiering.core.store.medium import PRESENT, Medium, NotStartedError
from tiering.core.store.pool import IOPool, PoolShutdownError
from tiering.core.store.shares import fail_tasks, record_tasks
from tiering.core.store.stats import Counters

logger = logging.getLogger(__name__)

__all__ = ["ROOM_WAIT_S", "Outcome", "Stores", "log_failure"]

_REFUSED = {Admit.NO_SPACE: "no_space", Admit.DELETING: "io_error"}
"""Failure cause of a store whose reservation was refused (DELETING: the key's old copy could not be deleted)."""

ROOM_WAIT_S = 1.0
"""Default of :attr:`StoreSettings.room_wait_s`: longest a store waits for victims' deletes to free its room."""

Task = tuple[JobState, int]
"""(job, block index)."""

Outcome = tuple[JobState, int, bool, str]
"""(job, block index, ok, failure cause)."""


class Stores:
    """Store shares of one block store (see the module doc).

    Args:
        medium: the store's medium.
        index: the store's index.
        deletes: the store's delete path.
        counters: the store's counters.
        pool: the store's I/O pool.
        slot: primary slot ``block_id`` -> its ``memoryview`` (``block_bytes`` long).
        stopping: True once the store is shutting down (blocks not yet written then fail as ``shutdown``).
        on_stored: called with the keys of blocks this process just stored (new ones).
    """

    def __init__(
        self,
        medium: Medium,
        index: CapacityIndex,
        deletes: Deletes,
        counters: Counters,
        pool: IOPool,
        slot: Callable[[int], memoryview],
        stopping: Callable[[], bool],
        on_stored: Callable[[Sequence[OffloadKey]], None],
    ) -> None:
        self.medium = medium
        self.index = index
        self.deletes = deletes
        self.counters = counters
        self.pool = pool
        self.slot = slot
        self._is_stopping = stopping
        self._on_stored = on_stored
        self.stored_block_bytes = medium.stored_block_bytes
        self.block_bytes = 0  # set by the store (payload bytes per block, for bytes_stored)
        self.room_wait_s = ROOM_WAIT_S  # set by the store (StoreSettings.room_wait_s)
        # Blocks of queued store jobs not reserved yet, per key (lookup answers None for them, as for a write).
        self._queued: dict[OffloadKey, int] = {}
        self._queued_lock = threading.Lock()  # held for a few dict updates only: the scheduler never waits long

    # -- submitting ---------------------------------------------------------------------------------
    def queue(self, state: JobState) -> None:
        """Queue every block of a store job; the worker reserves them (scheduler thread, no index lock)."""
        keys, queued = state.meta.keys, self._queued
        with self._queued_lock:
            for key in keys:
                queued[key] = queued.get(key, 0) + 1
        items: list[Task] = [(state, i) for i in range(len(keys))]
        self.pool.submit("write", self._store_batch, items, self._store_failed, merge=True)

    def reserve_and_queue(self, state: JobState) -> None:
        """Reserve every block of a store job now (scheduler thread), settle what needs no write, queue the rest."""
        keys = state.meta.keys
        reservations = self.index.reserve_many(keys, self.stored_block_bytes)
        pooled = self.deletes.pooled
        if pooled and (victims := [v for res in reservations for v in res.victims]):
            self.deletes.delete(victims, "eviction")  # on the delete pool: never medium I/O on the scheduler thread
        now: list[tuple[int, bool, str]] = []
        items: list[tuple[JobState, int, Reservation]] = []
        settled: list[Victim] = []  # victims of reservations settled here (without a delete pool)
        for i, res in enumerate(reservations):
            if res.admit is Admit.PRESENT:
                now.append((i, True, ""))
            elif res.admit is Admit.NO_SPACE and not res.can_wait:
                now.append((i, False, "no_space"))
                settled += res.victims
            else:  # RESERVED; DELETING or room held by writes in flight: the worker waits (bounded) first
                items.append((state, i, res))
        if settled and not pooled:
            self.pool.submit_call("write", lambda: self.deletes.delete(settled, "eviction"))
        if any(not ok for _, ok, _ in now) and self.index.failed_delete_bytes:  # failed deletes hold the room
            if pooled:
                self.deletes.retry_for_room()
            else:
                self.pool.submit_call("write", self._retry_deletes_for_room)
        if present := sum(1 for _, ok, _ in now if ok):
            self.counters.inc("stores_already_present", present)
        if now:
            state.record(now)
        if items:
            self.pool.submit("write", self._reserved_batch, items, self._reserved_failed, merge=True)

    def _retry_deletes_for_room(self) -> None:
        self.deletes.retry_for_room()

    def is_queued(self, key: OffloadKey) -> bool:
        """Whether a store of ``key`` is queued and not reserved yet (no lock: one atomic ``in``)."""
        return key in self._queued

    def _unqueue(self, keys: Iterable[OffloadKey]) -> None:
        """The stores of ``keys`` left the queue (reserved, or failed before running); once per queued block."""
        queued = self._queued
        with self._queued_lock:
            for key in keys:
                left = queued[key] - 1
                if left:
                    queued[key] = left
                else:
                    del queued[key]

    # -- shares ---------------------------------------------------------------------------------------
    def _store_batch(self, items: Sequence[Task]) -> None:
        """Reserve one share in one index round (I/O thread), then settle it as :meth:`_settle_share`."""
        keys = [state.meta.keys[i] for state, i in items]
        try:
            if self._is_stopping():
                fail_tasks(items, SHUTDOWN)
                return
            reservations = self.index.reserve_many(keys, self.stored_block_bytes)
        finally:
            self._unqueue(keys)  # reserved first: a lookup meanwhile answers None, never a False for a queued key
        self._settle_share(items, keys, reservations)

    def _reserved_batch(self, items: Sequence[tuple[JobState, int, Reservation]]) -> None:
        """Write a share reserved on the scheduler thread (victims: on the delete pool already, else deleted here)."""
        tasks = [(state, i) for state, i, _ in items]
        keys = [state.meta.keys[i] for state, i in tasks]
        if self.deletes.pooled:
            reservations = [dataclasses.replace(res, victims=()) if res.victims else res for _, _, res in items]
        else:
            reservations = [res for _, _, res in items]
        if self._is_stopping():
            self.index.commit_many(
                [(k, False) for k, r in zip(keys, reservations, strict=True) if r.admit is Admit.RESERVED]
            )
            fail_tasks(tasks, SHUTDOWN)
            return
        self._settle_share(tasks, keys, reservations)

    def _settle_share(self, items: Sequence[Task], keys: list[OffloadKey], reservations: list[Reservation]) -> None:
        """Delete the share's victims, wait for the room taken from them, write, commit, record.

        A reservation is always committed or released, also when this raises.
        """
        outcomes: list[Outcome] = []
        commits: list[tuple[OffloadKey, bool]] = []
        ready: list[Task] = []
        waiting: list[Task] = []
        try:
            self.deletes.delete([v for res in reservations for v in res.victims], "eviction")
            # A reservation that took victims' room is written only once they are gone (the cap holds on the
            # medium); when a delete failed the room is not there: that reservation is given up.
            unready = [key for key, res in zip(keys, reservations, strict=True) if not res.ready]
            room = dict(zip(unready, self._room_for(unready), strict=True)) if unready else {}
            present = 0
            for task, key, res in zip(items, keys, reservations, strict=True):
                if res.admit is Admit.PRESENT:
                    present += 1
                    outcomes.append((*task, True, ""))
                elif res.admit is not Admit.RESERVED:  # no room yet, or its old copy is being deleted: wait below
                    waiting.append(task)
                elif not room.get(key, True):
                    commits.append((key, False))
                    outcomes.append((*task, False, "no_space"))
                else:
                    ready.append(task)
            if present:
                self.counters.inc("stores_already_present", present)
        except BaseException:
            reserved = zip(keys, reservations, strict=True)
            self.index.commit_many([(key, False) for key, res in reserved if res.admit is Admit.RESERVED])
            raise
        # The blocks reserved at once are written and committed before a block without room waits for it:
        # the room it waits for may be what this very share's writes free (a tight cap).
        refused = self._write_and_commit(ready, commits, outcomes, retry_full=True)
        for task in waiting:
            self._store_one(task, outcomes, retry_full=True)
        for task in refused:  # the medium was full: the cap is lower now, each is tried once more
            self._store_one(task, outcomes, retry_full=False)
        record_tasks(outcomes)

    def _reserve_now(self, key: OffloadKey) -> Admit:
        """Reserve on a worker, waiting while writes or deletes in flight hold the room: ``room_wait_s`` at most.

        The room may be held by reservations queued behind this very share (made on the scheduler thread):
        an unbounded wait here could occupy every I/O thread while the writes that would free it never run.
        After the bound the store fails ``no_space``.
        """
        deadline = time.monotonic() + self.room_wait_s
        retried = False
        while True:
            res = self.index.reserve(key, self.stored_block_bytes)
            self.deletes.delete(res.victims, "eviction")
            if res.admit is Admit.NO_SPACE and not res.can_wait and not retried:
                # Failed deletes may hold the room: retried now, so a medium that stopped failing is noticed
                # by this store, not by the next rescan; inline, they are done when this returns.
                retried = self.deletes.retry_for_room()
                if retried:
                    continue
            if res.admit is Admit.RESERVED and not res.ready and not self._room_for([key], deadline)[0]:
                self.index.commit(key, False)  # the room was not freed after all: refuse rather than exceed the cap
                return Admit.NO_SPACE
            if res.admit in (Admit.RESERVED, Admit.PRESENT) or self._is_stopping() or not res.can_wait:
                return res.admit  # (DELETING without can_wait: its old copy could not be deleted)
            left = deadline - time.monotonic()
            if left <= 0:
                return Admit.NO_SPACE  # no room came within the bound
            self.index.wait_for_space(min(0.05, left))

    def _store_one(self, task: Task, outcomes: list[Outcome], retry_full: bool) -> None:
        """Reserve one block (waiting for room), write and commit it; again after a full medium if ``retry_full``."""
        state, i = task
        admit = self._reserve_now(state.meta.keys[i])
        if admit is Admit.RESERVED:
            for again in self._write_and_commit([task], [], outcomes, retry_full):
                self._store_one(again, outcomes, retry_full=False)
            return
        ok = admit is Admit.PRESENT
        if ok:
            self.counters.inc("stores_already_present")
        outcomes.append((state, i, ok, "" if ok else SHUTDOWN if self._is_stopping() else _REFUSED[admit]))

    def _write_and_commit(
        self, tasks: list[Task], commits: list[tuple[OffloadKey, bool]], outcomes: list[Outcome], retry_full: bool
    ) -> list[Task]:
        """Write the reserved blocks ``tasks`` in one medium call; commit them and ``commits`` together.

        Returns:
            With ``retry_full``, the tasks the medium refused for lack of space (released, not in
            ``outcomes``: the caller tries them again); else an empty list. After such a refusal the
            cap is lowered to what the medium holds (:meth:`_fit_cap_to_medium`).
        """
        keys = [state.meta.keys[i] for state, i in tasks]
        block_ids = [state.meta.block_ids[i] for state, i in tasks]
        try:  # one call for the share: no Python work per block on a batch medium's fast path
            results = self.medium.write_many(keys, block_ids, self.slot, self._is_stopping) if keys else []
        except BaseException:
            self.index.commit_many([*commits, *((key, False) for key in keys)])  # no reservation is left behind
            raise
        stored: list[OffloadKey] = []
        refused: list[Task] = []
        full = present = 0
        for key, (state, i), exc in zip(keys, tasks, results, strict=True):
            if exc is None or exc is PRESENT:
                commits.append((key, True))
                outcomes.append((state, i, True, ""))
                if exc is None:
                    stored.append(key)
                else:
                    present += 1
                continue
            assert isinstance(exc, BaseException)
            if self.medium.is_full(exc):
                full += 1
                if retry_full:
                    commits.append((key, False))
                    refused.append((state, i))
                    continue
            cause = SHUTDOWN if isinstance(exc, NotStartedError) else self.medium.failure_cause(exc, load=False)
            if cause != SHUTDOWN:
                log_failure(self.medium.label, "store", key, cause, exc)
            commits.append((key, False))
            outcomes.append((state, i, False, cause))
        if commits:
            self.index.commit_many(commits)
        if stored or present:
            self.counters.add(
                {"blocks_stored": len(stored), "bytes_stored": len(stored) * self.block_bytes}
                | ({"stores_already_present": present} if present else {})
            )
        if stored:
            self._on_stored(stored)
        if full:
            self.counters.inc("disk_full_stores", full)
            self._fit_cap_to_medium()
        return refused

    def _fit_cap_to_medium(self) -> None:
        """The medium refused a write for lack of space: cap the store at what the medium holds for it.

        That is what the index knows to be on the medium (resident blocks,
        pending deletes; the refused blocks' reservations are released
        already) plus what the medium reports free now (a refusal by a medium
        that others filled for a moment lowers the cap little). Writes in
        flight are left out: a reservation counts a whole block while the
        medium holds only what was written so far and reports the rest as
        free, so counting both would set a cap above what the medium holds.
        Leaving them out errs low by at most what they had written. Never
        below one stored block, so stores are still tried.
        """
        free = self.medium.free_bytes() or 0
        before = self.index.capacity_bytes
        victims = self.index.lower_cap(max(self.index.settled_bytes + free, self.stored_block_bytes))
        after = self.index.capacity_bytes
        if after != before:
            logger.warning(
                "%s: the medium is full; cap lowered from %s to %d bytes (what it holds for this tier)",
                self.medium.label,
                "unbounded" if before is None else before,
                after,
            )
        self.deletes.delete(victims, "eviction")

    def _room_for(self, keys: Sequence[OffloadKey], deadline: float | None = None) -> list[bool]:
        """Wait (bounded) for the room of reservations made on victims' room, once their deletes were handed out.

        The wait ends after ``room_wait_s`` seconds, or at ``deadline`` (``time.monotonic()``) when given.
        """
        wait_s = self.room_wait_s if deadline is None else max(0.0, deadline - time.monotonic())
        return self.index.wait_for_room(keys, 0.0 if self._is_stopping() else wait_s)

    def _store_failed(self, items: Sequence[Any], exc: BaseException) -> None:
        """The pool's ``on_error`` for queued stores: fail the blocks (once; a share releases its own reservations)."""
        if isinstance(exc, PoolShutdownError):  # never ran: still counted as queued
            self._unqueue(state.meta.keys[i] for state, i in items)
        fail_tasks(items, SHUTDOWN if self._is_stopping() else "internal")

    def _reserved_failed(self, items: Sequence[Any], exc: BaseException) -> None:
        """The pool's ``on_error`` for reserved stores: a share that never ran releases its reservations."""
        if isinstance(exc, PoolShutdownError):
            self.index.commit_many([(s.meta.keys[i], False) for s, i, r in items if r.admit is Admit.RESERVED])
        fail_tasks([(s, i) for s, i, _ in items], SHUTDOWN if self._is_stopping() else "internal")


def log_failure(label: str, what: str, key: OffloadKey, cause: str, exc: BaseException) -> None:
    """Log one block's failed store or load (an ``internal`` one with its traceback)."""
    if cause == "internal":
        logger.error("%s: %s of %s failed", label, what, key.hex(), exc_info=exc)
    else:
        logger.warning("%s: %s of %s failed (%s): %s", label, what, key.hex(), cause, exc)
