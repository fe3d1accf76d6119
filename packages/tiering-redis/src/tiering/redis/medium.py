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
  the store is told (:meth:`~tiering.core.store.IndexedTier.medium_changed`).

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
from tiering.core.format import HEADER_SIZE, BlockFormatError, TruncatedBlockError, encode_header, verify_block
from tiering.core.spec import Namespace
from tiering.core.store import PRESENT, Medium, NotStartedError, ScanResult, WriteOutcome
from tiering.core.toolkit import Counters
from tiering.core.toolkit.pins import PinBook
from tiering.core.toolkit.tenancy import TenantPolicy
from tiering.redis.config import RedisSettings
from tiering.redis.errors import ERROR_CLASSES, RedisStartupError, classify_error
from tiering.redis.fleet import FleetCap
from tiering.redis.layout import KeyLayout
from tiering.redis.pins import RedisPins
from tiering.redis.presence import PresenceQuery
from tiering.redis.probe import PrimaryWatch, probe
from tiering.redis.wire import InSlot, get_many, set_nx_many

logger = logging.getLogger(__name__)

_OTHER_THREADS = 3
"""Threads besides the ``max_connections`` I/O threads that use connections: the scan's and the delete pool's."""

_RECHECK = ("connection", "timeout", "loading", "readonly")
"""Error classes a change of primary explains: the next round trip asks whether it changed."""


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

    delete_threads = _OTHER_THREADS - 1  # deletes never hold up the I/O threads that wait for their room
    counters = ("forgotten_blocks", "fleet_evictions", "scanned_blocks", "fleet_repaired_blocks")
    store_causes = ERROR_CLASSES
    load_causes = ("checksum", "truncated", "foreign", "corrupt", "missing", *ERROR_CLASSES)

    def __init__(
        self, settings: RedisSettings, namespace: Namespace, block_bytes: int, on_change: Callable[[bool], None]
    ) -> None:
        self.settings = settings
        self.layout = KeyLayout(settings["prefix"])
        self.digest, self._digest_bytes = namespace.digest, namespace.digest_bytes
        self.stored_block_bytes = HEADER_SIZE + block_bytes
        self.ttl_s: int | None = settings["ttl_s"]
        self.tenants = TenantPolicy.from_config(settings["tenants"])
        self.label, self.location = "redis tier", settings.location()
        self.is_cluster = settings["mode"] == "cluster"
        self.own = Counters(("pipelines", "failovers", "server_restarts", *(f"errors_{c}" for c in ERROR_CLASSES)))
        self.pins: PinBook | None = None
        try:
            n = settings["max_connections"] + _OTHER_THREADS  # a connection per thread: none waits for another
            self.client: Any = RedisSettings({**settings.values, "max_connections": n}).make_client()
        except Exception as exc:
            raise RedisStartupError(
                f"redis tier: cannot connect to {self.location}: {settings.redact(str(exc))}", classify_error(exc)
            ) from None
        self._record = json.dumps({**namespace.to_dict(), "digest": self.digest}, indent=1, sort_keys=True).encode()
        try:
            self.server = probe(self.client, self.layout, self.digest, self._record, self.location, settings.redact)
        except BaseException:
            self.client.close()
            raise
        self._on_change = on_change
        self.watch = PrimaryWatch(self.client, self.server.identity, self._changed)
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
        self.shared_quotas = self.fleet is not None  # the tenants' quotas are kept fleet-wide, in the fleet's sets
        refuse = eviction == "server" and self.server.server_evicts  # the server's LRU cannot be told to keep a key
        if refuse:  # said wherever the tier names its server: a refused pin's message says why
            self.location += f" (the server evicts any key: {self.server.policy})"
        self._pins = None if refuse else RedisPins(self.client, self.layout.pins_key(self.digest),
                                                   lru_key if self.fleet else None,
                                                   self.block_key if self.ttl_s else None)  # fmt: skip
        server = self.server
        logger.info("%s %s ready (redis %s, %d primaries, maxmemory %d, policy %s), keys %s:*, eviction by %s",
                    self.label, self.location, server.version, server.primaries, server.maxmemory, server.policy,
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
    def write_many(
        self,
        keys: Sequence[OffloadKey],
        block_ids: Sequence[int],
        slot: Callable[[int], memoryview],
        stopping: Callable[[], bool],
    ) -> list[WriteOutcome]:
        """``SET NX`` (``EX``: the block's tenant's TTL, at most ``ttl_s``) of every block, in one pipeline."""
        if stopping():
            return [NotStartedError() for _ in keys]
        views = [slot(b) for b in block_ids]
        headers = [encode_header(self._digest_bytes, key, view) for key, view in zip(keys, views, strict=True)]
        ttls = [self.ttl_s if self.tenants is None else self.tenants.ttl_seconds(k, self.ttl_s) for k in keys]
        try:
            self._round_trip()
            names = [self.block_key(key).encode() for key in keys]
            replies = set_nx_many(self.client, self.is_cluster, names, headers, views, ttls)
        except Exception as exc:
            self.count_error(exc, f"store of {len(keys)} blocks")
            return [exc for _ in keys]
        out: list[WriteOutcome] = []
        for key, reply in zip(keys, replies, strict=True):
            if isinstance(reply, Exception):
                self.count_error(reply, f"SET of block {key.hex()[:16]}")
            out.append(reply if isinstance(reply, Exception) else None if reply else PRESENT)
        return out

    def read_many(
        self, keys: Sequence[OffloadKey], block_ids: Sequence[int], slot: Callable[[int], memoryview]
    ) -> list[BaseException | None]:
        """``GET`` of every block in one pipeline, each value verified (read into its slot, or moved there)."""
        views = [slot(b) for b in block_ids]
        try:
            self._round_trip()
            replies = get_many(self.client, self.is_cluster, [self.block_key(k).encode() for k in keys], views,
                               HEADER_SIZE)  # fmt: skip
        except Exception as exc:
            self.count_error(exc, f"load of {len(keys)} blocks")
            return [exc for _ in keys]
        out: list[BaseException | None] = []
        for key, view, reply in zip(keys, views, replies, strict=True):
            if reply is None:
                out.append(BlockMissingError(self.block_key(key)))
            else:
                out.append(reply if isinstance(reply, Exception) else self._verify_into(key, reply, view))
        return out

    def _verify_into(self, key: OffloadKey, reply: bytes | InSlot, view: memoryview) -> BlockFormatError | None:
        """Verify a ``GET`` reply whose payload is in ``view`` already (or is moved there once verified)."""
        try:
            if isinstance(reply, InSlot):
                header, payload, stored = memoryview(reply.header), view, self.stored_block_bytes
            else:
                value = memoryview(reply)
                if value.nbytes != self.stored_block_bytes:
                    raise TruncatedBlockError(f"value is {value.nbytes} bytes, expected {self.stored_block_bytes}")
                header, payload, stored = value[:HEADER_SIZE], value[HEADER_SIZE:], value.nbytes
            verify_block(header, payload, self._digest_bytes, key, stored_size=stored)
        except BlockFormatError as exc:
            return exc
        if not isinstance(reply, InSlot):
            view[:] = payload
        return None

    def size(self, key: OffloadKey) -> int | None:
        """The value's size (``STRLEN``; an access for the server's LRU); None when absent."""
        return self.sizes([key])[0]

    def sizes(self, keys: Sequence[OffloadKey]) -> list[int | None]:
        """:meth:`size` of each key, one packed request per node (:class:`~tiering.redis.presence.PresenceQuery`)."""
        try:
            self._round_trip()
            replies = self._presence.ask(keys, b"STRLEN")
        except Exception as exc:
            self.count_error(exc, f"lookup of {len(keys)} keys")
            raise
        return [r if isinstance(r, int) and r > 0 else None for r in replies]  # an error reply reads as absent

    def remove(self, key: OffloadKey) -> bool:
        """``UNLINK`` of one block (see :meth:`remove_many`)."""
        return self.remove_many([key])[0]

    def remove_many(self, keys: Sequence[OffloadKey]) -> list[bool]:
        """``UNLINK`` of every key in one pipeline; True per key answered (a key already gone counts)."""
        try:
            pipe = self.pipeline()
            for key in keys:
                pipe.unlink(self.block_key(key))
            replies = pipe.execute(raise_on_error=False)
        except Exception as exc:
            self.count_error(exc, f"UNLINK of {len(keys)} blocks")
            return [False for _ in keys]
        return [not isinstance(r, Exception) for r in replies]

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
            if self.fleet is not None:
                added, removed = self.fleet.reconcile(found, self._exists)
                victims = set(self.fleet.evict_surplus())
                self.remove_many(list(victims))
                found = [k for k in found if k not in victims]
                counters |= {"fleet_repaired_blocks": added + removed, "fleet_evictions": len(victims)}
        except Exception as exc:
            self.count_error(exc, "the scan")
            raise
        now = time.time()
        return ScanResult({k: (self.stored_block_bytes, now) for k in found}, counters=counters)

    def _exists(self, keys: Sequence[OffloadKey]) -> list[bool]:
        self._round_trip()
        return self._presence(keys, touch=False)

    # -- namespace, pins, the fleet's cap --------------------------------------------------------------
    def write_namespace_record(self, record: Mapping[str, Any]) -> None:
        """``SET NX`` of the namespace record (also after a restart emptied the server); a failure is counted."""
        try:
            self.client.set(self.layout.namespace_key(self.digest), self._record, nx=True)
        except Exception as exc:
            self.count_error(exc, "writing the namespace record")

    def pin_records(self) -> RedisPins | None:
        """The namespace's pin set; None when the server evicts any key (it cannot be told to keep one)."""
        return self._pins

    def stored(self, keys: Sequence[OffloadKey]) -> Sequence[OffloadKey]:
        """Blocks this process stored first: pinned ones keep their pin's expiry; the fleet's LRU counts the rest.

        Returns:
            The victims the fleet's cap handed this process (taken atomically: no other process deletes them).
        """
        pinned = {k: e for k in keys if self.pins is not None and (e := self.pins.expiry(k)) is not None}
        victims: Sequence[OffloadKey] = ()
        try:
            if self.fleet is not None:
                victims = self.fleet.added(keys)
            if pinned and self._pins is not None:
                self._pins.keep_alive(pinned)  # (a failure: the next refresh of the pins asserts them again)
        except Exception as exc:
            self.count_error(exc, f"counting {len(keys)} stored blocks in the fleet's LRU or pins")
        return victims

    def touched(self, keys: Sequence[OffloadKey]) -> bool:
        """With the fleet's LRU: queue ``keys`` to be re-scored as used (sent by :meth:`flush`)."""
        return self.fleet is not None and self.fleet.touch(keys)

    def flush(self) -> None:
        """Send the touches queued by :meth:`touched` to the fleet's LRU (on an I/O thread)."""
        try:
            if self.fleet is not None:
                self.fleet.flush_touches()
        except Exception as exc:
            self.count_error(exc, "touching blocks in the fleet's LRU")

    def gone(self, keys: Sequence[OffloadKey]) -> None:
        """Blocks known gone (missing, bad, deleted): no longer counted by the fleet's LRU."""
        try:
            if self.fleet is not None and keys:
                self.fleet.removed(keys)
        except Exception as exc:
            self.count_error(exc, f"removing {len(keys)} gone blocks from the fleet's LRU")

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
        out: dict[str, int | float] = dict(self.own.snapshot())
        out |= {"server_maxmemory_bytes": self.server.maxmemory, "server_evicts": int(self.server.server_evicts)}
        if self.fleet is not None:
            out |= {"fleet_capacity_bytes": self.fleet.capacity_bytes, "fleet_used_bytes": self.fleet.used_bytes}
            if self.fleet.tenants is not None:
                out |= self.fleet.tenants.stats()
        return out

    def count_error(self, exc: BaseException, what: str) -> str:
        """Count and log a failed request (no credential in the log); returns its class."""
        cause = classify_error(exc)
        if cause in _RECHECK:
            self.watch.suspect()
        self.own.inc(f"errors_{cause}")
        text = self.settings.redact(f"{type(exc).__name__}: {exc}")
        log = logger.error if cause == "other" else logger.warning
        log("%s %s: %s failed (%s): %s", self.label, self.location, what, cause, text)
        return cause

    def pipeline(self) -> Any:
        """A pipeline of the client (``transaction=False``), counted, the primary checked first."""
        self._round_trip()
        return self.client.pipeline(transaction=False)

    def _round_trip(self) -> None:
        self.own.inc("pipelines")
        self.watch.check()

    def _changed(self, kept: bool) -> None:
        """The primary changed: the store forgets (a restart) or keeps what it knew (a failover), then rescans."""
        self._on_change(kept)
        self.own.inc("failovers" if kept else "server_restarts")  # after the store's reaction: whoever sees it waits
        if kept:
            logger.warning("redis tier: %s failed over (new run_id) to a replica of the old primary; keeping the "
                           "known blocks", self.location)  # fmt: skip
        else:
            logger.warning("redis tier: %s restarted (new run_id, a new data set); forgot the blocks it may no "
                           "longer hold", self.location)  # fmt: skip
            self.write_namespace_record({})

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()
