"""Loads of an indexed block store: one medium call per share, then bad, vanished and short blocks settled.

A load job's blocks go to the I/O pool's read queue; a worker takes a share
(blocks of one or more jobs), reads and verifies it in one medium call under
an index ticket (a block evicted while it was read is never put back into the
index) and settles each block on its own:

- verified: kept, adopted into the index (a block another process stored);
- bad bytes (:class:`~tiering.core.format.BlockFormatError`): deleted, counted
  in ``bad_blocks_removed``, unless this process is storing that key now;
- missing while indexed: removed behind the store's back, forgotten (``vanished``);
- shorter than a block (:class:`~tiering.core.store.medium.BlockNotReadyError`):
  another writer is still putting it: a miss, forgotten unless this process is
  writing it, never deleted;
- ``foreign`` (something not ours in its place): forgotten, never touched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.format import BlockFormatError
from tiering.core.store.deletes import Deletes
from tiering.core.store.index import CapacityIndex, KeyState
from tiering.core.store.jobs import SHUTDOWN, JobState
from tiering.core.store.medium import BlockNotReadyError, Medium
from tiering.core.store.pool import IOPool
from tiering.core.store.shares import fail_tasks, record_tasks
from tiering.core.store.stats import Counters
from tiering.core.store.stores import Outcome, log_failure

__all__ = ["Loads"]

Task = tuple[JobState, int]
"""(job, block index)."""


class Loads:
    """Load shares of one block store (see the module doc).

    Args:
        medium: the store's medium.
        index: the store's index.
        deletes: the store's delete path (bad blocks).
        counters: the store's counters.
        pool: the store's I/O pool.
        slot: primary slot ``block_id`` -> its ``memoryview``.
        stopping: True once the store is shutting down.
        forget: called with keys known gone and the reason (drops cached lookups).
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
        forget: Callable[[Sequence[OffloadKey], str], None],
    ) -> None:
        self.medium = medium
        self.index = index
        self.deletes = deletes
        self.counters = counters
        self.pool = pool
        self.slot = slot
        self._is_stopping = stopping
        self._forget = forget
        self.stored_block_bytes = medium.stored_block_bytes
        self.block_bytes = 0  # set by the store (payload bytes per block, for bytes_loaded)
        self._tells_use = type(medium).touched is not Medium.touched  # no per-block work for a medium that ignores it

    def queue(self, state: JobState) -> None:
        """Queue every block of a load job on the read queue (scheduler thread)."""
        job = state.meta
        self.index.touch(job.keys)
        items: list[Task] = [(state, i) for i in range(len(job.keys))]
        self.pool.submit("read", self._load_batch, items, self._load_failed, merge=True)

    def _load_batch(self, items: Sequence[Task]) -> None:
        """Read and verify one share (blocks of one or more load jobs); a key evicted meanwhile stays out.

        A job's blocks that :meth:`JobState.should_skip` names (after a failed
        one, unless that one failed verification) are not read and are
        reported failed without a cause.
        """
        outcomes: list[Outcome] = []
        found: list[tuple[OffloadKey, int]] = []
        with self.index.reading() as ticket:
            todo = []
            for state, i in items:
                if self._is_stopping():
                    outcomes.append((state, i, False, SHUTDOWN))
                elif state.should_skip(i):
                    outcomes.append((state, i, False, ""))
                else:
                    todo.append((state, i))
            keys = [state.meta.keys[i] for state, i in todo]
            block_ids = [state.meta.block_ids[i] for state, i in todo]
            results = self.medium.read_many(keys, block_ids, self.slot) if keys else []  # one call; past a failure too
            for (state, i), key, exc in zip(todo, keys, results, strict=True):
                if exc is None:
                    found.append((key, self.stored_block_bytes))
                    outcomes.append((state, i, True, ""))
                else:
                    outcomes.append((state, i, False, self._failure(key, exc)))
            self.index.adopt_many(found, ticket)
        if found:
            self.counters.add({"blocks_loaded": len(found), "bytes_loaded": len(found) * self.block_bytes})
            if self._tells_use and self.medium.touched([key for key, _ in found]):
                self.pool.submit_call("write", self.medium.flush)
        record_tasks(outcomes)

    def _failure(self, key: OffloadKey, exc: BaseException) -> str:
        """Settle one failed read (see the module doc); returns the cause."""
        state = self.index.lookup(key, touch=False)
        known = state is KeyState.RESIDENT
        cause = self.medium.failure_cause(exc, load=True, in_index=known)
        log_failure(self.medium.label, "load", key, cause, exc)
        if isinstance(exc, BlockFormatError):
            victim = self.index.remove(key, delete=True, cause="corrupt")
            if victim is not None:
                self.deletes.delete([victim], "bad")
            elif state is not KeyState.WRITING and self.medium.remove(key):  # never a block being written now
                self.counters.inc("bad_blocks_removed")
                self._forget([key], "bad")
        elif isinstance(exc, BlockNotReadyError):
            if state is not KeyState.WRITING:
                self.index.remove(key, delete=False, cause="vanished")
                self._forget([key], "short")
        elif isinstance(exc, FileNotFoundError) and known:
            self.index.remove(key, delete=False, cause="vanished")
            self._forget([key], "vanished")
        elif cause == "foreign" and known:  # a symlink put in its place: not ours to serve or to delete
            self.index.remove(key, delete=False, cause="corrupt")
            self._forget([key], "foreign")
        return cause

    def _load_failed(self, items: Sequence[Any], exc: BaseException) -> None:
        fail_tasks(items, SHUTDOWN if self._is_stopping() else "internal")
