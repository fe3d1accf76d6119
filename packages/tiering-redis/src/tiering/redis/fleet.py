"""A fleet-wide cap for ``eviction: "tier"``: every process storing into one namespace shares one LRU on the server.

Design (no Lua, so it works on a single server, Sentinel and Cluster, and
with ACLs that deny scripting):

- one sorted set per namespace, ``<prefix>:{<digest>}:lru`` (the hash tag
  puts it in one cluster slot), holds the hex of every block the fleet's
  tiers stored, scored by the time (seconds, the storing host's clock) it was
  stored or last used. Every block of a namespace has the same size, so the
  fleet's usage is ``ZCARD x (header + block bytes)``: one structure, no
  separate counter that could drift from it;
- after a pipeline of ``SET NX``, the blocks this process wrote first (``OK``
  replies) are added with ``ZADD NX`` and, in the same ``MULTI`` /
  ``EXEC`` transaction, the members beyond ``capacity_bytes`` (lowest scores
  first) are read with ``ZRANGE 0 -(cap+1)`` and removed with
  ``ZREMRANGEBYRANK 0 -(cap+1)``: atomic on the server, so each victim is
  handed to exactly one process and the surplus is taken once, even when
  several processes store at the same moment. The process deletes its
  victims with ``UNLINK`` at once, on the same I/O thread;
- ``touch`` (blocks read by this process's engine) re-scores them with
  ``ZADD XX GT``, batched on an I/O thread, so the order is least recently
  used across the fleet, not per process.

Bound: a block is counted once its ``ZADD`` lands and stops being counted
when taken as a victim, before its ``UNLINK``; so blocks between ``SET NX``
and ``ZADD``, and victims before their ``UNLINK``, exist uncounted.
Each I/O thread has one batch in one of those windows at a time, so the
fleet holds at most ``capacity_bytes`` plus, per process,
``max_connections x pipeline_blocks`` blocks (headers included) in flight.

A process that dies between ``SET NX`` and ``ZADD`` leaves a block not in
the set (not counted, never evicted by the cap), and one that dies between
taking its victims and ``UNLINK`` leaves uncounted blocks too; a block deleted
behind the tier's back (the server's own eviction, a TTL, ``DEL``) leaves a
member without a block (counted, so the fleet holds less). The start-up scan
of every tier (:meth:`FleetCap.reconcile`) repairs both (a failed ``UNLINK``
of a victim leaves an uncounted block the same way): untracked blocks
join with score 0 (evicted first), members without a block are removed; a
load that finds a block missing removes its member at once. Usage figures
(``fleet_used_bytes``) therefore describe blocks that exist, up to those
windows.
"""

from __future__ import annotations

import logging
import threading
import time
from binascii import hexlify, unhexlify
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.policies.tenancy import TenantPolicy
from tiering.redis.fleet_tenants import FleetTenants

logger = logging.getLogger(__name__)


class FleetCap:
    """The shared LRU of one namespace and the cap it enforces (see the module docstring).

    Args:
        client: the tier's redis-py client (standalone, Sentinel primary or cluster).
        lru_key: the sorted set's name (``KeyLayout.lru_key``).
        object_bytes: bytes of one stored block (header + payload).
        capacity_bytes: the fleet's cap for this namespace, bytes (>= one block).
        ttl_s: the blocks' ``EX`` (None: none). Members scored more than
            ``ttl_s`` seconds ago were stored (and last touched) before that,
            so their blocks have expired: each trim removes them first
            (``ZREMRANGEBYSCORE``), so expired blocks do not hold the cap.
        tenants: per-tenant quotas, kept fleet-wide in a sorted set per tenant
            (:mod:`tiering.redis.fleet_tenants`); None: none.

    Raises:
        ValueError: ``capacity_bytes`` is below one block.
    """

    def __init__(
        self,
        client: Any,
        lru_key: str,
        object_bytes: int,
        capacity_bytes: int,
        ttl_s: int | None = None,
        tenants: TenantPolicy | None = None,
    ) -> None:
        if capacity_bytes < object_bytes:
            raise ValueError(f"redis tier: capacity_bytes {capacity_bytes} is below one block ({object_bytes} bytes)")
        self._client = client
        self.lru_key = lru_key
        self.object_bytes = object_bytes
        self.capacity_bytes = capacity_bytes
        self.cap_blocks = capacity_bytes // object_bytes
        self.ttl_s = ttl_s
        self.last_count = 0  # the set's size at the latest round trip (blocks the fleet stored and counts)
        self._lock = threading.Lock()
        self._sent = 0  # round trips that read the set's size, numbered as sent ...
        self._applied = 0  # ... and the number of the one whose size ``last_count`` holds
        self._touched: dict[OffloadKey, None] = {}
        self.tenants = None if tenants is None else FleetTenants(lru_key, object_bytes, tenants)

    @property
    def used_bytes(self) -> int:
        """The fleet's usage as last read: counted blocks x ``object_bytes``."""
        return self.last_count * self.object_bytes

    def added(self, keys: Sequence[OffloadKey]) -> list[OffloadKey]:
        """Count blocks this process stored first; returns the victims it must now delete (may be empty).

        One ``MULTI`` / ``EXEC`` on the set's slot: ``ZADD NX`` the keys,
        ``ZRANGE 0 -(cap+1)`` (the surplus, least recently used first),
        ``ZREMRANGEBYRANK 0 -(cap+1)`` (removes exactly those), ``ZCARD``.
        The transaction is atomic, so two processes never take the same
        victim nor both remove the same surplus: the set holds exactly
        ``capacity_bytes`` worth of members after each.

        Raises:
            redis.exceptions.RedisError: the server could not be asked (the caller counts the error).
        """
        if not keys:
            return []
        now = time.time()
        return self._trim({hexlify(k): now for k in keys}, keys)

    def _trim(self, mapping: dict[bytes, float] | None, keys: Sequence[OffloadKey] = ()) -> list[OffloadKey]:
        stop = -(self.cap_blocks + 1)
        now = time.time()
        pipe = self._client.pipeline(transaction=True)
        # Tenants' quotas first, in the same transaction (each surplus member handed to one process).
        pending = self.tenants.queue_trims(pipe, keys, now) if self.tenants is not None else []
        if self.ttl_s is not None:  # expired for sure (a block's expiry <= its score + ttl_s): not counted
            pipe.zremrangebyscore(self.lru_key, "-inf", f"({now - self.ttl_s}")
        if mapping:
            pipe.zadd(self.lru_key, mapping, nx=True)
        pipe.zrange(self.lru_key, 0, stop)
        pipe.zremrangebyrank(self.lru_key, 0, stop)
        pipe.zcard(self.lru_key)
        replies = self._counted(pipe)
        surplus = list(replies[-3])
        if self.tenants is not None:
            surplus += [m for m in self.tenants.settle(self._client, replies, pending, surplus) if m not in surplus]
        return [OffloadKey(unhexlify(member)) for member in surplus]

    def touch(self, keys: Iterable[OffloadKey]) -> bool:
        """Queue ``keys`` to be re-scored as just used; True when a flush should be scheduled."""
        with self._lock:
            first = not self._touched
            self._touched.update(dict.fromkeys(keys))
            return first and bool(self._touched)

    def flush_touches(self) -> None:
        """Send the queued touches: ``ZADD XX GT`` (only members still counted, only forward in time)."""
        with self._lock:
            keys, self._touched = list(self._touched), {}
        if keys:
            now = time.time()
            pipe = self._client.pipeline(transaction=False)
            pipe.zadd(self.lru_key, {hexlify(k): now for k in keys}, xx=True, gt=True)
            if self.tenants is not None:
                self.tenants.touch(pipe, keys, now)
            pipe.execute()

    def removed(self, keys: Iterable[OffloadKey]) -> None:
        """Blocks known gone (a load found them missing or bad): no longer counted (``ZREM``)."""
        keys = list(keys)
        if keys:
            pipe = self._client.pipeline(transaction=False)
            pipe.zrem(self.lru_key, *(hexlify(k) for k in keys))
            if self.tenants is not None:
                self.tenants.removed(pipe, keys)
            pipe.execute()

    def reconcile(
        self,
        present: Iterable[OffloadKey],
        exists: Callable[[Sequence[OffloadKey]], list[bool]],
        settle_s: float = 0.5,
    ) -> tuple[int, int]:
        """Repair the set from a scan of the namespace's blocks; returns (blocks added, members removed).

        Blocks not in the set join with score 0 (the oldest: evicted first);
        members whose block is not among ``present`` are removed. Other
        processes store and evict while the scan runs (a block between its
        ``SET NX`` and its ``ZADD``, a victim taken but not yet unlinked), so
        both kinds are asked again after ``settle_s`` seconds (``ZMSCORE`` and
        ``exists``, the tier's ``STRLEN`` query) and only those still out of
        line are changed. A surplus is then taken by :meth:`evict_surplus`.
        """
        found = set(present)
        members = {OffloadKey(unhexlify(m)) for m, _score in self._client.zscan_iter(self.lru_key, count=1000)}
        stale, missing = list(members - found), list(found - members)
        if stale or missing:
            time.sleep(settle_s)
            stale = self._still(stale, exists, counted=True, there=False)
            missing = self._still(missing, exists, counted=False, there=True)
        pipe = self._client.pipeline(transaction=False)
        if missing:
            pipe.zadd(self.lru_key, dict.fromkeys((hexlify(k) for k in missing), 0), nx=True)
        if stale:
            pipe.zrem(self.lru_key, *(hexlify(k) for k in stale))
        if self.tenants is not None:
            self.tenants.repair(pipe, missing, stale)
        pipe.zcard(self.lru_key)
        self._counted(pipe)
        return len(missing), len(stale)

    def _counted(self, pipe: Any) -> list[Any]:
        """Run ``pipe`` (ending in ``ZCARD``) and keep its size unless a round trip sent later already answered.

        I/O threads (stores, the start-up scan) read the size concurrently; a
        reply that arrives after a newer one is stale (it was counted before
        that one's ``ZADD``) and must not roll ``last_count`` back.
        """
        with self._lock:
            self._sent += 1
            ticket = self._sent
        replies: list[Any] = pipe.execute()
        with self._lock:
            if ticket > self._applied:
                self._applied, self.last_count = ticket, int(replies[-1])
        return replies

    def _still(
        self, keys: list[OffloadKey], exists: Callable[[Sequence[OffloadKey]], list[bool]], counted: bool, there: bool
    ) -> list[OffloadKey]:
        """The keys whose membership is still ``counted`` and whose block is still ``there``."""
        if not keys:
            return []
        scores = self._client.zmscore(self.lru_key, [hexlify(k) for k in keys])
        keys = [k for k, score in zip(keys, scores, strict=True) if (score is not None) == counted]
        return [k for k, ok in zip(keys, exists(keys), strict=True) if ok == there]

    def evict_surplus(self) -> list[OffloadKey]:
        """Victims beyond the cap right now (taken atomically, as in :meth:`added`), e.g. after :meth:`reconcile`."""
        return self._trim(None)
