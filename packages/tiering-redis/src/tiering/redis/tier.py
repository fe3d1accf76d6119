"""A Redis secondary tier on redis-py: one key per block, shared by every engine replica that uses the server.

Keys (see :mod:`tiering.redis.layout`): ``<prefix>:<namespace digest>:<key hex>``
holds :func:`tiering.core.format.encode_header` + the block's bytes, verified
with :func:`tiering.core.format.verify_block` on every load; a block that does
not verify is a miss, is deleted and counted by cause.

The machinery is the toolkit's (:mod:`tiering.core.toolkit`): job tracking
(:class:`~tiering.core.toolkit.JobTracker`), the index of blocks this process
knows (:class:`~tiering.core.toolkit.CapacityIndex`, capped only with
``eviction: "process"``; ``eviction: "tier"`` is the fleet's shared LRU,
:mod:`tiering.redis.fleet`), lookups resolved in batches in the background
(:class:`~tiering.core.toolkit.LookupCache`: one packed ``STRLEN`` request
per node and batch, :mod:`tiering.redis.presence`; None while in flight) and the I/O threads
(:class:`~tiering.core.toolkit.IOPool`, one per connection). What is Redis's
own is here: a job's blocks go out as pipelines of ``pipeline_blocks`` blocks
(redis-py's cluster pipeline splits each per node), stores are ``SET NX`` (the
first writer of a block wins; its bytes are never rewritten), loads are
pipelined ``GET`` whose reply moves into the primary slot after verification.

Nothing on the scheduler's thread touches the network: ``lookup``,
``submit_*``, ``get_finished`` and ``touch`` only update memory. Connection
errors, timeouts, ``READONLY``, ``OOM``, ``LOADING`` and cluster redirections
that redis-py's own retries (:class:`redis.retry.Retry`) do not absorb become
failed blocks (a failed job, a miss) within the bounded time set by
``socket_timeout_s``, ``socket_connect_timeout_s``, ``retries`` and the
backoff; the client reconnects by itself when the server is back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from tiering.core.base import JobMetadata, OffloadKey, ReqContext, SecondaryTierManager
from tiering.core.format import HEADER_SIZE
from tiering.core.inspection import TierInspector
from tiering.core.spec import OffloadingSpec
from tiering.core.toolkit import (
    Admit,
    CapacityIndex,
    Counters,
    IOPool,
    JobReporting,
    JobTracker,
    KeyState,
    KVEventLog,
    LookupCache,
    Victim,
)
from tiering.core.toolkit.config import ConfigSchema, InvalidValueError
from tiering.core.toolkit.pins import PinBook, PinningTier
from tiering.core.toolkit.stats import failure_totals
from tiering.core.toolkit.tenancy import TenantPolicy, note_tenant
from tiering.redis.config import SCHEMA, RedisSettings
from tiering.redis.fleet import FleetCap
from tiering.redis.io import RedisBlockIO, Task
from tiering.redis.medium import RedisMedium
from tiering.redis.pins import RedisPins

logger = logging.getLogger(__name__)

_COUNTERS = (
    "lookups_hit",
    "lookups_miss",
    "lookups_pending",
    "blocks_stored",
    "bytes_stored",
    "stores_already_present",
    "blocks_loaded",
    "bytes_loaded",
    "bad_blocks_removed",
    "server_restarts",
    "failovers",
    "scanned_blocks",
    "forgotten_blocks",
    "fleet_evictions",
    "fleet_repaired_blocks",
)


class RedisSecondaryTierManager(PinningTier, JobReporting, RedisBlockIO, SecondaryTierManager):
    """A secondary tier keeping blocks as keys of a Redis server, Cluster or Sentinel-managed primary.

    Config (the ``secondary_tiers`` entry): ``{"type": "redis", "url":
    "redis://host:6379/0", ...}``; every key is in :data:`tiering.redis.config.SCHEMA`
    and the package README.

    Args:
        offloading_spec: the stack's spec (block geometry, namespace).
        primary_kv_view: the primary tier's ``(num_blocks, block_bytes)`` host buffer.
        tier_type: the registered name (injected by the factory).
        **config: the entry's keys (see :data:`~tiering.redis.config.SCHEMA`).

    Raises:
        tiering.core.toolkit.TierConfigError: a wrong, missing or unknown key (names it).
        RedisStartupError: the server is unreachable, refuses the credentials or the probe failed.
    """

    medium: ClassVar[str] = "memory"
    config_schema: ClassVar[ConfigSchema | None] = SCHEMA

    def __init__(
        self, offloading_spec: OffloadingSpec, primary_kv_view: memoryview, tier_type: str, **config: Any
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        self.settings = settings = RedisSettings.from_config(config)
        self.object_bytes = HEADER_SIZE + self.block_bytes
        eviction = settings["eviction"]
        fleet_cap = settings["capacity_bytes"] if eviction == "tier" else None
        capacity = settings["capacity_bytes"] if eviction == "process" else None
        if settings["capacity_bytes"] is not None and settings["capacity_bytes"] < self.object_bytes:
            raise InvalidValueError(
                tier_type, "capacity_bytes", f"must be >= one block ({self.object_bytes} bytes with its header), "
                f"got {settings['capacity_bytes']}",
            )  # fmt: skip
        self.tenants = TenantPolicy.from_config(settings["tenants"])
        self.medium_io = medium = RedisMedium(settings, offloading_spec.namespace, self.block_bytes, self.tenants)
        medium.on_change = self._primary_changed
        self.layout, self.digest, self.location, self.server = (
            medium.layout,
            medium.digest,
            medium.location,
            medium.server,
        )
        self._client = medium.client
        self.server.warn_eviction_authority(self.location, capacity or fleet_cap, bool(settings["ttl_s"]))
        self.fleet = (
            FleetCap(
                self._client, self.layout.lru_key(self.digest), self.object_bytes, fleet_cap, settings["ttl_s"],
                self.tenants,
            )
            if fleet_cap
            else None
        )  # fmt: skip
        self._closed = False
        self._close_lock = threading.Lock()
        self._scan_done = threading.Event()
        # With the server as eviction authority the index only remembers what is stored, bounded by what the
        # server can hold (its maxmemory): beyond that the least recently used entries are forgotten, not deleted.
        # With eviction "tier" the fleet's LRU evicts; the index forgets beyond the fleet's cap the same way.
        self._forget_only = capacity is None
        self._known_limit = fleet_cap or (
            self.server.maxmemory if self._forget_only and self.server.maxmemory > 0 else 0
        )
        # With the fleet's LRU the tenants' quotas are kept fleet-wide on the server; the index keeps their TTLs.
        index_tenants = self.tenants.without_quotas() if self.tenants and fleet_cap else self.tenants
        self.index = CapacityIndex(capacity, index_tenants)
        refuse = eviction == "server" and self.server.server_evicts  # the server's LRU cannot be told to keep a key
        self.pin_records = None if refuse else RedisPins(
            self._client, self.layout.pins_key(self.digest), self.fleet.lru_key if self.fleet else None,
            self.block_key if settings["ttl_s"] else None,
        )  # fmt: skip
        label = f"redis tier {self.location}" + (
            f" (the server evicts any key: {self.server.policy})" if refuse else ""
        )
        self.pins = PinBook(self.pin_records, settings["max_pinned_bytes"], self.object_bytes, label)
        self.index.keep = self.pins.protects
        self.pins.refresh()  # before the start-up scan evicts down to the cap
        self.jobs = JobTracker()
        self.events = KVEventLog(self.medium, tier=self.tier_type, locality="fleet" if eviction == "tier" else "remote")
        self.index.attach_events(self.events)
        self.counters = Counters(_COUNTERS)
        n = settings["max_connections"]
        self.pool = IOPool(
            n, 0, name=f"tiering-{tier_type}", max_batch=settings["pipeline_blocks"],
            reader_help_batch=settings["pipeline_blocks"],
        )  # fmt: skip
        self.lookups = LookupCache(
            self._resolve,
            lambda fn: self.pool.submit_call("read", fn),
            negative_ttl_s=settings["lookup_negative_ttl_s"],
            max_batch=1024,  # resolved while the scheduler still asks; the rest right after its round
            max_pending=65536,
            gather_s=0.001,  # a scheduler step's lookups (a few microseconds apart) gather into full batches
            parallel=1,
        )
        if settings["startup_scan"]:
            self.pool.submit_call("read", self._scan)
        else:
            self._scan_done.set()
        logger.info(
            "redis tier %r ready: %s (redis %s, %d primaries, maxmemory %d, policy %s), keys %s:*, eviction by %s",
            tier_type,
            self.location,
            self.server.version,
            self.server.primaries,
            self.server.maxmemory,
            self.server.policy,
            self.layout.base(self.digest),
            f"this tier ({capacity} bytes per process)"
            if capacity
            else f"the fleet's shared LRU ({fleet_cap} bytes)"
            if fleet_cap
            else "the server",
        )

    @classmethod
    def inspector(cls, tier_config: Mapping[str, Any]) -> TierInspector | None:
        """A :class:`~tiering.redis.inspection.RedisInspector` of a config entry (``tiering ls/stat/gc/verify``)."""
        from tiering.redis.inspection import RedisInspector

        return RedisInspector.from_config(tier_config)

    def block_key(self, key: bytes) -> str:
        """The Redis key of block ``key``."""
        return self.medium_io.block_key(key)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(location={self.location!r}, prefix={self.layout.prefix!r}, "
            f"eviction={self.settings['eviction']!r}, capacity_bytes={self.index.capacity_bytes!r})"
        )

    # -- lookups ------------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """Whether ``key`` is stored, without blocking.

        Returns:
            True: this process stored, loaded or found the block. False: absent
            (or being deleted, or the tier is shut down). None: a store of it
            is in flight here, or the server is being asked (a pipelined
            ``STRLEN`` of every key asked since the last batch); ask again.
        """
        if self._closed:
            return False
        state = self.index.lookup(key)
        if state is KeyState.RESIDENT:
            verdict: bool | None = True
        elif state is KeyState.WRITING:
            verdict = None
        elif state is KeyState.DELETING:
            self._delete(self.index.take_expired(), "expired")  # past its tenant's TTL (the server's EX removed it)
            verdict = False
        else:
            verdict = self.lookups.lookup(key)
        self.counters.inc("lookups_hit" if verdict else "lookups_pending" if verdict is None else "lookups_miss")
        return verdict

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` most recently used (the eviction order; with ``eviction: "tier"`` the fleet's, sent later)."""
        self.index.touch(keys)
        if self.fleet is not None and self.fleet.touch(keys):
            self.pool.submit_call("write", self.flush_touches)

    # -- stores -------------------------------------------------------------------
    def submit_store(self, job: JobMetadata) -> None:
        """Queue the job's blocks as pipelined ``SET NX`` (``EX ttl_s`` when set); return at once.

        A block this process knows is stored counts as stored without I/O; a
        ``SET NX`` refused because another writer stored the key first counts as
        stored (``stores_already_present``). With ``eviction: "process"``, least
        recently used blocks are deleted to make room; a block that cannot fit
        fails with cause ``no_space``. With ``eviction: "tier"`` the blocks
        stored first here join the fleet's LRU after their ``SET NX``, and the
        victims beyond the fleet's cap it hands this process are deleted.
        """
        note_tenant(self.tenants, job.req_context.tenant)  # its keys carry only its tag: its name for stats
        state = self.jobs.start(job)
        now: list[tuple[int, bool, str]] = []
        tasks: list[Task] = []
        victims: list[Victim] = []
        for i, key in enumerate(job.keys):
            if self._closed:
                now.append((i, False, "shutdown"))
                continue
            reservation = self.index.reserve(key, self.object_bytes)
            victims.extend(reservation.victims)
            if reservation.admit is Admit.RESERVED:
                tasks.append((state, i))
            elif reservation.admit is Admit.PRESENT:
                self.counters.inc("stores_already_present")
                now.append((i, True, ""))
            else:
                now.append((i, False, "no_space" if reservation.admit is Admit.NO_SPACE else "deleting"))
        self._delete(victims, "eviction")
        if now:
            state.record(now)
        self.pool.submit("write", self._store_batch, tasks, self._tasks_failed, merge=True)
        self.pins.refresh_soon(self.pool.submit_call)  # other processes' pins, read again now and then

    # -- loads --------------------------------------------------------------------
    def submit_load(self, job: JobMetadata) -> None:
        """Queue the job's blocks as pipelined ``GET``; each reply is verified before it reaches its slot.

        A missing block (evicted by the server, expired, deleted) fails the job
        as a miss; a block that does not verify is deleted and counted by cause.
        """
        state = self.jobs.start(job)
        if self._closed:
            state.fail_rest("shutdown")
            return
        tasks = [(state, i) for i in range(len(job.keys))]
        self.pool.submit("read", self._load_batch, tasks, self._tasks_failed, merge=True)  # pipelines join across jobs

    def wait_for_scan(self, timeout_s: float | None = None) -> bool:
        """Wait until the latest scan (at start-up, or after a change of primary) has finished; False on timeout.

        ``tiering stat`` calls it.
        """
        return self._scan_done.wait(timeout_s)

    # -- reporting ----------------------------------------------------------------

    def stats(self) -> dict[str, int | float]:
        """The toolkit's stats vocabulary plus Redis figures.

        Keys: every :mod:`tiering.core.toolkit.stats` name that applies
        (lookups, blocks/bytes stored and loaded, ``resident_*`` = blocks this
        process knows are stored, capacity, evictions, failures by cause),
        ``pipelines`` (round trips sent), ``failovers`` (a new primary that
        continued the old one's data: what this process knew was kept),
        ``server_restarts`` (a new primary with a new data set: what this
        process knew was forgotten), ``scanned_blocks`` (blocks found by the
        scans), ``errors_<class>`` per
        :data:`tiering.redis.errors.ERROR_CLASSES`, ``server_maxmemory_bytes``
        (-1: unknown) and ``server_evicts`` (1/0). With ``eviction: "server"``
        the tier evicts nothing: ``capacity_bytes`` is 0 and, instead of
        ``evictions``, ``forgotten_blocks`` counts index entries dropped to
        keep the index within the server's ``maxmemory``.
        """
        out: dict[str, int | float] = {}
        out.update(self.counters.snapshot())
        out.update(self.medium_io.counters.snapshot())
        index = self.index.stats()
        if self._forget_only:  # the server evicts; the index forgets (nothing is deleted by this tier)
            index.pop("evictions")
            index.pop("evicted_bytes")
        out.update(index)
        out.update(self.jobs.stats())
        out.update(self.lookups.stats())
        out.update(self.pins.stats(self.index.__contains__))
        out.update(failure_totals(out))
        if self.fleet is not None:
            out["fleet_capacity_bytes"] = self.fleet.capacity_bytes
            out["fleet_used_bytes"] = self.fleet.used_bytes
            if self.fleet.tenants is not None:
                out.update(self.fleet.tenants.stats())
        out["server_maxmemory_bytes"] = self.server.maxmemory
        out["server_evicts"] = int(self.server.server_evicts)
        return out

    def shutdown(self) -> None:
        """Stop: queued blocks fail at once, running pipelines finish (bounded by the timeouts); idempotent.

        Does nothing in a child forked after the tier was built (the threads and connections are the parent's).
        """
        if self.jobs.owner.forked:
            return
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self.lookups.close()
        self.pool.shutdown(wait=True)
        self.jobs.fail_all()
        self.medium_io.close()
        logger.info("redis tier %r shut down: %s", self.tier_type, self.stats())
