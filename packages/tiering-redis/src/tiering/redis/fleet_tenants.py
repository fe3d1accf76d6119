"""Per-tenant quotas of the fleet's shared LRU (``eviction: "tier"`` with ``tenants``): one sorted set per tenant.

Each tenant with a quota has its own sorted set next to the fleet's,
``<prefix>:{<digest>}:lru:t:<tag hex>`` (``-`` for the default tenant): the
same hash tag, so the same cluster slot, and every change to it rides in the
fleet's ``MULTI`` / ``EXEC`` (:meth:`~tiering.redis.fleet.FleetCap.added`).
A store adds its blocks to their tenant's set and trims that set to the
tenant's quota (``quota_bytes // object_bytes`` blocks, least recently used
first) in the same transaction as the fleet's trim: so every process sharing
the namespace enforces one quota per tenant, and each surplus member is
handed to exactly one process. A tenant's TTL is kept the same way
(``ZREMRANGEBYSCORE`` of members stored before the cutoff; the server's
``EX`` removed their blocks already).

The fleet's set and the tenants' sets cannot be trimmed from each other's
results in one transaction without a script, so a second round trip removes
the tenant's surplus (and expired members) from the fleet's set and the
fleet's surplus from the tenants' sets. Between the two, a member can be
counted in one set only: at most one pipeline of blocks per I/O thread, as
for the fleet's own bound.
"""

from __future__ import annotations

import collections
import logging
from binascii import hexlify
from collections.abc import Iterable, Sequence
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.policies.tenancy import TenantPolicy, tag_of

logger = logging.getLogger(__name__)

PendingTrim = list[tuple[bytes, int, int, int, int]]
"""Per tenant trimmed in a transaction: (tag, index of its expired-members reply or -1, of its surplus, of its size)."""


class FleetTenants:
    """The per-tenant sets of one namespace (see the module docstring).

    Args:
        lru_key: the fleet's sorted set (the tenants' sets are named after it).
        object_bytes: bytes of one stored block (header + payload).
        policy: the tier's tenant policy.
    """

    def __init__(self, lru_key: str, object_bytes: int, policy: TenantPolicy) -> None:
        self.lru_key = lru_key
        self.object_bytes = object_bytes
        self.policy = policy
        self.counts: dict[bytes, int] = {}  # tag -> its set's size at the latest trim
        self.quota_evictions: collections.Counter[bytes] = collections.Counter()

    def set_key(self, tag: bytes) -> str:
        """The sorted set of the tenant with tag ``tag``."""
        return f"{self.lru_key}:t:{tag.hex() or '-'}"

    def quota_blocks(self, tag: bytes) -> int | None:
        """The tenant's quota in blocks; None: no quota (no set kept)."""
        quota = self.policy.limits(tag).quota_bytes
        return None if quota is None else quota // self.object_bytes

    def group(self, keys: Iterable[OffloadKey]) -> dict[bytes, list[bytes]]:
        """The members (hex) of ``keys`` per tag of tenants with a quota."""
        out: dict[bytes, list[bytes]] = collections.defaultdict(list)
        for key in keys:
            tag = tag_of(key)
            if self.quota_blocks(tag) is not None:
                out[tag].append(hexlify(key))
        return out

    def queue_trims(self, pipe: Any, keys: Sequence[OffloadKey], now: float) -> PendingTrim:
        """Queue on ``pipe`` (a transaction) the adds and trims of ``keys``' tenants; returns where the replies are."""
        pending: PendingTrim = []
        for tag, members in self.group(keys).items():
            name, blocks = self.set_key(tag), self.quota_blocks(tag)
            assert blocks is not None  # (group keeps tenants with a quota only)
            ttl = self.policy.limits(tag).ttl_s
            expired_at = -1
            if ttl is not None:
                cutoff = f"({now - ttl}"
                expired_at = len(pipe)
                pipe.zrangebyscore(name, "-inf", cutoff)
                pipe.zremrangebyscore(name, "-inf", cutoff)
            pipe.zadd(name, dict.fromkeys(members, now), nx=True)
            surplus_at = len(pipe)
            pipe.zrange(name, 0, -(blocks + 1))
            pipe.zremrangebyrank(name, 0, -(blocks + 1))
            size_at = len(pipe)
            pipe.zcard(name)
            pending.append((tag, expired_at, surplus_at, size_at, blocks))
        return pending

    def settle(
        self, client: Any, replies: list[Any], pending: PendingTrim, fleet_surplus: Sequence[bytes]
    ) -> list[bytes]:
        """After the transaction: the tenants' victims (members), with every set made to agree (one round trip).

        A failed round trip is logged, not raised: the victims were taken out of the sets already and must be
        deleted; a member left behind without its block is repaired by the next start-up scan, as the fleet's own.
        """
        victims: list[bytes] = []
        gone: list[bytes] = []
        for tag, expired_at, surplus_at, size_at, _ in pending:
            surplus = list(replies[surplus_at])
            victims += surplus
            self.quota_evictions[tag] += len(surplus)
            self.counts[tag] = int(replies[size_at])
            if expired_at >= 0:
                gone += replies[expired_at]
        pipe = client.pipeline(transaction=False)
        if victims or gone:
            pipe.zrem(self.lru_key, *victims, *gone)
        for tag, members in self.group(OffloadKey(bytes.fromhex(m.decode())) for m in fleet_surplus).items():
            pipe.zrem(self.set_key(tag), *members)
        try:
            if len(pipe):
                pipe.execute()
        except Exception as exc:  # the victims are taken already: they must still be deleted
            logger.warning("redis tier: the fleet's and the tenants' LRU sets disagree until repaired: %s", exc)
        return victims

    def touch(self, pipe: Any, keys: Sequence[OffloadKey], now: float) -> None:
        """Queue the re-scoring of ``keys`` in their tenants' sets (``ZADD XX GT``)."""
        for tag, members in self.group(keys).items():
            pipe.zadd(self.set_key(tag), dict.fromkeys(members, now), xx=True, gt=True)

    def removed(self, pipe: Any, keys: Iterable[OffloadKey]) -> None:
        """Queue the removal of ``keys`` from their tenants' sets."""
        for tag, members in self.group(keys).items():
            pipe.zrem(self.set_key(tag), *members)

    def repair(self, pipe: Any, missing: Iterable[OffloadKey], stale: Iterable[OffloadKey]) -> None:
        """Queue the repairs of a start-up reconcile: blocks not counted join (score 0), members without a block go."""
        for tag, members in self.group(missing).items():
            pipe.zadd(self.set_key(tag), dict.fromkeys(members, 0), nx=True)
        self.removed(pipe, stale)

    def stats(self) -> dict[str, int]:
        """``tenant:<name>:fleet_used_bytes`` and ``tenant:<name>:fleet_quota_evictions`` per tenant trimmed here."""
        out: dict[str, int] = {}
        for tag in sorted(set(self.counts) | set(self.quota_evictions)):
            name = f"tenant:{self.policy.name(tag)}:"
            out[name + "fleet_used_bytes"] = self.counts.get(tag, 0) * self.object_bytes
            out[name + "fleet_quota_evictions"] = self.quota_evictions[tag]
        return out
