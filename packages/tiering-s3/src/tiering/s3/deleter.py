"""The delete path of an s3 tier: evicted and bad blocks go in batches, or one per request, in parallel.

Deletes run on an :class:`~tiering.core.toolkit.IOPool` of their own (as
many threads as the tier has I/O threads), so a store waiting for its room
never blocks the threads that would free it. While the server takes
``DeleteObjects``, a thread sends up to :data:`~tiering.s3.client.DELETE_BATCH`
keys per request; once it refuses them (at start-up or at any later time),
every thread sends one ``DeleteObject`` at a time. Each outcome is reported
to the tier's :class:`~tiering.core.toolkit.CapacityIndex`: a failed delete
keeps its bytes counted (the object is still there) and is retried, first a
few times with a growing pause, then every :data:`RETRY_EVERY_S` for as long
as deletes keep failing (a server outage of any length settles on its own
once the server answers again; a rescan also retries them at once). The
queue holds only victims the index handed out, so it never holds more than
the cap's worth of blocks plus blocks found bad.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from tiering.core.base import OffloadKey
from tiering.core.toolkit import CapacityIndex, Counters, IOPool
from tiering.s3.client import DELETE_BATCH, S3Client
from tiering.s3.errors import classify_error

logger = logging.getLogger(__name__)

RETRY_PAUSES_S = (0.2, 1.0, 5.0)
"""Pauses in seconds before the first retry rounds of failed deletes."""

RETRY_EVERY_S = 30.0
"""Pause in seconds between the later retry rounds, while deletes keep failing."""


class Deleter:
    """Deletes block objects in batches and reports each outcome to the index.

    Args:
        client: the tier's S3 client.
        object_key: block key -> object name.
        index: the tier's index (victims are reported to it; other keys are ignored by it).
        counters: the tier's counters (``delete_requests``, ``objects_deleted``, ``bad_blocks_removed``,
            ``errors_<class>``).
    """

    def __init__(
        self,
        client: S3Client,
        object_key: Callable[[bytes], str],
        index: CapacityIndex,
        counters: Counters,
        threads: int = 1,
    ) -> None:
        self._client = client
        self._object_key = object_key
        self._index = index
        self._counters = counters
        self._lock = threading.Lock()
        self._queue: dict[OffloadKey, str] = {}  # key -> reason ("eviction", "bad"), not yet sent
        self._threads = threads
        self._running = 0  # runners submitted to the pool and not yet returned
        self._closed = False
        self._retry_round = 0
        self._retry_timer: threading.Timer | None = None  # at most one retry round waits
        self._pool = IOPool(threads, 0, name="tiering-s3-delete")

    def queue(self, keys: Iterable[OffloadKey], reason: str) -> None:
        """Delete ``keys`` soon (``reason``: ``"eviction"`` or ``"bad"``); nothing waits for it."""
        with self._lock:
            for key in keys:
                self._queue[key] = reason
        self._start_runners()

    def _start_runners(self) -> None:
        """Start as many runners as the queue can keep busy (one per request it needs), up to the threads."""
        with self._lock:
            per_request = DELETE_BATCH if self._client.batch_delete else 1
            wanted = -(-len(self._queue) // per_request)
            start = max(0, min(wanted, self._threads) - self._running)
            self._running += start
        for _ in range(start):
            self._pool.submit_call("write", self._run)

    def pending(self) -> int:
        """Keys queued and not yet sent."""
        with self._lock:
            return len(self._queue)

    def _run(self) -> None:
        while True:
            with self._lock:
                per_request = DELETE_BATCH if self._client.batch_delete else 1
                batch = list(self._queue.items())[:per_request]
                for key, _ in batch:
                    del self._queue[key]
                if not batch:  # leaves under the same lock round that found nothing: no queued key is stranded
                    self._running -= 1
                    return
            try:
                self._send(batch)
            except BaseException:
                with self._lock:
                    self._running -= 1
                raise

    def _send(self, batch: list[tuple[OffloadKey, str]]) -> None:
        names = {self._object_key(key): (key, reason) for key, reason in batch}
        requests = 1
        try:
            if self._client.batch_delete:
                batch_failed = self._client.delete_batch(list(names))
                if batch_failed is None:
                    # Refused as a batch: the keys go back to the queue, to be deleted one per request in parallel.
                    with self._lock:
                        self._queue.update(batch)
                    self._start_runners()
                    return
                failed = batch_failed
            else:  # one key, or a few taken just before another thread found batches refused
                requests = len(names)
                failed = self._client.delete_many(list(names))
        except Exception as exc:
            cls = classify_error(exc)
            self._counters.inc(f"errors_{cls}")
            logger.warning("s3 tier: delete of %d objects failed (%s): %s", len(names), cls, exc)
            failed = dict.fromkeys(names, cls)
        for name, code in list(failed.items())[:3]:
            logger.warning("s3 tier: delete of %s failed: %s", name, code)
        done = [(key, reason) for name, (key, reason) in names.items() if name not in failed]
        self._index.deleted_many([(key, name not in failed) for name, (key, _) in names.items()])
        self._counters.add(
            {
                "delete_requests": requests,
                "objects_deleted": len(done),
                "bad_blocks_removed": sum(1 for _, reason in done if reason == "bad"),
            }
        )
        if failed:
            self._schedule_retry()
        else:
            self.reset_retries()

    def _schedule_retry(self) -> None:
        with self._lock:
            if self._closed or self._retry_timer is not None:
                return
            rounds = self._retry_round
            pause = RETRY_PAUSES_S[rounds] if rounds < len(RETRY_PAUSES_S) else RETRY_EVERY_S
            self._retry_round += 1
            timer = self._retry_timer = threading.Timer(pause, self._retry)
        timer.daemon = True
        timer.start()

    def _retry(self) -> None:
        with self._lock:
            self._retry_timer = None
        if self._closed:
            return
        victims = self._index.retry_deletes()
        self.queue((v.key for v in victims), "eviction")

    def reset_retries(self) -> None:
        """Start the next failures' retries at the shortest pause again (after a batch without failures)."""
        with self._lock:
            self._retry_round = 0

    def close(self) -> None:
        """Send what is queued, then stop (idempotent)."""
        with self._lock:
            self._closed = True
            timer, self._retry_timer = self._retry_timer, None
        if timer is not None:
            timer.cancel()
        self._pool.wait_idle(60.0)
        self._pool.shutdown()
        with self._lock:
            self._running += 1
        self._run()  # anything queued after the pool stopped
