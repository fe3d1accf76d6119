"""Bookkeeping around the backend's calls: a gate that lets ``clear`` run alone, and SGLang's storage metrics.

SGLang calls the backend from several threads at once; ``clear`` rebuilds
the tiers, so it must wait until no call uses them and hold new calls back
meanwhile (:class:`CallGate`). With ``--enable-storage-metrics`` SGLang asks
``get_stats()`` after its storage work for the pages and bandwidth of each
prefetch and backup call since the last ask (:class:`CallMetrics`).
Imports nothing from SGLang at import time.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

GB = 1e9
"""SGLang's storage bandwidth histograms are in GB/s (10^9 bytes per second)."""


class CallGate:
    """Many calls at once, or one exclusive operation (``clear``) with no call running.

    A waiting exclusive operation holds new calls back, so a steady stream
    of calls cannot starve it.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._exclusive = False

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Run one call (waits while an exclusive operation runs or waits)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Run alone: waits for the calls running to end; new calls wait until it is done."""
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive)
            self._exclusive = True
            self._cond.wait_for(lambda: self._active == 0)
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class CallMetrics:
    """Pages and bandwidth of each load (prefetch) and store (backup) call, until SGLang takes them. Thread safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lists: dict[str, list[Any]] = {}

    def record(self, *, load: bool, pages: int, moved_bytes: int, seconds: float) -> None:
        """One call of ``pages`` pages that moved ``moved_bytes`` bytes (pages verified or stored) in ``seconds``."""
        kind = "prefetch" if load else "backup"
        with self._lock:
            self._lists.setdefault(f"{kind}_pgs", []).append(pages)
            if seconds > 0:
                self._lists.setdefault(f"{kind}_bandwidth", []).append(moved_bytes / seconds / GB)

    def take(self) -> Any:
        """SGLang's ``StorageMetrics`` with the calls since the last take (then forgotten).

        ``prefetch_pgs`` / ``backup_pgs``: pages per call (as SGLang's own
        backends count them: every page asked for); ``prefetch_bandwidth`` /
        ``backup_bandwidth``: GB/s of the pages that moved, over the call's time.
        """
        from sglang.srt.observability.metrics_collector import StorageMetrics

        with self._lock:
            lists, self._lists = self._lists, {}
        return StorageMetrics(**lists)
