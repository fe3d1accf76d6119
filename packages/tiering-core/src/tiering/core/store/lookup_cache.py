"""A lookup cache for remote tiers: answers without blocking, resolves misses in batches off the scheduler thread.

A remote tier (S3, Redis, a shared filesystem) cannot ask its server from
``lookup``, which runs on the scheduler thread. :class:`LookupCache` answers
from memory and resolves unknown keys in the background:

- a key with a positive entry answers True;
- a key with an unexpired negative entry answers False;
- a key being resolved (or newly queued) answers None (ask again);
- unknown keys are queued, and one background task resolves every queued key
  with one call of the tier's ``resolve`` callback (a pipelined EXISTS, HEADs
  in parallel, a directory listing...), so the keys of one scheduler step go
  in one batch. With ``gather_s`` the background task first waits until no
  key was queued for ``gather_s`` seconds (the scheduler finished its round
  of ``lookup`` calls), so a step's keys become one batch instead of a small
  first batch raced by the rest, and the resolution does not compete with
  the scheduler thread for the GIL while it is still asking.

Negative entries expire after ``negative_ttl_s`` (another process may store
the block meanwhile) and are bounded in number (oldest dropped first);
positive entries are bounded too (least recently used dropped first) and
optionally expire. :meth:`LookupCache.invalidate` drops a key everywhere,
also while it is being resolved: a resolution that began before the
invalidation cannot install a stale True.

The design follows vLLM's ``AsyncLookupManager``
(``vllm/v1/kv_offload/tiering/async_lookup.py``): lookups of remote tiers
answered asynchronously, None while in flight.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tiering.core.base import OffloadKey

logger = logging.getLogger(__name__)

Resolver = Callable[[Sequence[OffloadKey]], Mapping[OffloadKey, bool]]
"""Resolves a batch of keys: key -> present. A key missing from the answer counts as absent."""


class LookupCache:
    """Positive/negative lookup cache with batched background resolution.

    Args:
        resolve: the tier's batch existence check (see :data:`Resolver`);
            runs on a background thread, may block on the network, may raise
            (the batch's keys then answer False for ``error_ttl_s``).
        submit: runs a callable off the scheduler thread (e.g. an
            :class:`~tiering.core.store.pool.IOPool` read submission or an
            executor's ``submit``); None: a private single-thread executor.
        negative_ttl_s: seconds a "not there" answer is trusted.
        max_negative: bound on negative entries.
        max_positive: bound on positive entries (least recently used dropped).
        positive_ttl_s: seconds a "there" answer is trusted; None: until invalidated.
        max_pending: bound on keys queued or being resolved; beyond it a
            lookup answers False at once (counted in ``lookup_probes_skipped``).
        max_batch: keys per ``resolve`` call.
        error_ttl_s: seconds a key whose resolution raised answers False.
        gather_s: seconds without a newly queued key before a batch is taken
            (0: take what is queued at once); the wait ends early when
            ``max_batch`` keys are queued, and lasts at most ``max_gather_s``.
        max_gather_s: the longest gathering wait, in seconds.
        parallel: most ``resolve`` calls running at once (each on its own
            ``submit`` task; the tier's resolver must be thread-safe when > 1).
        clock: monotonic clock in seconds (tests pass a fake).

    Raises:
        ValueError: a bound or TTL is not positive.
    """

    def __init__(
        self,
        resolve: Resolver,
        submit: Callable[[Callable[[], None]], Any] | None = None,
        *,
        negative_ttl_s: float = 5.0,
        max_negative: int = 65536,
        max_positive: int = 1 << 20,
        positive_ttl_s: float | None = None,
        max_pending: int = 16384,
        max_batch: int = 1024,
        error_ttl_s: float = 1.0,
        gather_s: float = 0.0,
        max_gather_s: float = 0.05,
        parallel: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, value in (
            ("negative_ttl_s", negative_ttl_s),
            ("max_negative", max_negative),
            ("max_positive", max_positive),
            ("max_pending", max_pending),
            ("max_batch", max_batch),
            ("error_ttl_s", error_ttl_s),
            ("parallel", parallel),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if gather_s < 0 or max_gather_s < 0:
            raise ValueError(f"gather_s and max_gather_s must be >= 0, got {gather_s}, {max_gather_s}")
        if positive_ttl_s is not None and positive_ttl_s <= 0:
            raise ValueError(f"positive_ttl_s must be > 0 or None, got {positive_ttl_s}")
        self._resolve = resolve
        self._own_executor: concurrent.futures.ThreadPoolExecutor | None = None
        if submit is None:
            self._own_executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tiering-lookup")
            submit = self._own_executor.submit
        self._submit = submit
        self.negative_ttl_s = negative_ttl_s
        self.positive_ttl_s = positive_ttl_s
        self.max_negative = max_negative
        self.max_positive = max_positive
        self.max_pending = max_pending
        self.max_batch = max_batch
        self.error_ttl_s = error_ttl_s
        self.gather_s = gather_s
        self.parallel = parallel
        self.max_gather_s = max_gather_s
        self._clock = clock
        self._lock = threading.Lock()
        self._positive: collections.OrderedDict[OffloadKey, float] = collections.OrderedDict()  # key -> expiry
        self._negative: collections.OrderedDict[OffloadKey, float] = collections.OrderedDict()  # key -> expiry
        self._queued: dict[OffloadKey, None] = {}  # insertion-ordered set
        self._resolving: set[OffloadKey] = set()
        self._stale: set[OffloadKey] = set()  # invalidated while resolving
        self._runners = 0  # resolution tasks submitted and not finished
        self._closed = False
        self._counters: collections.Counter[str] = collections.Counter()

    def lookup(self, key: OffloadKey) -> bool | None:
        """True (known present), False (known absent), None (being resolved: ask again); never blocks."""
        now = self._clock()
        with self._lock:
            expiry = self._positive.get(key)
            if expiry is not None:
                if expiry > now:
                    self._positive.move_to_end(key)
                    return True
                del self._positive[key]
            expiry = self._negative.get(key)
            if expiry is not None:
                if expiry > now:
                    return False
                del self._negative[key]
            if key in self._queued or key in self._resolving:
                return None
            if self._closed or len(self._queued) + len(self._resolving) >= self.max_pending:
                self._counters["lookup_probes_skipped"] += 1
                return False
            self._queued[key] = None
            schedule = self._runners == 0
            if schedule:
                self._runners = 1
        if schedule:
            self._schedule()
        return None

    def _schedule(self) -> None:
        try:
            self._submit(self._run)
        except Exception:  # an executor shut down: answer the queued keys "absent" rather than hang
            logger.warning("lookup cache: cannot schedule a resolution; queued keys answer False", exc_info=True)
            with self._lock:
                self._runners -= 1
                if self._runners == 0:
                    keys = list(self._queued)
                    self._queued.clear()
                    self._add_negative(keys, self._clock() + self.error_ttl_s)

    def _run(self) -> None:
        """Resolve queued keys in batches until none is left (background thread).

        When keys remain queued after taking a batch, another task is
        submitted (up to ``parallel`` at once), so batches resolve side by side.
        """
        while True:
            self._gather()
            with self._lock:
                if not self._queued:
                    self._runners -= 1
                    return
                batch = list(itertools.islice(self._queued, self.max_batch))
                for key in batch:
                    del self._queued[key]
                self._resolving.update(batch)
                more = bool(self._queued) and self._runners < self.parallel
                if more:
                    self._runners += 1
            if more:
                self._schedule()
            try:
                answer: Mapping[OffloadKey, bool] | None = self._resolve(batch)
            except Exception:
                logger.warning(
                    "lookup cache: resolving %d keys failed; they answer False for now", len(batch), exc_info=True
                )
                answer = None
            self._record(batch, answer)

    def _gather(self) -> None:
        """Wait (without the lock) until the queue stopped growing for ``gather_s``, or is a full batch."""
        if self.gather_s <= 0:
            return
        deadline = time.monotonic() + self.max_gather_s
        with self._lock:
            seen = len(self._queued)
        while seen < self.max_batch and time.monotonic() < deadline:
            time.sleep(self.gather_s)
            with self._lock:
                now = len(self._queued)
            if now == seen:
                return
            seen = now

    def _record(self, batch: Sequence[OffloadKey], answer: Mapping[OffloadKey, bool] | None) -> None:
        # Set operations and comprehensions rather than a Python loop per key: a batch is up to thousands of
        # keys, recorded while the scheduler thread may be asking (both need the GIL).
        now = self._clock()
        with self._lock:
            self._counters["lookup_probes"] += len(batch)
            self._counters["lookup_batches"] += 1
            if answer is None:
                self._counters["lookup_errors"] += 1
            self._resolving.difference_update(batch)
            keys: Sequence[OffloadKey] = batch
            if self._stale:  # invalidated while resolving: no answer is recorded for them
                stale = self._stale.intersection(batch)
                if stale:
                    self._stale -= stale
                    keys = [k for k in batch if k not in stale]
            if answer:
                present = [k for k in keys if answer.get(k, False)]
                absent = [k for k in keys if not answer.get(k, False)] if present else list(keys)
            else:
                present, absent = [], list(keys)
            self._add_positive(present, now)
            ttl = self.negative_ttl_s if answer is not None else self.error_ttl_s
            self._add_negative(absent, now + ttl)

    def _add_positive(self, keys: Iterable[OffloadKey], now: float) -> None:
        expiry = now + self.positive_ttl_s if self.positive_ttl_s is not None else float("inf")
        _insert_last(self._positive, self._negative, keys, expiry)
        while len(self._positive) > self.max_positive:
            self._positive.popitem(last=False)

    def _add_negative(self, keys: Iterable[OffloadKey], expiry: float) -> None:
        _insert_last(self._negative, self._positive, keys, expiry)
        while len(self._negative) > self.max_negative:
            self._negative.popitem(last=False)

    def mark_present(self, keys: Iterable[OffloadKey]) -> None:
        """Record ``keys`` as present (this process stored them), without asking ``resolve``."""
        with self._lock:
            self._add_positive(keys, self._clock())

    def mark_absent(self, keys: Iterable[OffloadKey]) -> None:
        """Record ``keys`` as absent for ``negative_ttl_s`` (e.g. a load found them missing)."""
        with self._lock:
            self._add_negative(keys, self._clock() + self.negative_ttl_s)

    def invalidate(self, keys: Iterable[OffloadKey]) -> None:
        """Forget ``keys`` (positive and negative); a resolution in flight for one of them is discarded."""
        with self._lock:
            for key in keys:
                self._positive.pop(key, None)
                self._negative.pop(key, None)
                if key in self._resolving:
                    self._stale.add(key)

    def pending(self) -> int:
        """Keys queued or being resolved."""
        with self._lock:
            return len(self._queued) + len(self._resolving)

    def stats(self) -> dict[str, int]:
        """``lookup_probes`` (keys resolved), ``lookup_batches``, ``lookup_errors``, ``lookup_probes_skipped``,
        ``lookup_cache_positive``, ``lookup_cache_negative``, ``lookup_probes_pending``.
        """  # noqa: D205
        with self._lock:
            out = {
                name: self._counters[name]
                for name in ("lookup_probes", "lookup_batches", "lookup_errors", "lookup_probes_skipped")
            }
            out["lookup_cache_positive"] = len(self._positive)
            out["lookup_cache_negative"] = len(self._negative)
            out["lookup_probes_pending"] = len(self._queued) + len(self._resolving)
            return out

    def close(self) -> None:
        """Stop resolving: new unknown keys answer False; the private executor (if any) is shut down."""
        with self._lock:
            self._closed = True
            self._queued.clear()
        if self._own_executor is not None:
            self._own_executor.shutdown(wait=True)


def _insert_last(
    into: collections.OrderedDict[OffloadKey, float],
    other: collections.OrderedDict[OffloadKey, float],
    keys: Iterable[OffloadKey],
    expiry: float,
) -> None:
    """Give ``keys`` ``expiry`` in ``into`` as its most recent entries (in order), and drop them from ``other``."""
    keys = list(keys)
    if not keys:
        return
    if other:
        for key in other.keys() & keys:
            del other[key]
    if into:
        for key in into.keys() & keys:  # present already: moved to the end by deleting and inserting again
            del into[key]
    into.update(dict.fromkeys(keys, expiry))
