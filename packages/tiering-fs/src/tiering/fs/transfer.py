"""Moving blocks on the I/O pool: store and load shares, evictions' deletes, and what they settle.

:class:`Transfers` is the fs tier's work per job, on the toolkit's
:class:`~tiering.core.toolkit.pool.IOPool`. Submitting only queues a
job's blocks (the scheduler thread touches no index); a worker takes a
share (consecutive blocks of a job, up to 16; when every worker is busy,
the blocks of several queued jobs: the pool's cross-job shares), reserves
its bytes in the :class:`~tiering.core.toolkit.index.CapacityIndex` in one
lock round (so ``lookup`` answers None while they are written), deletes the
evicted victims, moves the blocks through
:class:`~tiering.fs.blocks.BlockFiles` in one call, and settles the share
with one round per lock: index (commit / adopt, which records the KV events), counters, job
outcomes (one round per job).

Loads take an index ticket before reading, so a block evicted while it was
read is never put back into the index; a delete that fails keeps
its bytes counted until a rescan retries it.

**A full filesystem.** ``capacity_bytes`` may be more than the filesystem
holds (or the filesystem is shared). A write refused with ``ENOSPC`` /
``EDQUOT`` (:data:`~tiering.fs.errors.DISK_FULL`) lowers the index's cap to
the bytes the tier holds at that moment plus what the filesystem reports
free (never below one stored block); the block is reserved again, evicting
least recently used blocks, and written once more. So the tier keeps storing
new blocks at what the disk holds instead of refusing every store. The cap
is never raised again while the tier lives (``stats()``: ``capacity_bytes``
the cap in force, ``configured_capacity_bytes`` the configured one,
``disk_full_stores`` the refused writes).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.format import BlockFormatError
from tiering.core.toolkit import (
    Admit,
    CapacityIndex,
    Counters,
    IOPool,
    KeyState,
    PoolShutdownError,
    Victim,
)
from tiering.core.toolkit.jobs import SHUTDOWN, JobState
from tiering.core.toolkit.shares import fail_tasks, record_tasks
from tiering.fs.blocks import BlockFiles, NotStartedError
from tiering.fs.errors import DISK_FULL, failure_cause

logger = logging.getLogger(__name__)

_REFUSED = {Admit.NO_SPACE: "no_space", Admit.DELETING: "io_error"}
"""Failure cause of a store whose reservation was refused (DELETING: the key's old copy could not be deleted)."""

ROOM_WAIT_S = 1.0
"""Longest a store waits for other threads' unlinks to free the room it reserved (then ``no_space``)."""

StoreItem = tuple[JobState, int]
"""(job, block index)."""

LoadItem = tuple[JobState, int]
"""(job, block index)."""

Outcome = tuple[JobState, int, bool, str]
"""(job, block index, ok, failure cause)."""


class Transfers:
    """Store and load shares of one tier instance (see the module doc).

    Args:
        index: the tier's block index.
        files: the tier's block files.
        counters: the tier's counters (stats vocabulary names).
        pool: the tier's I/O pool.
        slot: primary slot ``block_id`` -> its ``memoryview`` (``block_bytes`` long).
        stopping: True once the tier is shutting down (blocks not yet moved then fail as ``shutdown``).

    Attributes:
        on_removed: called with keys that left the tier (evicted, bad, vanished), e.g. to drop cached lookups.
    """

    def __init__(
        self,
        index: CapacityIndex,
        files: BlockFiles,
        counters: Counters,
        pool: IOPool,
        slot: Callable[[int], memoryview],
        stopping: Callable[[], bool],
    ) -> None:
        self.index = index
        self.files = files
        self.counters = counters
        self.pool = pool
        self.slot = slot
        self._is_stopping = stopping
        self.block_bytes = files.block_bytes
        self.stored_block_bytes = files.stored_block_bytes
        self.on_removed: Callable[[Sequence[OffloadKey]], None] | None = None
        # Blocks of queued store jobs not reserved yet, per key (lookup answers None for them, as for a write).
        self._queued: dict[OffloadKey, int] = {}
        self._queued_lock = threading.Lock()  # held for a few dict updates only: the scheduler never waits long

    @property
    def _stopping(self) -> bool:
        return self._is_stopping()

    # -- stores -------------------------------------------------------------------------------
    def store(self, state: JobState) -> None:
        """Queue every block of a store job on the write queue (scheduler thread; the share reserves them)."""
        keys, queued = state.meta.keys, self._queued
        with self._queued_lock:
            for key in keys:
                queued[key] = queued.get(key, 0) + 1
        items: list[StoreItem] = [(state, i) for i in range(len(keys))]
        self.pool.submit("write", self._store_batch, items, self._store_failed, merge=True)

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

    def _reserve_now(self, key: OffloadKey) -> Admit:
        """Reserve on a worker, waiting while writes or deletes in flight hold the room."""
        while True:
            res = self.index.reserve(key, self.stored_block_bytes)
            if res.victims:
                self.delete(res.victims, "eviction")
            if res.admit is Admit.RESERVED and not res.ready and not self._room_for([key])[0]:
                self.index.commit(key, False)  # the room was not freed after all: refuse rather than exceed the cap
                return Admit.NO_SPACE
            if res.admit in (Admit.RESERVED, Admit.PRESENT) or self._stopping or not res.can_wait:
                return res.admit  # (DELETING without can_wait: its old copy could not be deleted)
            self.index.wait_for_space(0.05)

    def _store_batch(self, items: Sequence[StoreItem]) -> None:
        """Reserve, make room for and write one share (blocks of one or more store jobs); settle it at once.

        One index lock round reserves the share's blocks (evicting LRU blocks
        as the cap needs), the victims are deleted, one native call writes
        every reserved block; the index (and its KV events), counters and job outcomes
        then take one round per lock. A reservation is always committed or
        released, also when this raises.
        """
        keys = [state.meta.keys[i] for state, i in items]
        try:
            if self._stopping:
                fail_tasks(items, SHUTDOWN)
                return
            reservations = self.index.reserve_many(keys, self.stored_block_bytes)
        finally:
            self._unqueue(keys)  # reserved first: a lookup meanwhile answers None, never a False for a queued key
        outcomes: list[Outcome] = []
        commits: list[tuple[OffloadKey, bool]] = []
        ready: list[tuple[JobState, int]] = []
        waiting: list[tuple[JobState, int]] = []
        try:
            victims = [v for res in reservations for v in res.victims]
            if victims:
                self.delete(victims, "eviction")
            # A reservation that took victims' room is written only once their files are gone (the cap holds on
            # disk); when a delete failed the room is not there: that reservation is given up.
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
        for task in refused:  # the disk was full: the cap is lower now, each is tried once more
            self._store_one(task, outcomes, retry_full=False)
        record_tasks(outcomes)

    def _store_one(self, task: StoreItem, outcomes: list[Outcome], retry_full: bool) -> None:
        """Reserve one block (waiting for room), write and commit it; after a full disk once more if ``retry_full``."""
        state, i = task
        admit = self._reserve_now(state.meta.keys[i])
        if admit is Admit.RESERVED:
            for again in self._write_and_commit([task], [], outcomes, retry_full):
                self._store_one(again, outcomes, retry_full=False)
            return
        ok = admit is Admit.PRESENT
        if ok:
            self.counters.inc("stores_already_present")
        outcomes.append((state, i, ok, "" if ok else SHUTDOWN if self._stopping else _REFUSED[admit]))

    def _write_and_commit(
        self,
        tasks: list[StoreItem],
        commits: list[tuple[OffloadKey, bool]],
        outcomes: list[Outcome],
        retry_full: bool = False,
    ) -> list[StoreItem]:
        """Write the reserved blocks ``tasks`` in one call; commit them and ``commits`` together.

        Returns:
            With ``retry_full``, the tasks the filesystem refused for lack of space (released, not in
            ``outcomes``: the caller tries them again); else an empty list. After such a refusal the
            cap is lowered to what the filesystem holds (:meth:`_fit_cap_to_disk`).
        """
        keys = [state.meta.keys[i] for state, i in tasks]
        block_ids = [state.meta.block_ids[i] for state, i in tasks]
        stored: list[OffloadKey] = []
        # One call for the share (native path: no Python work per block; see BlockFiles.write_many).
        try:
            results = self.files.write_many(keys, block_ids, self.slot, self._is_stopping) if keys else []
        except BaseException:
            self.index.commit_many([*commits, *((key, False) for key in keys)])  # no reservation is left behind
            raise
        refused: list[StoreItem] = []
        full = 0
        for key, (state, i), exc in zip(keys, tasks, results, strict=True):
            if exc is None:
                commits.append((key, True))
                stored.append(key)
                outcomes.append((state, i, True, ""))
                continue
            if isinstance(exc, OSError) and exc.errno in DISK_FULL:
                full += 1
                if retry_full:
                    commits.append((key, False))
                    refused.append((state, i))
                    continue
            cause = SHUTDOWN if isinstance(exc, NotStartedError) else failure_cause(exc, load=False)
            if cause != SHUTDOWN:
                _log_failure("store", key, cause, exc)
            commits.append((key, False))
            outcomes.append((state, i, False, cause))
        if commits:
            self.index.commit_many(commits)
        if stored:
            self.counters.add({"blocks_stored": len(stored), "bytes_stored": len(stored) * self.block_bytes})
        if full:
            self.counters.inc("disk_full_stores", full)
            self._fit_cap_to_disk()
        return refused

    def _fit_cap_to_disk(self) -> None:
        """The filesystem refused a write for lack of space: cap the tier at what the filesystem holds for it.

        That is what the index counts now (resident blocks, writes in flight,
        pending deletes, other processes' temporaries; the refused blocks'
        reservations are released already) plus what the filesystem reports
        free now (a refusal by a disk that others filled for a moment lowers
        the cap little). Never below one stored block, so stores are still tried.
        """
        free = self.files.backend.free_bytes(self.files.namespace_dir) or 0
        before = self.index.capacity_bytes
        victims = self.index.lower_cap(max(self.index.used_bytes + free, self.stored_block_bytes))
        after = self.index.capacity_bytes
        if after != before:
            logger.warning(
                "fs tier: the filesystem is full; cap lowered from %s to %d bytes (what it holds for this tier)",
                "unbounded" if before is None else before,
                after,
            )
        self.delete(victims, "eviction")

    def _store_failed(self, items: Sequence[Any], exc: BaseException) -> None:
        """The pool's ``on_error`` for stores: fail the blocks (once; a share releases its own reservations)."""
        if isinstance(exc, PoolShutdownError):  # never ran: still counted as queued
            self._unqueue(state.meta.keys[i] for state, i in items)
        fail_tasks(items, SHUTDOWN if self._stopping else "internal")

    # -- loads ----------------------------------------------------------------------------------
    def load(self, state: JobState) -> None:
        """Queue every block of a load job on the read queue (scheduler thread)."""
        job = state.meta
        self.index.touch(job.keys)
        items: list[LoadItem] = [(state, i) for i in range(len(job.keys))]
        self.pool.submit("read", self._load_batch, items, self._load_failed, merge=True)

    def _load_batch(self, items: Sequence[LoadItem]) -> None:
        """Read and verify one share (blocks of one or more load jobs); a key evicted meanwhile stays out.

        Every block read is settled on its own: a verified one is kept (and
        reported loaded), a bad one removed, also after an earlier failure of
        its job in this share. A job's blocks that :meth:`JobState.should_skip`
        names (after a failed one, unless that one failed verification) are
        not read and are reported failed without a cause.
        """
        outcomes: list[Outcome] = []
        found: list[tuple[OffloadKey, int]] = []
        with self.index.reading() as ticket:
            todo = []
            for state, i in items:
                if self._stopping:
                    outcomes.append((state, i, False, SHUTDOWN))
                elif state.should_skip(i):
                    outcomes.append((state, i, False, ""))
                else:
                    todo.append((state, i))
            keys = [state.meta.keys[i] for state, i in todo]
            block_ids = [state.meta.block_ids[i] for state, i in todo]
            results = self.files.read_many(keys, block_ids, self.slot)  # one call; past a failure too
            for (state, i), key, exc in zip(todo, keys, results, strict=True):
                if exc is None:
                    found.append((key, self.stored_block_bytes))
                    outcomes.append((state, i, True, ""))
                else:
                    outcomes.append((state, i, False, self._load_failure(key, exc)))
            self.index.adopt_many(found, ticket)
        if found:
            self.counters.add({"blocks_loaded": len(found), "bytes_loaded": len(found) * self.block_bytes})
        record_tasks(outcomes)

    def _load_failure(self, key: OffloadKey, exc: BaseException) -> str:
        """Settle one failed read: a bad file is removed, a vanished one forgotten; returns the cause."""
        known = self.index.lookup(key, touch=False) is KeyState.RESIDENT
        cause = failure_cause(exc, load=True, in_index=known)
        _log_failure("load", key, cause, exc)
        if isinstance(exc, BlockFormatError):
            victim = self.index.remove(key, delete=True, cause="corrupt")
            if victim is not None:
                self.delete([victim], "bad")
            elif self.files.remove(key):
                self.counters.inc("bad_blocks_removed")
        elif isinstance(exc, FileNotFoundError) and known:
            self.index.remove(key, delete=False, cause="vanished")
            self.forget([key], "vanished")
        elif cause == "foreign" and known:  # a symlink put in its place: not ours to serve or to delete
            self.index.remove(key, delete=False, cause="corrupt")
            self.forget([key], "foreign")
        return cause

    def _load_failed(self, items: Sequence[Any], exc: BaseException) -> None:
        fail_tasks(items, SHUTDOWN if self._stopping else "internal")

    # -- deletes and removals -----------------------------------------------------------------------
    def delete(self, victims: Iterable[Victim], reason: str) -> None:
        """Delete victims' files and report the outcomes; a failed delete keeps its bytes counted."""
        outcomes = [(v.key, self.files.remove(v.key)) for v in victims]
        self.index.deleted_many(outcomes)
        gone = [k for k, ok in outcomes if ok]
        if reason == "bad" and gone:
            self.counters.inc("bad_blocks_removed", len(gone))
        for key, ok in outcomes:
            if not ok:
                logger.warning(
                    "fs tier: cannot delete %s (%s); kept counted, retried at the next rescan", key.hex(), reason
                )
        self.forget(gone, reason)

    def _room_for(self, keys: Sequence[OffloadKey]) -> list[bool]:
        """Wait for the room of reservations made on victims' room, once this thread deleted its victims.

        Only other threads' unlinks can still be in flight (they take microseconds): a short wait.
        """
        return self.index.wait_for_room(keys, 0.0 if self._stopping else ROOM_WAIT_S)

    def forget(self, keys: Sequence[OffloadKey], reason: str) -> None:
        # The KV events were recorded by the index when the keys left its resident set.
        if keys and self.on_removed is not None:
            self.on_removed(keys)


def _log_failure(what: str, key: OffloadKey, cause: str, exc: BaseException) -> None:
    if cause == "internal":
        logger.error("fs tier: %s of %s failed", what, key.hex(), exc_info=exc)
    else:
        logger.warning("fs tier: %s of %s failed (%s): %s", what, key.hex(), cause, exc)
