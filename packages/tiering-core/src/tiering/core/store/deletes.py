"""The delete path of an indexed block store: evicted, expired and bad blocks leave the medium.

Eviction forgets a key only once its delete succeeded (the index's delete
ledger): a victim's bytes count against the cap while its delete is queued or
in flight, and after a failed delete (the block is still there) until a retry
succeeds or a rescan no longer finds it. A store whose reservation took a
victim's room writes only once that room is free (or fails ``no_space`` after
a bounded wait), so the cap holds at every instant also while deletes are slow
or failing.

With :attr:`Medium.delete_threads` 0 a delete runs on the I/O thread that
evicted (an unlink takes microseconds). Otherwise deletes go to a pool of
their own (a store waiting for its room never blocks the threads that free
it), :attr:`Medium.delete_batch` keys per call, the batches in parallel.
Failed deletes are retried by every rescan, by a store refused for lack of
room while they hold it (at most every :data:`ROOM_RETRY_EVERY_S`: a medium
that stops failing is noticed by the next store) and, with a delete pool,
after a growing pause (:data:`RETRY_PAUSES_S`, then every
:data:`RETRY_EVERY_S` while deletes keep failing). The queue holds only victims the index handed out, so
it never holds more than the cap's worth of blocks plus blocks found bad.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from tiering.core.base import OffloadKey
from tiering.core.store.index import CapacityIndex, Victim
from tiering.core.store.medium import Medium
from tiering.core.store.pool import IOPool
from tiering.core.store.stats import Counters

logger = logging.getLogger(__name__)

__all__ = ["RETRY_EVERY_S", "RETRY_PAUSES_S", "ROOM_RETRY_EVERY_S", "Deletes"]

RETRY_PAUSES_S = (0.2, 1.0, 5.0)
"""Pauses in seconds before the first retry rounds of failed deletes (with a delete pool)."""

RETRY_EVERY_S = 30.0
"""Pause in seconds between the later retry rounds, while deletes keep failing."""

ROOM_RETRY_EVERY_S = 0.2
"""Least pause in seconds between retries of failed deletes asked for by stores refused for lack of room."""


class Deletes:
    """Deletes victims on the medium and reports each outcome to the index.

    Args:
        medium: the store's medium.
        index: the store's index (victims are reported to it; keys it did not hand out are ignored by it).
        counters: the store's counters (``bad_blocks_removed``).
        on_gone: called with keys that left the medium (e.g. to drop cached lookups).

    Attributes:
        retry_pauses_s: pauses before the retry rounds (tests shorten them).
    """

    def __init__(
        self,
        medium: Medium,
        index: CapacityIndex,
        counters: Counters,
        on_gone: Callable[[Sequence[OffloadKey]], None],
    ) -> None:
        self.medium = medium
        self.index = index
        self.counters = counters
        self.on_gone = on_gone
        self.retry_pauses_s: tuple[float, ...] = (*RETRY_PAUSES_S, RETRY_EVERY_S)
        self.room_retry_every_s = ROOM_RETRY_EVERY_S
        self._next_room_retry = 0.0
        self._lock = threading.Lock()
        self._closed = False
        self._retry_round = 0
        self._retry_timer: threading.Timer | None = None  # at most one retry round waits
        n = medium.delete_threads
        self._pool = IOPool(n, 0, name="tiering-delete", max_batch=max(1, medium.delete_batch)) if n > 0 else None

    @property
    def pooled(self) -> bool:
        """Whether deletes run on a pool of their own (else on the calling thread)."""
        return self._pool is not None

    def delete(self, victims: Iterable[Victim], reason: str) -> None:
        """Delete ``victims`` (``reason``: ``"eviction"``, ``"expired"`` or ``"bad"``); outcomes go to the index."""
        self._submit([v.key for v in victims], reason)

    def _submit(self, keys: Sequence[OffloadKey], reason: str) -> None:
        if not keys:
            return
        if self._pool is None:
            self._run(keys, reason)
            return
        # The pool spreads each batch over its idle threads; each thread sends its part in medium batches. A medium
        # that stopped taking batches gets one key per unit: a busy pool never queues its keys behind one thread.
        step = max(1, self.medium.delete_batch)
        for start in range(0, len(keys), step):
            batch = keys[start : start + step]
            self._pool.submit("read", functools.partial(self._run, reason=reason), batch, self._never_ran)

    def _run(self, keys: Sequence[OffloadKey], reason: str) -> None:
        """Delete one batch; a failed delete keeps its bytes counted (retried later)."""
        step = max(1, self.medium.delete_batch)
        outcomes: list[tuple[OffloadKey, bool]] = []
        again: list[OffloadKey] = []
        for start in range(0, len(keys), step):
            batch = keys[start : start + step]
            try:
                done: Sequence[bool | None] = self.medium.remove_many(batch)
            except Exception as exc:
                logger.warning("%s: delete of %d blocks failed: %s", self.medium.label, len(batch), exc)
                # One raising key must not fail the rest of its batch: each is tried on its own.
                done = [self._remove_one(key) for key in batch] if len(batch) > 1 else [False]
            for key, ok in zip(batch, done, strict=True):
                # Not attempted: the medium stopped taking batches during the call; sent again in smaller batches.
                if ok is None and self.medium.delete_batch < len(batch):
                    again.append(key)
                else:
                    outcomes.append((key, bool(ok)))
        self._submit(again, reason)
        self.index.deleted_many(outcomes)
        gone = [k for k, ok in outcomes if ok]
        if reason == "bad" and gone:
            self.counters.inc("bad_blocks_removed", len(gone))
        failed = [k for k, ok in outcomes if not ok]
        for key in failed:
            logger.warning(
                "%s: cannot delete %s (%s); kept counted, retried %s",
                self.medium.label,
                key.hex(),
                reason,
                "later" if self._pool is not None else "at the next rescan",
            )
        if failed:
            self._schedule_retry()
        if gone:
            self.on_gone(gone)

    def _remove_one(self, key: OffloadKey) -> bool:
        """Delete one key of a batch whose call raised; False when this key's delete fails (or raises) too."""
        try:
            return bool(self.medium.remove_many([key])[0])
        except Exception as exc:
            logger.warning("%s: delete of %s failed: %s", self.medium.label, key.hex(), exc)
            return False

    def _never_ran(self, keys: Sequence[OffloadKey], exc: BaseException) -> None:
        """The delete pool could not run a batch (shut down): the deletes count as failed (bytes kept)."""
        self.index.deleted_many((key, False) for key in keys)

    def retry_failed(self) -> None:
        """Hand every failed delete out again and send it (a rescan calls it; so does the retry timer)."""
        self.delete(self.index.retry_deletes(), "eviction")

    def retry_for_room(self) -> bool:
        """A store found no room while failed deletes hold bytes: retry them now (at most every ``room_retry_every_s``).

        Deletes that failed while the medium raised succeed again as soon as it stops: the next store
        notices, not only the next rescan or retry round. Without a delete pool the retry runs on the
        calling thread (an I/O thread). Returns whether a retry was started.
        """
        if not self.index.failed_delete_bytes:
            return False
        now = time.monotonic()
        with self._lock:
            if self._closed or now < self._next_room_retry:
                return False
            self._next_room_retry = now + self.room_retry_every_s
        self.retry_failed()
        return True

    def reset_retries(self) -> None:
        """Deletes succeed again (or a rescan retried them): the next failure waits the shortest pause."""
        with self._lock:
            self._retry_round = 0

    def _schedule_retry(self) -> None:
        if self._pool is None:
            return  # inline deletes are retried by the next rescan
        with self._lock:
            if self._closed or self._retry_timer is not None:
                return
            pause = self.retry_pauses_s[min(self._retry_round, len(self.retry_pauses_s) - 1)]
            self._retry_round += 1
            self._retry_timer = timer = threading.Timer(pause, self._retry)
            timer.daemon = True
            timer.start()

    def _retry(self) -> None:
        with self._lock:
            self._retry_timer = None
            if self._closed:
                return
        self.retry_failed()

    def pending(self) -> int:
        """Delete batches queued and not yet started (0 without a delete pool)."""
        return self._pool.pending() if self._pool is not None else 0

    def close(self) -> None:
        """Send the queued deletes, then stop the pool and the retry timer (idempotent)."""
        with self._lock:
            self._closed = True
            timer, self._retry_timer = self._retry_timer, None
        if timer is not None:
            timer.cancel()
        if self._pool is not None:
            self._pool.wait_idle(10.0)
            self._pool.shutdown(wait=True)
