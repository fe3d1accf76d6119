"""The redis medium: what only a Redis server does with blocks, one round trip per batch.

:class:`RedisMedium` is the :class:`~tiering.core.store.Medium` of the redis
tier: ``SET NX`` of many blocks straight from their primary slots (the first
writer of a block wins; its bytes are never rewritten), pipelined ``GET``
verified into the slots, ``STRLEN`` sizes of many keys for lookups
(:mod:`tiering.redis.presence`), ``UNLINK`` of many, ``SCAN`` of the
namespace and its record. The pipelines are :mod:`tiering.redis.wire`'s.

Its hooks are what a shared server adds:

- the server may evict (``eviction: "server"``, ``allkeys-lru``) or the
  fleet's shared LRU does (``eviction: "tier"``, :mod:`tiering.redis.fleet`):
  then the medium evicts on its own and the store forgets instead of
  deleting; the fleet hands each process its victims after its stores;
- a change of primary (:class:`~tiering.redis.probe.PrimaryWatch`, asked
  before round trips): a restart loses the data set, a failover keeps it;
  the store is told (:meth:`~tiering.core.store.IndexedTier.reset`).

Errors are redis-py's, after its own retries: each is counted as
``errors_<class>`` and becomes the block's failure cause
(:func:`~tiering.redis.errors.classify_error`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.format import HEADER_SIZE, BlockFormatError, encode_header
from tiering.core.policies.pin_records import PinBook
from tiering.core.policies.tenancy import TenantPolicy
from tiering.core.spec import Namespace
from tiering.core.store import PRESENT, Medium, NotStartedError, ScanResult, WriteOutcome
from tiering.redis.config import RedisSettings
from tiering.redis.connection import ServerConnection
from tiering.redis.errors import ERROR_CLASSES, classify_error
from tiering.redis.fleet import FleetCap
from tiering.redis.layout import KeyLayout
from tiering.redis.pins import RedisPins
from tiering.redis.presence import PresenceQuery
from tiering.redis.wire import get_many, set_nx_many, verify_into

logger = logging.getLogger(__name__)

_DELETE_THREADS = 2
"""Threads of the store's delete pool: deletes never hold up the I/O threads that wait for their room."""


class BlockMissingError(FileNotFoundError):
    """A ``GET`` found no value: the block was evicted by the server, expired or deleted."""


class RedisMedium(Medium):
    """The blocks of one namespace on a Redis server, Cluster or Sentinel-managed primary (see the module doc).

    Args:
        settings: the validated entry.
        namespace: the stack's namespace (its digest names the keys).
        block_bytes: bytes of one block's payload.
        on_change: the store's hook for a change of primary (``on_change(kept)``).

    Attributes:
        server: what the start-up probe learnt (``maxmemory``, policy, primaries).
        fleet: the fleet's shared LRU (``eviction: "tier"``), else None.
        pins: the store's pin book (:meth:`attach`): blocks stored while pinned get their pin's expiry.

    Raises:
        RedisStartupError: the server is unreachable, refuses the credentials or the probe failed.
    """

    label = "redis tier"
    delete_threads = _DELETE_THREADS
    counters = ("forgotten_blocks", "fleet_evictions", "scanned_blocks", "fleet_repaired_blocks")
    store_causes = ERROR_CLASSES
    load_causes = ("checksum", "truncated", "foreign", "corrupt", "missing", *ERROR_CLASSES)

    def __init__(
        self, settings: RedisSettings, namespace: Namespace, block_bytes: int, on_change: Callable[[bool], None]
    ) -> None:
        self.layout = KeyLayout(settings["prefix"])
        self.digest, self._digest_bytes = namespace.digest, namespace.digest_bytes
        self.stored_block_bytes = HEADER_SIZE + block_bytes
        self.ttl_s: int | None = settings["ttl_s"]
        self.tenants = TenantPolicy.from_config(settings["tenants"])
        self.is_cluster = settings["mode"] == "cluster"
        self.pins: PinBook | None = None
        record = json.dumps({**namespace.to_dict(), "digest": self.digest}, indent=1, sort_keys=True).encode()
        self.conn = ServerConnection(settings, self.layout, self.digest, record, _DELETE_THREADS + 1, on_change)
        self.client, self.server, self.location = self.conn.client, self.conn.info, self.conn.location
        self._presence = PresenceQuery(self.client, self.layout.base(self.digest) + ":", self.stored_block_bytes,
                                       self.is_cluster)  # fmt: skip
        self._open_eviction(settings["eviction"], settings["capacity_bytes"])

    def _open_eviction(self, eviction: str, capacity: int | None) -> None:
        """Who evicts: this process (``"process"``), the fleet's LRU (``"tier"``) or the server; pins accordingly."""
        fleet_cap = capacity if eviction == "tier" else None
        self.server.warn_eviction_authority(self.location, capacity, bool(self.ttl_s))
        lru_key = self.layout.lru_key(self.digest)
        self.fleet = FleetCap(self.client, lru_key, self.stored_block_bytes, fleet_cap, self.ttl_s, self.tenants) \
            if fleet_cap else None  # fmt: skip
        self.server_evicts = eviction != "process"  # the store forgets entries beyond known_limit_bytes instead
        self.known_limit_bytes = (fleet_cap or max(self.server.maxmemory, 0)) if self.server_evicts else 0
        refuse = eviction == "server" and self.server.server_evicts  # the server's LRU cannot be told to keep a key
        if refuse:  # said wherever the tier names its server: a refused pin's message says why
            self.location += f" (the server evicts any key: {self.server.policy})"
        self._pins = None if refuse else RedisPins(self.client, self.layout.pins_key(self.digest),
                                                   lru_key if self.fleet else None,
                                                   self.block_key if self.ttl_s else None)  # fmt: skip
        info = self.server
        logger.info("redis tier %s ready (redis %s, %d primaries, maxmemory %d, policy %s), keys %s:*, eviction by "
                    "%s", self.location, info.version, info.primaries, info.maxmemory, info.policy,
                    self.layout.base(self.digest), eviction)  # fmt: skip

    def attach(self, pins: PinBook, tenants: TenantPolicy | None) -> None:
        """The store's pin book and tenant policy (the tenants' names its requests noted) replace the medium's own."""
        self.pins, self.tenants = pins, tenants
        if self.fleet is not None and self.fleet.tenants is not None and tenants is not None:
            self.fleet.tenants.policy = tenants

    def block_key(self, key: bytes) -> str:
        """The Redis key of block ``key``."""
        return self.layout.block_key(self.digest, key)

    # -- block I/O ----------------------------------------------------------------------------
    def write_many(self, keys: Sequence[OffloadKey], block_ids: Sequence[int], slot: Callable[[int], memoryview],
                   stopping: Callable[[], bool]) -> list[WriteOutcome]:  # fmt: skip
        """``SET NX`` (``EX``: the block's tenant's TTL, at most ``ttl_s``) of every block, in one pipeline."""
        if stopping():
            return [NotStartedError() for _ in keys]
        views = [slot(b) for b in block_ids]
        digest = self._digest_bytes
        ttls = [self.ttl_s if self.tenants is None else self.tenants.ttl_seconds(k, self.ttl_s) for k in keys]
        try:
            self.conn.round_trip()
            names = [self.block_key(key).encode() for key in keys]
            # Each header (the payload's checksum) is computed as its block is sent: the first block goes out
            # at once rather than after every block of the share was hashed.
            replies = set_nx_many(self.client, self.is_cluster, names, lambda i: encode_header(digest, keys[i],
                                  views[i]), views, ttls)  # fmt: skip
        except Exception as exc:
            self.conn.count_error(exc, f"store of {len(keys)} blocks")
            return [exc for _ in keys]
        for key, reply in zip(keys, replies, strict=True):
            if isinstance(reply, Exception):
                self.conn.count_error(reply, f"SET of block {key.hex()[:16]}")
        return [r if isinstance(r, Exception) else None if r else PRESENT for r in replies]

    def read_many(
        self, keys: Sequence[OffloadKey], block_ids: Sequence[int], slot: Callable[[int], memoryview]
    ) -> list[BaseException | None]:
        """``GET`` of every block in one pipeline, each value verified (read into its slot, or moved there)."""
        views = [slot(b) for b in block_ids]
        try:
            self.conn.round_trip()
            names = [self.block_key(k).encode() for k in keys]
            replies = get_many(self.client, self.is_cluster, names, views, HEADER_SIZE)
        except Exception as exc:
            self.conn.count_error(exc, f"load of {len(keys)} blocks")
            return [exc for _ in keys]
        return [
            BlockMissingError(name.decode()) if reply is None else reply if isinstance(reply, Exception)
            else verify_into(reply, view, self._digest_bytes, key, self.stored_block_bytes)
            for key, name, view, reply in zip(keys, names, views, replies, strict=True)
        ]  # fmt: skip

    def size(self, key: OffloadKey) -> int | None:
        """The value's size (``STRLEN``; an access for the server's LRU); None when absent."""
        return self.sizes([key])[0]

    def sizes(self, keys: Sequence[OffloadKey]) -> list[int | None]:
        """:meth:`size` of each key, one packed request per node (:class:`~tiering.redis.presence.PresenceQuery`)."""
        try:
            self.conn.round_trip()
            replies = self._presence.ask(keys, b"STRLEN")
        except Exception as exc:
            self.conn.count_error(exc, f"lookup of {len(keys)} keys")
            raise
        return [r if isinstance(r, int) and r > 0 else None for r in replies]  # an error reply reads as absent

    def remove(self, key: OffloadKey) -> bool:
        """``UNLINK`` of one block (see :meth:`remove_many`)."""
        return self.remove_many([key])[0]

    def remove_many(self, keys: Sequence[OffloadKey]) -> list[bool]:
        """``UNLINK`` of every key in one pipeline; True per key answered (a key already gone counts)."""
        pipe = self.conn.pipeline()
        for key in keys:
            pipe.unlink(self.block_key(key))
        replies = self.conn.guarded(f"UNLINK of {len(keys)} blocks", lambda: pipe.execute(raise_on_error=False))
        return [False for _ in keys] if replies is None else [not isinstance(r, Exception) for r in replies]

    def scan(self, stopping: Callable[[], bool]) -> ScanResult:
        """The namespace's blocks (``SCAN`` + ``EXISTS``: no access); with the fleet's LRU, repaired and trimmed.

        A block's store time is unknown to the server: the scan's time stands for it (its ``EX`` bounds it).
        """
        kwargs: dict[str, Any] = {"match": self.layout.pattern(self.digest), "count": 1000}
        if self.is_cluster:
            kwargs["target_nodes"] = "primaries"
        try:
            names = [self.layout.parse(name) for name in self.client.scan_iter(**kwargs)]
            keys = [OffloadKey(p[2]) for p in names if p is not None and p[1] == "block" and p[2] is not None]
            batches = [keys[i : i + 4096] for i in range(0, len(keys), 4096)]
            found = [k for batch in batches for k, there in zip(batch, self._exists(batch), strict=True) if there]
            counters = {"scanned_blocks": len(found)}
            if self.fleet is not None and not self.read_only:  # an inspection repairs and trims nothing
                added, removed = self.fleet.reconcile(found, self._exists)
                victims = set(self.fleet.evict_surplus())
                self.remove_many(list(victims))
                found = [k for k in found if k not in victims]
                counters |= {"fleet_repaired_blocks": added + removed, "fleet_evictions": len(victims)}
        except Exception as exc:
            self.conn.count_error(exc, "the scan")
            raise
        now = time.time()
        return ScanResult({k: (self.stored_block_bytes, now) for k in found}, counters=counters)

    def _exists(self, keys: Sequence[OffloadKey]) -> list[bool]:
        self.conn.round_trip()
        return self._presence(keys, touch=False)

    # -- namespace, pins, the fleet's cap --------------------------------------------------------------
    def write_namespace_record(self, record: Mapping[str, Any]) -> None:
        """``SET NX`` of the namespace record (the start-up probe wrote it already; a failure is counted)."""
        self.conn.write_record()

    def pin_records(self) -> RedisPins | None:
        """The namespace's pin set; None when the server evicts any key (it cannot be told to keep one)."""
        return self._pins

    def stored(self, keys: Sequence[OffloadKey]) -> Sequence[OffloadKey]:
        """Blocks this process stored first: pinned ones keep their pin's expiry; the fleet's LRU counts the rest.

        Returns:
            The victims the fleet's cap handed this process (taken atomically: no other process deletes them).
        """
        pinned = {k: e for k in keys if self.pins is not None and (e := self.pins.expiry(k)) is not None}
        if pinned and (records := self._pins) is not None:  # a failure: the next refresh of the pins asserts them
            self.conn.guarded(f"keeping {len(pinned)} pinned blocks", lambda: records.keep_alive(pinned))
        if (fleet := self.fleet) is None:
            return ()
        return self.conn.guarded(f"counting {len(keys)} blocks in the fleet's LRU", lambda: fleet.added(keys)) or ()

    def touched(self, keys: Sequence[OffloadKey]) -> bool:
        """With the fleet's LRU: queue ``keys`` to be re-scored as used (sent by :meth:`flush`)."""
        return self.fleet is not None and self.fleet.touch(keys)

    def flush(self) -> None:
        """Send the touches queued by :meth:`touched` to the fleet's LRU (on an I/O thread)."""
        if (fleet := self.fleet) is not None:
            self.conn.guarded("touching blocks in the fleet's LRU", fleet.flush_touches)

    def gone(self, keys: Sequence[OffloadKey]) -> None:
        """Blocks known gone (missing, bad, deleted): no longer counted by the fleet's LRU."""
        if (fleet := self.fleet) is not None and keys:
            self.conn.guarded(f"removing {len(keys)} gone blocks from the fleet's LRU", lambda: fleet.removed(keys))

    # -- reporting, errors, shutdown ---------------------------------------------------------------------
    def failure_cause(self, exc: BaseException, *, load: bool, in_index: bool = False) -> str:
        """``missing`` for a block not there (evicted, expired or deleted), a redis error's class, else the store's."""
        if isinstance(exc, BlockMissingError):
            return "missing"
        if isinstance(exc, (NotStartedError, BlockFormatError)):
            return super().failure_cause(exc, load=load, in_index=in_index)
        return classify_error(exc)

    def stats(self) -> dict[str, int | float]:
        """``pipelines``, ``failovers``, ``server_restarts``, ``errors_<class>``; the server's and fleet's figures."""
        out: dict[str, int | float] = dict(self.conn.counters.snapshot())
        out |= {"server_maxmemory_bytes": self.server.maxmemory, "server_evicts": int(self.server.server_evicts)}
        if self.fleet is not None:
            out |= {"fleet_capacity_bytes": self.fleet.capacity_bytes, "fleet_used_bytes": self.fleet.used_bytes}
            if self.fleet.tenants is not None:
                out |= self.fleet.tenants.stats()
        return out

    def close(self) -> None:
        """Close the client's connections."""
        self.conn.close()
