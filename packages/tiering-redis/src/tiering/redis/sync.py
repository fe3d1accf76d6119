"""What this process knows, kept in line with the server: restarts and failovers, forgotten and vanished blocks, scans.

:class:`RedisServerSync` is the base of :class:`~tiering.redis.io.RedisBlockIO`: it holds
the shared state (set by :class:`~tiering.redis.tier.RedisSecondaryTierManager`) and the
bookkeeping every I/O path uses; with ``eviction: "tier"`` it also reports to the
fleet-wide LRU (:class:`~tiering.redis.fleet.FleetCap`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from tiering.core.base import OffloadKey
from tiering.core.toolkit import CapacityIndex, Counters, IOPool, KVEventLog, LookupCache, Victim
from tiering.core.toolkit.pins import PinBook
from tiering.core.toolkit.tenancy import TenantPolicy
from tiering.redis.config import RedisSettings
from tiering.redis.errors import classify_error
from tiering.redis.fleet import FleetCap
from tiering.redis.layout import KeyLayout
from tiering.redis.pins import RedisPins
from tiering.redis.presence import PresenceQuery
from tiering.redis.probe import Primaries, primaries

logger = logging.getLogger(__name__)

RUN_ID_CHECK_S = 1.0
"""Seconds between checks of the primary's ``run_id`` (one ``INFO``) while the tier sends pipelines, errors or not.

redis-py re-makes a pooled connection that the server closed without raising,
so a failover (the sentinel names the new primary) or a quick restart may
show no error at all.
"""


class RedisServerSync:
    """Shared state and bookkeeping of the redis tier; the attributes are set by the tier's constructor."""

    settings: RedisSettings
    layout: KeyLayout
    digest: str
    _digest_bytes: bytes
    object_bytes: int
    ttl_s: int | None
    tenants: TenantPolicy | None
    location: str
    index: CapacityIndex
    counters: Counters
    events: KVEventLog
    lookups: LookupCache
    pool: IOPool
    _client: Any
    _closed: bool
    _recheck: bool
    _check_lock: threading.Lock
    _next_check: float
    _namespace_record: bytes
    _primaries: Primaries
    _presence: PresenceQuery
    _is_cluster: bool
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

    def block_key(self, key: bytes) -> str:
        """The Redis key of block ``key``."""
        return self.layout.block_key(self.digest, key)

    def _count_error(self, exc: BaseException, what: str) -> str:
        cause = classify_error(exc)
        if cause in ("connection", "timeout", "loading", "readonly"):
            self._recheck = True
        self.counters.inc(f"errors_{cause}")
        text = self.settings.redact(f"{type(exc).__name__}: {exc}")
        if cause == "other":
            logger.error("redis tier: %s failed: %s", what, text)
        else:
            logger.warning("redis tier: %s failed (%s): %s", what, cause, text)
        return cause

    def _pipeline(self) -> Any:
        self._check_server()
        self.counters.inc("pipelines")
        return self._client.pipeline(transaction=False)

    def _check_server(self) -> None:
        """Before a pipeline: after connection trouble, and at most every :data:`RUN_ID_CHECK_S`, see whether
        the primary changed (:meth:`_check_restart`); never when the start-up probe could not read ``INFO`` (ACL).
        """  # noqa: D205
        if self._primaries.run_ids and (self._recheck or time.monotonic() >= self._next_check):
            self._check_restart()

    def _check_restart(self) -> None:
        """Did the primary change (new ``run_id``)? Keep the index when the new one continues its data set.

        A promoted replica continues the old primary's replication history
        (:meth:`~tiering.redis.probe.Primaries.continues`): the index is kept
        (``failovers``). Any other new primary (a restart, empty unless it
        reloaded persisted data) makes the tier forget every known block at
        once (``server_restarts``), so lookups do not answer True and stores
        are not skipped for blocks that are gone; the namespace record is
        written again. Either way a re-scan of the new primary (when
        ``startup_scan`` is on) then forgets the blocks it lacks (writes that
        did not reach the replica) and adopts those it holds. Writes in
        flight are kept (see :meth:`CapacityIndex.reconcile`). One I/O thread
        checks at a time (the others go on with their pipelines), so a change
        is handled and counted once.
        """
        if not self._check_lock.acquire(blocking=False):
            return  # another I/O thread is checking
        try:
            self._next_check = time.monotonic() + RUN_ID_CHECK_S
            with self.index.reading() as ticket:
                try:
                    now = primaries(self._client)
                except Exception:
                    return  # still down (or no primary yet): the batch fails, and the next one asks again
                self._recheck = False
                if not now.run_ids or now.run_ids == self._primaries.run_ids:
                    return
                kept = now.continues(self._primaries)
                self._primaries = now
                vanished = () if kept else self.index.reconcile({}, ticket).vanished
        finally:
            self._check_lock.release()
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
            try:
                self._client.set(self.layout.namespace_key(self.digest), self._namespace_record, nx=True)
            except Exception as exc:
                self._count_error(exc, "writing the namespace record again")
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
                self._count_error(exc, f"removing {len(keys)} gone blocks from the fleet's LRU")

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
                keys: list[OffloadKey] = []
                kwargs: dict[str, Any] = {"match": self.layout.pattern(self.digest), "count": 1000}
                if self._is_cluster:
                    kwargs["target_nodes"] = "primaries"
                for name in self._client.scan_iter(**kwargs):
                    parsed = self.layout.parse(name)
                    if parsed is not None and parsed[1] == "block" and parsed[2] is not None:
                        keys.append(OffloadKey(parsed[2]))
                found: dict[OffloadKey, int] = {}
                for start in range(0, len(keys), 4096):
                    batch = keys[start : start + 4096]
                    for key, flag in zip(batch, self._present(batch, touch=False), strict=True):
                        if flag:
                            found[key] = self.object_bytes
                vanished: tuple[OffloadKey, ...] = ()
                if replace:
                    vanished = self.index.reconcile(found, ticket).vanished
                else:
                    self.index.adopt_many(found.items(), ticket)
            self.lookups.invalidate(vanished)
            self.counters.inc("scanned_blocks", len(found))
            self._delete(self.index.evict_to_cap(), "eviction")
            if self.fleet is not None:
                added, removed = self.fleet.reconcile(found, lambda keys: self._present(keys, touch=False))
                self.counters.inc("fleet_repaired_blocks", added + removed)
                self._fleet_evict(self.fleet.evict_surplus())
            self._trim_known()
        except Exception as exc:
            self._count_error(exc, "the re-scan of a new primary" if replace else "the start-up scan")
        finally:
            self._scan_done.set()

    def _present(self, keys: Sequence[OffloadKey], touch: bool = True) -> list[bool]:
        self._check_server()
        self.counters.inc("pipelines")
        return self._presence(keys, touch)
