"""What this process knows, kept in line with the server: restarts and failovers, forgotten and vanished blocks, scans.

:class:`RedisServerSync` is the base of :class:`~tiering.redis.io.RedisBlockIO`: it holds
the shared state (set by :class:`~tiering.redis.tier.RedisSecondaryTierManager`) and the
bookkeeping every I/O path uses; with ``eviction: "tier"`` it also reports to the
fleet-wide LRU (:class:`~tiering.redis.fleet.FleetCap`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from tiering.core.base import OffloadKey
from tiering.core.toolkit import CapacityIndex, Counters, IOPool, KVEventLog, LookupCache, Victim
from tiering.core.toolkit.pins import PinBook
from tiering.redis.config import RedisSettings
from tiering.redis.fleet import FleetCap
from tiering.redis.medium import RedisMedium
from tiering.redis.pins import RedisPins

logger = logging.getLogger(__name__)


class RedisServerSync:
    """Shared state and bookkeeping of the redis tier; the attributes are set by the tier's constructor."""

    settings: RedisSettings
    medium_io: RedisMedium
    object_bytes: int
    location: str
    index: CapacityIndex
    counters: Counters
    events: KVEventLog
    lookups: LookupCache
    pool: IOPool
    _closed: bool
    _scan_done: threading.Event
    _forget_only: bool
    _known_limit: int
    fleet: FleetCap | None
    pins: PinBook
    pin_records: RedisPins | None

    def _trim_known(self) -> None:
        """With the server evicting: forget the least recently used known blocks beyond its ``maxmemory``.

        The server cannot hold more, so older entries are likely gone; forgetting
        them (never deleting) keeps this process's index bounded. Trims to 90 %
        so that the O(n) snapshot of the index is taken rarely.
        """
        limit = self._known_limit
        if not limit or self.index.resident_bytes <= limit:
            return
        surplus = self.index.resident_bytes - int(0.9 * limit)
        forgotten: list[OffloadKey] = []
        for key in self.index.keys():  # noqa: SIM118 (a snapshot, LRU first; the index is not iterable)
            if surplus <= 0:
                break
            self.index.remove(key, delete=False, cause="forgotten")  # still on the server: lookups ask it
            surplus -= self.object_bytes
            forgotten.append(key)
        self.lookups.invalidate(forgotten)
        self.counters.inc("forgotten_blocks", len(forgotten))

    if TYPE_CHECKING:  # provided by SecondaryTierManager

        @property
        def block_bytes(self) -> int: ...

        def block(self, block_id: int) -> memoryview: ...

        def _fleet_evict(self, victims: Sequence[OffloadKey]) -> None: ...

        def _delete(self, victims: Sequence[Victim], reason: str, accounted: bool = True) -> None: ...

    def _primary_changed(self, kept: bool) -> None:
        """The primary changed (the medium saw a new ``run_id``); on an I/O thread, once per change.

        ``kept`` (a promoted replica continuing the old primary's data set):
        the index is kept (``failovers``). Otherwise (a restart, empty unless
        it reloaded persisted data) the tier forgets every known block at
        once (``server_restarts``), so lookups do not answer True and stores
        are not skipped for blocks that are gone; the namespace record is
        written again. Either way a re-scan of the new primary (when
        ``startup_scan`` is on) then forgets the blocks it lacks (writes that
        did not reach the replica) and adopts those it holds. Writes in
        flight are kept (see :meth:`CapacityIndex.reconcile`).
        """
        vanished: tuple[OffloadKey, ...] = ()
        if not kept:
            with self.index.reading() as ticket:
                vanished = self.index.reconcile({}, ticket).vanished
        if self.settings["startup_scan"]:
            self._scan_done.clear()  # before the counter moves: whoever sees the change also waits for the scan
        self.counters.inc("failovers" if kept else "server_restarts")
        if kept:
            logger.warning(
                "redis tier: %s failed over (new run_id) to a replica of the old primary; keeping the %d known blocks",
                self.location,
                len(self.index),
            )
        else:
            self.lookups.invalidate(vanished)
            logger.warning(
                "redis tier: %s restarted (new run_id, a new data set); forgot %d blocks it may no longer hold",
                self.location,
                len(vanished),
            )
            self.medium_io.write_record()
        # A consumer of the KV events may have missed some around the change: re-announce what is known.
        self.index.announce("reconnect")
        if self.settings["startup_scan"]:
            self.pool.submit_call("read", lambda: self._scan(replace=True))

    def _forget(self, keys: Iterable[OffloadKey], reason: str) -> None:
        """Keys known gone (a load found them missing): out of the index and the lookup cache."""
        keys = list(keys)
        cause = "corrupt" if reason == "bad" else reason
        for key in keys:
            self.index.remove(key, delete=False, cause=cause)
        self.lookups.mark_absent(keys)
        if self.fleet is not None and keys:
            try:
                self.fleet.removed(keys)
            except Exception as exc:
                self.medium_io.count_error(exc, f"removing {len(keys)} gone blocks from the fleet's LRU")

    def _scan(self, replace: bool = False) -> None:
        """Learn which blocks of the namespace the server holds (``SCAN`` + ``EXISTS``: no access), on an I/O thread.

        At start-up (``replace`` False) the blocks found join the index; after
        a change of primary (``replace`` True) the index is replaced by them
        (:meth:`CapacityIndex.reconcile`: known blocks the new primary lacks
        are forgotten). Either way under a ticket, so a key changed meanwhile
        keeps its newer state; with ``eviction:
        "process"`` the least recently used beyond ``capacity_bytes`` are then
        deleted; with ``eviction: "tier"`` the fleet's LRU is repaired from the
        scan (:meth:`~tiering.redis.fleet.FleetCap.reconcile`) and its surplus
        deleted. A failure is logged and counted: lookups still ask the server.
        """
        try:
            with self.index.reading() as ticket:
                found = dict.fromkeys(self.medium_io.scan(), self.object_bytes)
                vanished: tuple[OffloadKey, ...] = ()
                if replace:
                    vanished = self.index.reconcile(found, ticket).vanished
                else:
                    self.index.adopt_many(found.items(), ticket)
            self.lookups.invalidate(vanished)
            self.counters.inc("scanned_blocks", len(found))
            self._delete(self.index.evict_to_cap(), "eviction")
            if self.fleet is not None:
                added, removed = self.fleet.reconcile(found, lambda keys: self.medium_io.present(keys, touch=False))
                self.counters.inc("fleet_repaired_blocks", added + removed)
                self._fleet_evict(self.fleet.evict_surplus())
            self._trim_known()
        except Exception as exc:
            self.medium_io.count_error(exc, "the re-scan of a new primary" if replace else "the start-up scan")
        finally:
            self._scan_done.set()
