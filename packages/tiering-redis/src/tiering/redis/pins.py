"""Pin records of the redis tier: one sorted set per namespace, each pinned block scored by its pin's expiry.

``<prefix>:{<digest>}:pins`` (:meth:`tiering.redis.layout.KeyLayout.pins_key`)
holds the hex of every pinned block, scored by the pin's expiry (seconds
since the epoch). ``ZADD GT`` makes a renewal extend a pin and never shorten
it; ``ZRANGE`` reads every pin with its expiry in one round trip; members
past their score are ignored and removed by the next refresh of any process
(``ZREM``), and the set itself carries an ``EXPIREAT`` at its latest pin's
expiry, so a fleet that stops pinning leaves nothing behind.

What keeps a pinned block depends on the eviction authority:

- ``eviction: "process"``: each process's index skips pinned blocks
  (:class:`tiering.core.policies.pin_records.PinBook` as its ``keep`` hook);
- ``eviction: "tier"``: a pinned block's member in the fleet's LRU is
  scored at its pin's expiry (``ZADD XX GT``; blocks stored later join at
  that score, :class:`tiering.redis.fleet.FleetCap`), so the atomic trim,
  which takes the lowest scores, reaches it only after every block used
  before that time: before the pin ends, only when pinned blocks alone
  exceed the cap, which ``max_pinned_bytes`` below ``capacity_bytes``
  rules out. Once the pin ends the score is an ordinary last use;
- ``eviction: "server"``: a server that evicts (``allkeys-*``) cannot be
  told to keep a key, so pins are refused; one that does not evict keeps
  every block anyway.

With ``ttl_s``, a pinned block's key also gets ``PEXPIREAT`` its pin's expiry
when that is later (``GT``: never shortened), at the pin and when a pinned
block is stored.
"""

from __future__ import annotations

import math
import time
from binascii import hexlify, unhexlify
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tiering.core.base import OffloadKey


class RedisPins:
    """The :class:`~tiering.core.policies.pin_records.PinMedium` of one redis namespace (see the module docstring).

    Args:
        client: the tier's redis-py client.
        pins_key: the sorted set's name.
        lru_key: the fleet's LRU (``eviction: "tier"``), whose pinned members are scored at their pin's
            expiry; None otherwise.
        block_key: the Redis key of a block (for ``PEXPIREAT`` with ``ttl_s``); None: blocks never expire.

    Every method raises redis-py's errors when the server cannot be asked.
    """

    def __init__(
        self, client: Any, pins_key: str, lru_key: str | None, block_key: Callable[[bytes], str] | None
    ) -> None:
        self.client = client
        self.pins_key = pins_key
        self.lru_key = lru_key
        self.block_key = block_key

    def list_pins(self) -> Iterable[tuple[OffloadKey, float]]:
        """Every member with its score: ``(key, expiry)``; the live ones are kept alive again (:meth:`keep_alive`).

        Asserting the live pins at every refresh covers blocks another process stored after the pin was
        taken, before it knew of it.
        """
        members = self.client.zrange(self.pins_key, 0, -1, withscores=True)
        records = [(OffloadKey(unhexlify(member)), float(score)) for member, score in members]
        now = time.time()
        self.keep_alive({key: expiry for key, expiry in records if expiry > now})
        return records

    def write_pins(self, keys: Sequence[OffloadKey], expiry: float) -> None:
        """``ZADD GT`` the keys at ``expiry``, push the set's own expiry out to it, and keep the blocks."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(self.pins_key, {hexlify(k): expiry for k in keys}, gt=True)
        pipe.expireat(self.pins_key, math.ceil(expiry), gt=True)
        pipe.expireat(self.pins_key, math.ceil(expiry), nx=True)  # GT leaves a set without expiry alone
        pipe.execute()
        self.keep_alive(dict.fromkeys(keys, expiry))

    def keep_alive(self, pins: Mapping[OffloadKey, float]) -> None:
        """Score pinned members of the fleet's LRU at their expiry; with ``ttl_s``, ``PEXPIREAT`` their blocks.

        Both only move forward (``GT``); members and blocks that do not exist are left alone.
        """
        if not pins or (self.lru_key is None and self.block_key is None):
            return
        pipe = self.client.pipeline(transaction=False)
        if self.lru_key is not None:
            pipe.zadd(self.lru_key, {hexlify(k): e for k, e in pins.items()}, xx=True, gt=True)
        if self.block_key is not None:
            for key, expiry in pins.items():
                pipe.pexpireat(self.block_key(key), math.ceil(expiry * 1000), gt=True)
        pipe.execute()

    def remove_pins(self, records: Sequence[tuple[OffloadKey, float]]) -> None:
        """``ZREM`` the records' members unless a later pin of the same key replaced them (same score only)."""
        if not records:
            return
        scores = self.client.zmscore(self.pins_key, [hexlify(k) for k, _ in records])
        gone = [hexlify(k) for (k, e), now in zip(records, scores, strict=True) if now is not None and now <= e]
        if gone:
            self.client.zrem(self.pins_key, *gone)
