"""The filesystem secondary tier: blocks as files under a namespace directory.

This module composes the parts with the tier toolkit
(:mod:`tiering.core.toolkit`): a :class:`~tiering.core.toolkit.jobs.JobTracker`
reports every job once, a :class:`~tiering.core.toolkit.index.CapacityIndex`
is the one account of which blocks exist and how many bytes they hold, an
:class:`~tiering.core.toolkit.pool.IOPool` moves them, a
:class:`~tiering.core.toolkit.events.KVEventLog` records stores and removals.
Everything else is the fs tier's own, each in its module:

- :mod:`tiering.fs.config`: the config keys (schema), defaults and checks;
- :mod:`tiering.fs.layout`: block paths, names, temporary names and owners;
- :mod:`tiering.fs.io`: the storage back ends (local fast path, fsspec path);
- :mod:`tiering.fs.blocks`: one block to/from its file (header, verification);
- :mod:`tiering.fs.root`: opening the root, ``namespace.json``, ``O_DIRECT``;
- :mod:`tiering.fs.scanner`: the start-up scan, rescans, stale temporary gc;
- :mod:`tiering.fs.errors`: errors and failure causes;
- :mod:`tiering.fs.transfer`: store and load shares on the I/O pool, deletes;
- :mod:`tiering.fs.inspection`: offline inspection (``tiering ls/gc/verify``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from tiering.core.base import JobMetadata, OffloadKey, ReqContext, SecondaryTierManager
from tiering.core.inspection import TierInspector
from tiering.core.spec import OffloadingSpec
from tiering.core.toolkit import Admit, CapacityIndex, Counters, IOPool, JobReporting, JobTracker, KeyState, KVEventLog
from tiering.core.toolkit.config import ConfigSchema, InvalidValueError
from tiering.core.toolkit.jobs import SHUTDOWN, JobState
from tiering.core.toolkit.lookup_cache import LookupCache
from tiering.core.toolkit.pins import PinBook, PinningTier
from tiering.core.toolkit.stats import failure_totals
from tiering.core.toolkit.tenancy import TenantPolicy, note_tenant
from tiering.fs.blocks import BlockFiles
from tiering.fs.config import FS_SCHEMA, FsConfig
from tiering.fs.errors import LOAD_CAUSES, STORE_CAUSES, DirectIONotUsableError
from tiering.fs.io import open_backend
from tiering.fs.io.local import LocalBackend
from tiering.fs.layout import TRAILER_BYTES
from tiering.fs.native import NATIVE_MIN_SHARE, open_native
from tiering.fs.pins import FsPins
from tiering.fs.root import direct_obstacle, prepare_namespace_dir
from tiering.fs.scanner import Rescanner, scan_namespace
from tiering.fs.transfer import Transfers

logger = logging.getLogger(__name__)

_TEMP_KEY = OffloadKey(b"")
"""Index key under which other processes' temporaries are reserved (no real key is empty)."""

_LOOKUP_COUNTERS = ("lookups_hit", "lookups_miss", "lookups_pending", "lookup_probes")
"""Counted by ``lookup`` alone, on the scheduler thread: plain ints, no lock on that path."""

_COUNTERS = (
    "blocks_stored",
    "bytes_stored",
    "stores_already_present",
    "blocks_loaded",
    "bytes_loaded",
    "bad_blocks_removed",
    "temps_removed",
    "scans",
    "disk_full_stores",
    *(f"store_failed_{c}" for c in STORE_CAUSES),
    *(f"load_failed_{c}" for c in LOAD_CAUSES),
)


class FsspecSecondaryTierManager(PinningTier, JobReporting, SecondaryTierManager):
    """A secondary tier storing one file per block on a local disk or any fsspec filesystem.

    Config (``secondary_tiers`` entry)::

        {"type": "fs", "root": "/var/cache/tiering", "capacity_bytes": 107374182400}

    Each stored block occupies ``block_bytes + 4096`` bytes (payload, then a trailer page holding the header);
    ``capacity_bytes`` counts those sizes plus temporaries. The keys are declared in
    :data:`~tiering.fs.config.FS_SCHEMA` and documented on :class:`~tiering.fs.config.FsConfig` and in the
    package README (with the layout and the multi-process semantics). The keyword arguments after ``tier_type``
    (``root`` ... ``tenants``) are those config keys.

    Args:
        offloading_spec: the stack's spec (see :class:`~tiering.core.SecondaryTierManager`).
        primary_kv_view: the primary tier's ``(num_blocks, block_bytes)`` view.
        tier_type: the name the factory resolved this tier by.

    Attributes:
        o_direct: whether block files are read and written with ``O_DIRECT``
            (False from the moment the filesystem refused it at run time).
        o_direct_reason: why not, when ``o_direct`` is False ("" otherwise).

    Raises:
        MissingKeyError, UnknownKeyError, InvalidTypeError, InvalidValueError:
            a config mistake (:mod:`tiering.core.toolkit.config`), naming the key.
        RootNotUsableError: the root cannot be created or written (names ``root``, the path and the reason).
        DirectIONotUsableError: ``o_direct=True`` and ``O_DIRECT`` cannot be used (names ``o_direct`` and the reason).
    """

    medium: ClassVar[str] = "storage"
    config_schema: ClassVar[ConfigSchema | None] = FS_SCHEMA

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        root: str | os.PathLike[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        n_read_threads: int = 8,
        n_write_threads: int = 4,
        fsync: bool = False,
        capacity_bytes: int | None = None,
        stale_temp_s: float = 600.0,
        rescan_interval_s: float = 30.0,
        lookup_fallback: str = "auto",
        o_direct: bool | str = "auto",
        startup_scan_wait_s: float = 2.0,
        max_pinned_bytes: int = 0,
        tenants: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        values = {k: v for k, v in locals().items() if k in FS_SCHEMA.keys}  # the config keys given
        if isinstance(root, os.PathLike):
            values["root"] = os.fspath(root)
        elif root is None:
            del values["root"]
        self.stored_block_bytes = self.block_bytes + TRAILER_BYTES
        cfg = FsConfig.check(tier_type, self.stored_block_bytes, values)
        self.config = cfg
        self.fsync = cfg.fsync
        self.capacity_bytes = cfg.capacity_bytes
        self.n_read_threads, self.n_write_threads = cfg.n_read_threads, cfg.n_write_threads
        self.namespace = offloading_spec.namespace
        try:
            self.backend, self.root = open_backend(cfg.root, dict(cfg.storage_options or {}))
        except ValueError as exc:  # an unknown protocol, a filesystem package not installed
            raise InvalidValueError(tier_type, "root", str(exc)) from exc
        if isinstance(self.backend, LocalBackend):
            self.backend.cache_dirs = True  # one open per shard directory, not one per block
        self.namespace_dir = f"{self.root.rstrip('/')}/{self.namespace.digest}"
        self.lookup_fallback = cfg.lookup_fallback
        if self.lookup_fallback == "auto":
            self.lookup_fallback = "stat" if self.backend.is_local else "async"
        ns = dict(self.namespace.to_dict(), digest=self.namespace.digest)
        prepare_namespace_dir(self.backend, cfg.root, self.namespace_dir, ns, tier_type)
        self._setup_direct(cfg.o_direct)
        self.files = BlockFiles(
            self.backend, self.namespace_dir, self.namespace.digest_bytes, self.block_bytes, cfg.fsync
        )
        self.files.native, self.block_io = open_native(
            self.backend, self.namespace_dir, self.namespace.digest_bytes, self.primary_kv_view
        )  # block_io: which block I/O path (native batch or pure Python) and why, for logs and probes
        logger.info("fs tier: %s uses %s", self.namespace_dir, self.block_io)

        self.tenants = TenantPolicy.from_config(cfg.tenants)
        self.index = CapacityIndex(cfg.capacity_bytes, self.tenants)
        pin_medium = FsPins(self.backend, self.namespace_dir)
        self.pins = PinBook(pin_medium, cfg.max_pinned_bytes, self.stored_block_bytes, self.namespace_dir)
        self.index.keep = self.pins.protects
        self.jobs = JobTracker()
        self.counters = Counters(_COUNTERS)
        self._lookup_counts = dict.fromkeys(_LOOKUP_COUNTERS, 0)
        self.events = KVEventLog(self.medium, tier=self.tier_type, locality="local")
        self.index.attach_events(self.events)
        self._stopping = False
        self._temp_bytes = 0
        self._last_scan_s = 0.0
        # A native call costs per share: shares of at least NATIVE_MIN_SHARE blocks, readers help writers with as many.
        share = NATIVE_MIN_SHARE if self.files.native is not None else 1
        self.pool = IOPool(
            cfg.n_read_threads, cfg.n_write_threads, name="tiering-fs", min_batch=share, reader_help_batch=share
        )
        self.transfers = Transfers(self.index, self.files, self.counters, self.pool, self.block, self._is_stopping)
        self._lookup_cache: LookupCache | None = None
        if self.lookup_fallback == "async":
            self._lookup_cache = LookupCache(
                self._resolve, lambda fn: self.pool.submit_call("read", fn), negative_ttl_s=1.0
            )
            self.transfers.on_removed = self._lookup_cache.invalidate
        interval = cfg.rescan_interval_s if cfg.capacity_bytes is not None or self.tenants else 0.0
        self._rescanner = Rescanner(self._scan, interval, "tiering-fs-scan")
        if cfg.startup_scan_wait_s > 0:
            self._rescanner.first_done.wait(cfg.startup_scan_wait_s)

    def _setup_direct(self, wanted: bool | str) -> None:
        """Decide whether block files use ``O_DIRECT`` (see the ``o_direct`` key)."""
        self._direct_reason = "disabled by config (o_direct: false)" if wanted is False else ""
        if wanted is False:
            return
        reason = direct_obstacle(self.backend, self.namespace_dir, self.block_bytes, self.primary_kv_view)
        if reason is None:
            self.backend.direct = True
            logger.info("fs tier: %s uses O_DIRECT", self.namespace_dir)
        else:
            self._direct_reason = reason
            if wanted is True:
                raise DirectIONotUsableError(
                    self.tier_type, f"{self.root!r}: o_direct is true but O_DIRECT cannot be used: {reason}"
                )
            logger.info("fs tier: %s uses buffered I/O (no O_DIRECT: %s)", self.namespace_dir, reason)

    @property
    def o_direct(self) -> bool:
        """Whether block files move with ``O_DIRECT`` now (see the class doc)."""
        return self.backend.direct

    @property
    def o_direct_reason(self) -> str:
        """Why block files do not use ``O_DIRECT`` ("" while they do)."""
        return "" if self.backend.direct else self.backend.direct_lost or self._direct_reason

    # -- extension points ---------------------------------------------------------------
    @classmethod
    def inspector(cls, tier_config: Mapping[str, Any]) -> TierInspector:
        """A :class:`~tiering.fs.inspection.FsInspector` of a config entry's root (``tiering ls/gc/verify``)."""
        from tiering.fs.inspection import FsInspector

        return FsInspector.from_config(tier_config)

    @classmethod
    def default_local_config(cls, directory: str) -> dict[str, Any]:
        """An ``fs`` entry under ``directory``, capped at 1 GiB (the benchmark's default persistent tier)."""
        return {"type": "fs", "root": directory, "capacity_bytes": 1 << 30}

    @classmethod
    def probe(cls, tier_config: Mapping[str, Any]) -> str:
        """Whether the entry's root would work, creating nothing (``tiering check --probe``); see :func:`probe_root`.

        For a local root it also says which block I/O path is used and, when ``capacity_bytes`` is unbounded
        or more than the disk has free, that the cap in force will be what the disk holds.
        """
        from tiering.fs.probe import probe_entry

        return probe_entry(tier_config)

    def block_path(self, key: bytes) -> str:
        """Path of ``key``'s block file: ``<namespace dir>/<ab>/<key hex>.kvb``."""
        return self.files.path(key)

    # -- lookups ----------------------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """Whether ``key`` is stored: index first, then the configured filesystem fallback.

        Returns:
            True (stored and complete), False (absent, or being deleted),
            None (this process is storing it, an asynchronous probe is in
            flight, or the start-up scan is still running with
            ``lookup_fallback="off"``).
        """
        state = self.index.lookup(key)
        if state is KeyState.ABSENT:
            answer = None if self.transfers.is_queued(key) else self._fallback(key)
        elif state is KeyState.DELETING and self.tenants is not None:  # maybe past its tenant's TTL just now
            answer = self._delete_expired()
        else:
            answer = True if state is KeyState.RESIDENT else None if state is KeyState.WRITING else False
        self._lookup_counts["lookups_hit" if answer else "lookups_pending" if answer is None else "lookups_miss"] += 1
        return answer

    def _fallback(self, key: OffloadKey) -> bool | None:
        mode = self.lookup_fallback
        if mode == "off":
            return False if self._rescanner.first_done.is_set() else None
        if self._lookup_cache is not None:
            return self._lookup_cache.lookup(key)
        self._lookup_counts["lookup_probes"] += 1
        with self.index.reading() as ticket:  # an eviction after this point wins over the adoption
            size = self.files.size(key)
            return size == self.stored_block_bytes and self.index.adopt(key, self.stored_block_bytes, ticket)

    def _resolve(self, keys: Sequence[OffloadKey]) -> dict[OffloadKey, bool]:
        """Background existence check of ``lookup_fallback="async"`` (the lookup cache's resolver)."""
        with self.index.reading() as ticket:
            found = [(k, self.stored_block_bytes) for k in keys if self.files.size(k) == self.stored_block_bytes]
            self.index.adopt_many(found, ticket)
        return {k: self.index.lookup(k, touch=False) is KeyState.RESIDENT for k in keys}

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` most recently used in the tier's own LRU record (not atime)."""
        self.index.touch(keys)

    def _delete_expired(self) -> bool:
        if expired := self.index.take_expired():
            self.pool.submit_call("write", lambda: self.transfers.delete(expired, "expired"))
        return False

    # -- stores and loads ---------------------------------------------------------------------
    def submit_store(self, job: JobMetadata) -> None:
        """Reserve and queue ``job``'s blocks for writing; returns at once (see the base class)."""
        note_tenant(self.tenants, job.req_context.tenant)  # its keys carry only its tag: its name for stats
        self._start(job, self.transfers.store)
        self.pins.refresh_soon(self.pool.submit_call)  # other processes' pins, read again now and then

    def submit_load(self, job: JobMetadata) -> None:
        """Queue ``job``'s blocks for reading into their primary slots; returns at once."""
        self._start(job, self.transfers.load)

    def _start(self, job: JobMetadata, run: Callable[[JobState], None]) -> None:
        state = self.jobs.start(job)
        if not state.finished:
            state.fail_rest(SHUTDOWN) if self._stopping else run(state)

    # -- scans ------------------------------------------------------------------------------------------
    def _scan(self, first: bool) -> None:
        """One pass over the namespace directory, reconciled with the index (see :mod:`tiering.fs.scanner`)."""
        started = time.monotonic()
        self.pins.refresh()  # the pins first: the eviction down to the cap below keeps pinned blocks
        with self.index.reading() as ticket:
            result = scan_namespace(
                self.backend, self.namespace_dir, self.stored_block_bytes, self.config.stale_temp_s, self._is_stopping
            )
            if not result.complete:
                return
            oldest_first = sorted(result.blocks.items(), key=lambda item: item[1][1])
            born = {OffloadKey(k): mtime for k, (_, mtime) in oldest_first}  # a tenant's TTL counts from the store
            report = self.index.reconcile({OffloadKey(k): size for k, (size, _) in oldest_first}, ticket, born)
        self.transfers.forget(report.vanished, "vanished")
        self._account_temps(result.temp_bytes)
        self.transfers.delete(self.index.retry_deletes(), "eviction")
        self.transfers.delete(self.index.evict_to_cap(), "eviction")
        self.counters.add({"scans": 1, "temps_removed": result.temps_removed, "bad_blocks_removed": result.bad_removed})
        self._last_scan_s = time.monotonic() - started
        (logger.info if first else logger.debug)(
            "fs tier: %s scan of %s took %.3f s: %d blocks indexed, %d new, %d vanished, %d stale temporaries and "
            "%d bad files removed, %d symlinks and special files ignored",
            "startup" if first else "periodic",
            self.namespace_dir,
            self._last_scan_s,
            len(self.index),
            len(report.added),
            len(report.vanished),
            result.temps_removed,
            result.bad_removed,
            result.foreign,
        )

    def _account_temps(self, temp_bytes: int) -> None:
        """Count other processes' temporaries against the cap until the next scan (left out, the disk outgrows it)."""
        if self._temp_bytes:
            self.index.commit(_TEMP_KEY, False)
            self._temp_bytes = 0
        if temp_bytes:
            res = self.index.reserve(_TEMP_KEY, temp_bytes)
            self.transfers.delete(res.victims, "eviction")
            if res.admit is Admit.RESERVED:
                self._temp_bytes = temp_bytes
                if not res.ready:  # these bytes are on disk already: count them there once their room is free
                    self.index.wait_for_room([_TEMP_KEY], 0.0)

    def _is_stopping(self) -> bool:
        return self._stopping

    def wait_for_scan(self, timeout_s: float | None = None) -> bool:
        """Block until the start-up scan has indexed the namespace directory (False when ``timeout_s`` passes)."""
        return self._rescanner.first_done.wait(timeout_s)

    # -- the rest of the contract -----------------------------------------------------------------------

    def stats(self) -> dict[str, int | float]:
        """Figures of this tier instance under the toolkit's stats names; see the package README for every key."""
        out: dict[str, int | float] = dict(self.counters.snapshot())
        out.update(self._lookup_counts)
        out.update(self.index.stats())
        out.update(self.jobs.stats())
        out.update(self.pins.stats(self.index.__contains__))
        out.update(failure_totals(out))
        if self._lookup_cache is not None:
            cache = self._lookup_cache.stats()
            out["lookup_probes"] = cache["lookup_probes"]
            out["lookup_probes_skipped"] = cache["lookup_probes_skipped"]
        temp = self._temp_bytes
        out["reserved_bytes"] = int(out["reserved_bytes"]) - temp
        out["in_flight_stores"] = int(out["in_flight_stores"]) - (1 if temp else 0)
        out["temp_bytes"] = temp
        out["configured_capacity_bytes"] = self.capacity_bytes or 0
        out["scan_done"] = int(self._rescanner.first_done.is_set())
        out["last_scan_s"] = self._last_scan_s
        out["o_direct"] = int(self.o_direct)
        out["native_io"] = int(self.files.native is not None)
        return out

    def shutdown(self) -> None:
        """Stop the threads: queued blocks fail, running ones finish, each job reported once (no-op in a fork child)."""
        if self._stopping or self.jobs.owner.forked:
            return
        self._stopping = True
        self._rescanner.stop()
        if self._lookup_cache is not None:
            self._lookup_cache.close()
        self.pool.shutdown(wait=True)
        self.backend.close()
        self.files.close()
        self.jobs.fail_all(SHUTDOWN)
