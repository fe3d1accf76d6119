"""Scans of an indexed block store: the start-up scan, periodic rescans, and their reconciliation with the index.

A scan (:meth:`~tiering.core.store.medium.Medium.scan`) lists the medium
once. Its blocks replace the index's view (:meth:`CapacityIndex.reconcile`,
under a ticket, oldest first so the newest are at the LRU end; a write in
flight keeps its state): keys the index held that the medium no longer has
were removed by another process and are forgotten; other writers'
temporaries count against the cap until the next scan; failed deletes are
retried; then the store evicts down to its cap (and past tenants' TTLs).
A store opened for inspection (:attr:`Medium.read_only`) only reconciles:
nothing is evicted, expired, retried or accounted for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from tiering.core.base import OffloadKey
from tiering.core.store.deletes import Deletes
from tiering.core.store.hooks import PinBook
from tiering.core.store.index import Admit, CapacityIndex
from tiering.core.store.medium import Medium, ScanResult
from tiering.core.store.stats import Counters

logger = logging.getLogger(__name__)

__all__ = ["Rescanner", "Scans"]

_TEMP_KEY = OffloadKey(b"")
"""Index key under which other writers' temporaries are reserved (no real key is empty)."""


class Scans:
    """One scan pass and what it settles (see the module doc).

    Args:
        medium: the store's medium.
        index: the store's index.
        deletes: the store's delete path.
        counters: the store's counters (``scans`` and the medium's scan counters).
        pins: the store's pins (read again first: the eviction down to the cap keeps pinned blocks).
        stopping: True once the store is shutting down.
        forget: called with keys the scan found gone and the reason.
        log: where the scan's summary goes (the tier's module logger, so a backend's lines stay under its name).

    Attributes:
        temp_bytes: other writers' temporaries counted against the cap now.
        last_scan_s: seconds the latest complete scan took.
    """

    def __init__(
        self,
        medium: Medium,
        index: CapacityIndex,
        deletes: Deletes,
        counters: Counters,
        pins: PinBook,
        stopping: Callable[[], bool],
        forget: Callable[[Sequence[OffloadKey], str], None],
        log: logging.Logger = logger,
    ) -> None:
        self.medium = medium
        self.index = index
        self.deletes = deletes
        self.counters = counters
        self.pins = pins
        self._is_stopping = stopping
        self._forget = forget
        self._log = log
        self.temp_bytes = 0
        self.last_scan_s = 0.0

    def scan(self, first: bool) -> ScanResult | None:
        """One pass over the medium, reconciled with the index; None when it stopped early (shutdown).

        Raises:
            Exception: what the medium's listing raised (nothing was changed then).
        """
        started = time.monotonic()
        self.pins.refresh()  # the pins first: the eviction down to the cap below keeps pinned blocks
        with self.index.reading() as ticket:
            result = self.medium.scan(self._is_stopping)
            if not result.complete:
                return None
            oldest_first = sorted(result.blocks.items(), key=lambda item: item[1][1])
            born = {OffloadKey(k): mtime for k, (_, mtime) in oldest_first}  # a tenant's TTL counts from the store
            report = self.index.reconcile({OffloadKey(k): size for k, (size, _) in oldest_first}, ticket, born)
        self._forget(report.vanished, "vanished")
        if not self.medium.read_only:  # opened for inspection: no block is evicted, expired or deleted
            self._account_temps(result.temp_bytes)
            self.deletes.reset_retries()
            self.deletes.retry_failed()  # failed deletes go again first: their bytes are still there
            self.deletes.delete(self.index.evict_to_cap(), "eviction")
        self.counters.add({"scans": 1, **result.counters})
        self.last_scan_s = time.monotonic() - started
        (self._log.info if first else self._log.debug)(
            "%s: %s scan of %s took %.3f s: %d blocks indexed, %d new, %d vanished%s",
            self.medium.label,
            "startup" if first else "periodic",
            self.medium.location,
            self.last_scan_s,
            len(self.index),
            len(report.added),
            len(report.vanished),
            f", {result.summary}" if result.summary else "",
        )
        return result

    def _account_temps(self, temp_bytes: int) -> None:
        """Count other writers' temporaries against the cap until the next scan (left out, the medium outgrows it)."""
        if self.temp_bytes:
            self.index.commit(_TEMP_KEY, False)
            self.temp_bytes = 0
        if temp_bytes:
            res = self.index.reserve(_TEMP_KEY, temp_bytes)
            self.deletes.delete(res.victims, "eviction")
            if res.admit is Admit.RESERVED:
                self.temp_bytes = temp_bytes
                if not res.ready:  # these bytes are on the medium already: count them there once their room is free
                    self.index.wait_for_room([_TEMP_KEY], 0.0)


class Rescanner:
    """The background thread that runs the start-up scan, then a rescan every ``interval_s`` (and on :meth:`wake`).

    Args:
        scan: one pass (``scan(first)``); its exceptions are logged, never fatal.
        interval_s: seconds between rescans; 0: none on a timer (the thread ends after the start-up scan
            and :meth:`wake` starts one pass on a thread of its own).
        name: the threads' name.
        first: run the start-up scan (False: it already ran, or there is none).

    Attributes:
        first_done: set once the start-up scan finished (also when it failed); cleared by a reset of the
            store until the next pass is done.
    """

    def __init__(self, scan: Callable[[bool], object], interval_s: float, name: str, first: bool = True) -> None:
        self._scan = scan
        self.interval_s = interval_s
        self.name = name
        self.first_done = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._stopping = False
        self._thread: threading.Thread | None = None
        if not first:
            self.first_done.set()
        if first or interval_s > 0:
            self._start(first, run_now=first)

    def _start(self, first: bool, run_now: bool) -> None:
        self._thread = threading.Thread(target=self._main, args=(first, run_now), name=self.name, daemon=True)
        self._thread.start()

    def _main(self, first: bool, run_now: bool) -> None:
        while not self._stopping:
            if not run_now:
                self._wake.wait(self.interval_s)
                self._wake.clear()
                if self._stopping:
                    return
            try:
                self._scan(first)
            except Exception:
                logger.exception("%s: scan failed", self.name)
            finally:
                run_now = self._pass_done()
            first = False
            if not run_now and self.interval_s <= 0:
                return

    def _pass_done(self) -> bool:
        """End of a pass: whether a :meth:`wake` came during it (then the next pass runs now).

        Decided under the lock that :meth:`wake` takes: a wake landing between the end of a pass and the
        thread's exit is never lost. ``first_done`` is set only when no wake is pending, so a reset that
        cleared it during a pass waits for the pass it asked for, not for the one that was running.
        """
        with self._lock:
            if self._wake.is_set() and not self._stopping:
                self._wake.clear()
                return True
            self.first_done.set()  # after the start-up scan, and after a rescan a reset waits for
            if self.interval_s <= 0:
                self._thread = None  # this thread ends: the next wake starts a new one
            return False

    def wake(self) -> None:
        """Run the next rescan now (on the scan thread, or on a new one where none runs)."""
        with self._lock:
            if self._stopping:
                return
            if self._thread is None or not self._thread.is_alive():
                self._start(first=False, run_now=True)
                return
            self._wake.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop after the pass in progress; wait up to ``timeout_s`` seconds for it."""
        with self._lock:
            self._stopping = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout_s)
