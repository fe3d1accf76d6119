"""The indexed block store: a secondary tier whose backend supplies only a :class:`~tiering.core.store.medium.Medium`.

:class:`IndexedTier` owns everything a persistent tier does around its medium:

- the :class:`~tiering.core.store.index.CapacityIndex`: which blocks exist, their bytes against the cap
  (the "capacity >= one block" check names the key), tenants' quotas and TTLs, pins;
- ``lookup``: index first, then the medium by ``lookup_fallback`` (``stat``, ``async``, ``off``);
- ``submit_store`` / ``submit_load`` on an I/O pool (:mod:`~tiering.core.store.stores`, ``loads``),
  reserving on the I/O thread (default) or the scheduler's (:attr:`IndexedTier.reserve_on_scheduler`);
- the delete path with retries (:mod:`~tiering.core.store.deletes`), scans (:mod:`~tiering.core.store.scans`);
- jobs, counters, KV events, ``stats()`` and the shutdown order.

A backend subclasses it: it declares :attr:`config_schema`, builds its medium in
:meth:`IndexedTier.open_medium` and may add stats; the constructor does the rest.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from tiering.core.base import JobMetadata, OffloadKey, ReqContext, SecondaryTierManager, block_view
from tiering.core.events import KVEventLog
from tiering.core.format import HEADER_SIZE
from tiering.core.schema import ConfigSchema
from tiering.core.spec import OffloadingSpec
from tiering.core.store.deletes import Deletes
from tiering.core.store.hooks import PinBook, PinningTier, TenantPolicy, note_tenant
from tiering.core.store.index import CapacityIndex, KeyState
from tiering.core.store.jobs import SHUTDOWN, JobReporting, JobState, JobTracker
from tiering.core.store.loads import Loads
from tiering.core.store.medium import Medium
from tiering.core.store.pool import IOPool
from tiering.core.store.scans import Rescanner, Scans
from tiering.core.store.settings import StoreSettings, config_values, is_inspecting
from tiering.core.store.stats import Counters, failure_totals
from tiering.core.store.stores import Stores

if TYPE_CHECKING:
    from tiering.core.store.lookup_cache import LookupCache
from tiering.core.declared import check_one_block

logger = logging.getLogger(__name__)

__all__ = ["IndexedTier"]

_LOOKUP_COUNTERS = ("lookups_hit", "lookups_miss", "lookups_pending", "lookup_probes")
"""Counted by ``lookup`` alone, on the scheduler thread: plain ints, no lock on that path."""

_COUNTERS = (
    "blocks_stored",
    "bytes_stored",
    "stores_already_present",
    "blocks_loaded",
    "bytes_loaded",
    "bad_blocks_removed",
    "scans",
    "disk_full_stores",
)


class IndexedTier(PinningTier, JobReporting, SecondaryTierManager):
    """A secondary tier that keeps an index of the blocks on a :class:`Medium` (see the module doc).

    Args:
        offloading_spec: the stack's spec (see :class:`~tiering.core.SecondaryTierManager`).
        primary_kv_view: the primary tier's ``(num_blocks, block_bytes)`` view.
        tier_type: the name the factory resolved this tier by.
        **config: the entry's keys (checked by :meth:`check_config` against :attr:`config_schema`).

    Attributes:
        config: the checked configuration (what :meth:`check_config` returned).
        settings: the store's knobs (:meth:`store_settings`).
        blocks: the medium (:meth:`open_medium`).
        stored_block_bytes: bytes one stored block occupies (``block_bytes + block_overhead_bytes``).
        index, jobs, counters, events, pins, pool, tenants: the toolkit parts.

    Raises:
        TierConfigError: a config mistake (names the key), among them ``capacity_bytes``, ``max_pinned_bytes``
            or a tenant's ``quota_bytes`` below one stored block.
        Exception: what :meth:`open_medium` raises (the medium cannot be used), or a blocking start-up scan.
    """

    block_overhead_bytes: ClassVar[int] = HEADER_SIZE
    """Bytes a stored block occupies beyond its payload (header, trailer); the cap counts them."""

    reserve_on_scheduler: ClassVar[bool] = False
    """Reserve a store's blocks in ``submit_store`` on the scheduler thread (victims known at once, a block
    without room fails there) rather than on the I/O thread that writes them (the default: the scheduler
    thread then touches no index lock)."""

    locality: ClassVar[str] = "local"
    """KV events' locality: ``"local"`` (this host), ``"remote"`` or ``"fleet"`` (shared by every engine)."""

    config_schema: ClassVar[ConfigSchema | None] = None

    def __init__(
        self, offloading_spec: OffloadingSpec, primary_kv_view: memoryview, tier_type: str, **config: Any
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        self.namespace = offloading_spec.namespace
        self.stored_block_bytes = self.block_bytes + self.block_overhead_bytes
        self.config = self.check_config(config)
        values = config_values(self.config)
        # before the medium is opened (nothing created yet): a cap, pin bound or quota below one stored block
        check_one_block(self.tier_type, values, self.stored_block_bytes)
        self.blocks = medium = self.open_medium(self.config)
        medium.read_only = medium.read_only or is_inspecting()  # opened for inspection: changes no block
        try:
            if medium.stored_block_bytes != self.stored_block_bytes:
                raise ValueError(f"{medium.label}: stores {medium.stored_block_bytes} bytes per block, expected "
                                 f"{self.stored_block_bytes}")  # fmt: skip
            self.settings = s = self.store_settings(self.config)
            self.capacity_bytes = s.capacity_bytes
            self._start(medium, s)
        except BaseException:
            self._stop()
            raise

    def _start(self, medium: Medium, s: StoreSettings) -> None:
        """Build the toolkit parts around ``medium`` and run (or start) the start-up scan."""
        if not medium.read_only:  # an inspection writes nothing
            medium.write_namespace_record(dict(self.namespace.to_dict(), digest=self.namespace.digest))
        self._stopping = False
        self.tenants = TenantPolicy.from_config(dict(s.tenants) if s.tenants is not None else None)
        self.index = CapacityIndex(None if medium.server_evicts else s.capacity_bytes, self.index_tenants())
        label = f"{medium.label} {medium.location}".rstrip()
        self.pins = PinBook(medium.pin_records(), s.max_pinned_bytes, self.stored_block_bytes, label)
        self.index.keep = self.pins.protects
        self.jobs = JobTracker()
        self.counters = Counters(self._counter_names(medium))
        self._lookup_counts = dict.fromkeys(_LOOKUP_COUNTERS, 0)
        self.events = KVEventLog(self.medium, tier=self.tier_type, locality=self.locality)
        self.index.attach_events(self.events)
        self.pool = IOPool(
            s.n_read_threads,
            s.n_write_threads,
            name=f"tiering-{self.tier_type}",
            max_batch=s.max_batch,
            min_batch=s.min_batch,
            reader_help_batch=s.help_batch or s.min_batch,
        )
        self.deletes = Deletes(medium, self.index, self.counters, self._gone)
        slot = functools.partial(block_view, self.primary_kv_view)
        self.stores = Stores(medium, self.index, self.deletes, self.counters, self.pool, slot,
                             self._is_stopping, self._stored)  # fmt: skip
        self.loads = Loads(medium, self.index, self.deletes, self.counters, self.pool, slot,
                           self._is_stopping, self.forget)  # fmt: skip
        self.stores.block_bytes = self.loads.block_bytes = self.block_bytes
        self.stores.room_wait_s = s.room_wait_s
        log = logging.getLogger(type(self).__module__)
        self.scans = Scans(medium, self.index, self.deletes, self.counters, self.pins, self._is_stopping, self.forget,
                           log)  # fmt: skip
        self.lookup_cache = self.make_lookup_cache() if s.lookup_fallback == "async" else None
        interval = s.rescan_interval_s if s.capacity_bytes is not None or self.tenants else 0.0
        if s.startup_scan == "blocking":
            self.scans.scan(True)
        background = s.startup_scan == "background"
        self._rescanner = Rescanner(self.scans.scan, interval, f"tiering-{self.tier_type}-scan", first=background)
        if background and s.startup_scan_wait_s > 0:
            self._rescanner.first_done.wait(s.startup_scan_wait_s)

    # -- hooks a backend overrides -------------------------------------------------------------------
    def check_config(self, config: Mapping[str, Any]) -> Any:
        """Check the entry's keys (default: :attr:`config_schema`'s ``validate``, a dict of every key).

        Raises:
            TierConfigError: a wrong, missing or unknown key (names it).
        """
        if self.config_schema is None:
            return dict(config)
        return self.config_schema.validate(config)

    def store_settings(self, config: Any) -> StoreSettings:
        """The store's knobs from the checked config (default: the keys of :class:`StoreSettings`' names).

        Called after :meth:`open_medium`, so a knob may depend on the medium (``self.blocks``).
        """
        return StoreSettings.from_config(config_values(config))

    def open_medium(self, config: Any) -> Medium:
        """Open the backend's medium for this tier's namespace (``self.namespace``, ``self.block_bytes``).

        Called after :meth:`check_config` and the ``capacity_bytes`` check, before :meth:`store_settings`.

        Raises:
            Exception: the medium cannot be used (a clear error naming the key and the reason).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement open_medium")

    def index_tenants(self) -> TenantPolicy | None:
        """The tenant policy the index enforces (default: the tier's; one without quotas where a fleet keeps them)."""
        return self.tenants

    def make_lookup_cache(self) -> LookupCache:
        """The lookup cache of ``lookup_fallback: "async"`` (default: resolved on the read threads, 1 s negatives)."""
        from tiering.core.store.lookup_cache import LookupCache  # only tiers with lookup_fallback async use it

        return LookupCache(self._resolve, lambda fn: self.pool.submit_call("read", fn), negative_ttl_s=1.0)

    def _counter_names(self, medium: Medium) -> list[str]:
        causes = [f"store_failed_{c}" for c in medium.store_causes] + [f"load_failed_{c}" for c in medium.load_causes]
        return [*_COUNTERS, *medium.counters, *causes]

    # -- lookups ----------------------------------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """Whether ``key`` is stored: index first, then the medium by ``lookup_fallback``.

        Returns:
            True (stored and complete), False (absent, being deleted, or the tier is shut down),
            None (this process is storing it, an asynchronous probe is in flight, or the start-up
            scan is still running with ``lookup_fallback="off"``).
        """
        if self._stopping:
            return False
        state = self.index.lookup(key)
        if state is KeyState.ABSENT:
            answer = None if self.stores.is_queued(key) else self._fallback(key)
        elif state is KeyState.DELETING and self.tenants is not None:  # maybe past its tenant's TTL just now
            answer = self._delete_expired()
        else:
            answer = True if state is KeyState.RESIDENT else None if state is KeyState.WRITING else False
        self._lookup_counts["lookups_hit" if answer else "lookups_pending" if answer is None else "lookups_miss"] += 1
        return answer

    def _fallback(self, key: OffloadKey) -> bool | None:
        mode = self.settings.lookup_fallback
        if mode == "off":
            return False if self._rescanner.first_done.is_set() else None
        if self.lookup_cache is not None:
            answer = self.lookup_cache.lookup(key)
            # adopted by the probe and removed since: not servable
            return self.index.lookup(key, touch=False) is KeyState.RESIDENT if answer else answer
        self._lookup_counts["lookup_probes"] += 1
        with self.index.reading() as ticket:  # an eviction after this point wins over the adoption
            size = self.blocks.size(key)
            return size == self.stored_block_bytes and self.index.adopt(key, self.stored_block_bytes, ticket)

    def _resolve(self, keys: Sequence[OffloadKey]) -> dict[OffloadKey, bool]:
        """Background existence check of ``lookup_fallback="async"`` (the lookup cache's resolver)."""
        with self.index.reading() as ticket:
            found = [k for k, n in zip(keys, self.blocks.sizes(keys), strict=True) if n == self.stored_block_bytes]
            adopted = self.index.adopt_many([(k, self.stored_block_bytes) for k in found], ticket)
        self._trim_known()  # what it forgets is invalidated in the lookup cache (this answer for it is dropped)
        if adopted < len(found):  # some were removed meanwhile: the index says which (else no round per key)
            found = [k for k in found if self.index.lookup(k, touch=False) is KeyState.RESIDENT]
        return dict.fromkeys(keys, False) | dict.fromkeys(found, True)  # absent on the medium: False

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` most recently used in the tier's LRU record (and the medium's, where it keeps one)."""
        self.index.touch(keys)
        if self.blocks.touched(keys):
            self.pool.submit_call("write", self.blocks.flush)

    def _delete_expired(self) -> bool:
        if expired := self.index.take_expired():
            self.pool.submit_call("write", lambda: self.deletes.delete(expired, "expired"))
        return False

    # -- stores and loads -----------------------------------------------------------------------------
    def submit_store(self, job: JobMetadata) -> None:
        """Reserve and queue ``job``'s blocks for writing; returns at once (see the base class)."""
        note_tenant(self.tenants, job.req_context.tenant)  # its keys carry only its tag: its name for stats
        self._begin(job, self.stores.reserve_and_queue if self.reserve_on_scheduler else self.stores.queue)
        self.pins.refresh_soon(self.pool.submit_call)  # other processes' pins, read again now and then

    def submit_load(self, job: JobMetadata) -> None:
        """Queue ``job``'s blocks for reading into their primary slots (verified first); returns at once."""
        self._begin(job, self.loads.queue)

    def _begin(self, job: JobMetadata, run: Callable[[JobState], None]) -> None:
        state = self.jobs.start(job)
        if not state.finished:
            state.fail_rest(SHUTDOWN) if self._stopping else run(state)

    # -- keys that left the medium ------------------------------------------------------------------
    def forget(self, keys: Sequence[OffloadKey], reason: str) -> None:
        """Keys known gone (``reason``: vanished, bad, short, foreign): drop their cached lookups.

        The KV events were recorded by the index when the keys left its resident set.
        """
        if keys and self.lookup_cache is not None:
            self.lookup_cache.invalidate(keys)

    def _gone(self, keys: Sequence[OffloadKey]) -> None:
        """The delete path removed ``keys`` from the medium."""
        self.forget(keys, "deleted")

    def _stored(self, keys: Sequence[OffloadKey]) -> None:
        """Blocks this process just stored: the medium's fleet-wide cap may hand back victims to delete now."""
        victims = self.blocks.stored(keys)
        if victims:
            for key in victims:
                self.index.remove(key, delete=False, cause="eviction")  # never counted by this process's cap
            self.forget(victims, "evicted")
            self.counters.inc("fleet_evictions", len(victims))
            self.blocks.remove_many(victims)
        self._trim_known()

    def _trim_known(self) -> None:
        """With a medium that evicts on its own: forget the least recently used entries beyond what it holds.

        The medium cannot hold more, so older entries are likely gone; forgetting them (never deleting)
        keeps this process's index bounded. Trims to 90 % so that the O(n) snapshot of the index is rare.
        """
        limit = self.blocks.known_limit_bytes
        if not self.blocks.server_evicts or not limit or self.index.resident_bytes <= limit:
            return
        surplus = self.index.resident_bytes - int(0.9 * limit)
        forgotten: list[OffloadKey] = []
        for key in self.index.keys():  # noqa: SIM118 (a snapshot, LRU first; the index is not iterable)
            if surplus <= 0:
                break
            self.index.remove(key, delete=False, cause="forgotten")  # still on the medium: lookups ask it
            surplus -= self.stored_block_bytes
            forgotten.append(key)
        self.forget(forgotten, "forgotten")
        self.counters.inc("forgotten_blocks", len(forgotten))

    def _is_stopping(self) -> bool:
        return self._stopping

    def wait_for_scan(self, timeout_s: float | None = None) -> bool:
        """Block until the start-up scan (or the rescan after :meth:`reset`) is done; False after ``timeout_s``."""
        return self._rescanner.first_done.wait(timeout_s)

    def rescan(self) -> None:
        """Run a rescan now, in the background (it also retries failed deletes and evicts to the cap)."""
        self._rescanner.wake()

    def reset(self, keep: bool) -> None:
        """The medium changed under the store (a server restarted or failed over); callable from any thread.

        Args:
            keep: True when the medium kept its blocks (a failover to a replica); False forgets every block
                the index knows at once (a new, possibly empty, data set), so no lookup answers True and no
                store is skipped for a block that is gone. Either way the KV events re-announce what is
                known and a rescan runs now; :meth:`wait_for_scan` waits for it.
        """
        self._rescanner.first_done.clear()  # first: whoever sees the reset's effects also waits for the rescan
        if not keep:
            with self.index.reading() as ticket:
                vanished = self.index.reconcile({}, ticket).vanished
            self.forget(vanished, "vanished")
        self.index.announce("reconnect")
        self._rescanner.wake()

    # -- the rest of the contract -----------------------------------------------------------------------
    def stats(self) -> dict[str, int | float]:
        """Figures of this tier instance under the toolkit's stats vocabulary, plus the medium's own."""
        out: dict[str, int | float] = dict(self.counters.snapshot())
        out.update(self._lookup_counts)
        out.update(self.index.stats())
        out.update(self.jobs.stats())
        out.update(self.pins.stats(self.index.__contains__))
        out.update(failure_totals(out))
        if self.lookup_cache is not None:  # keys resolved, batches, errors, cached answers
            out.update(self.lookup_cache.stats())
        temp = self.scans.temp_bytes
        out["reserved_bytes"] = int(out["reserved_bytes"]) - temp
        out["in_flight_stores"] = int(out["in_flight_stores"]) - (1 if temp else 0)
        out["temp_bytes"] = temp
        out["configured_capacity_bytes"] = self.capacity_bytes or 0
        out["scan_done"] = int(self._rescanner.first_done.is_set())
        out["last_scan_s"] = self.scans.last_scan_s
        if self.blocks.server_evicts:  # the medium evicts, this store only forgets: it never evicted anything
            out.pop("evictions", None)
            out.pop("evicted_bytes", None)
        out.update(self.blocks.stats())
        return out

    def shutdown(self) -> None:
        """Stop the threads: queued blocks fail, running ones finish, each job reported once (no-op in a fork child).

        Order: no new work, the scan thread, the lookup cache, the I/O pool (running shares finish), the
        delete path (queued deletes are sent), the medium; then every job not finished fails as ``shutdown``.
        """
        if self._stopping or self.jobs.owner.forked:
            return
        self._stop()
        self.jobs.fail_all(SHUTDOWN)

    def _stop(self) -> None:
        """Stop whatever was started (also what a constructor that failed half-way started)."""
        self._stopping = True
        if (rescanner := getattr(self, "_rescanner", None)) is not None:
            rescanner.stop()
        if (cache := getattr(self, "lookup_cache", None)) is not None:
            cache.close()
        if (pool := getattr(self, "pool", None)) is not None:
            pool.shutdown(wait=True)
        if (deletes := getattr(self, "deletes", None)) is not None:
            deletes.close()  # after the pool: the deletes its last shares queued are sent
        self.blocks.close()
