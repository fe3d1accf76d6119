"""The filesystem secondary tier: blocks as files under a namespace directory.

This module composes the parts; each lives in its own module:

- :mod:`tiering.fs.config`: the config keys, defaults and checks;
- :mod:`tiering.fs.layout`: block paths, names, temporary names and owners;
- :mod:`tiering.fs.io`: moving one block to/from the storage (local fast path, fsspec path);
- :mod:`tiering.fs.scanner`: the start-up scan, rescans, stale temporary gc;
- :mod:`tiering.fs.errors`: errors and failure causes;
- :mod:`tiering.fs.inspection`: offline inspection (``tiering ls/gc/verify``).

A block is written under a temporary name in its shard directory and
published by rename, so a reader never sees a partial block; every load is
verified (header, namespace digest, key, length, checksum) and anything that
does not verify is a miss: the job fails, the file is removed, the in-memory
index forgets the key.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import mmap
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext, SecondaryTierManager
from tiering.core.format import HEADER_SIZE, MAX_KEY_BYTES, BlockFormatError, encode_header, verify_block
from tiering.core.inspection import TierInspector
from tiering.core.spec import OffloadingSpec
from tiering.fs.config import FsConfig
from tiering.fs.errors import DirectIONotUsableError, RootNotUsableError, failure_cause
from tiering.fs.io import open_backend
from tiering.fs.io.local import DIRECT_ALIGN, LocalBackend
from tiering.fs.layout import NAMESPACE_FILE, PROBE_NAME, TRAILER_BYTES, block_path, temp_namer
from tiering.fs.scanner import Rescanner, scan_namespace
from tiering.fs.workers import BlockWorkers

logger = logging.getLogger(__name__)

_ZERO_TAIL = bytes(TRAILER_BYTES - HEADER_SIZE)


def _view_address(view: memoryview) -> int | None:
    """Address of the first byte of a writable C-contiguous buffer, None when it cannot be taken."""
    try:
        flat = view.cast("B") if view.ndim != 1 or view.format != "B" else view
        return ctypes.addressof(ctypes.c_char.from_buffer(flat))
    except (TypeError, ValueError, BufferError):
        return None


class FsspecSecondaryTierManager(BlockWorkers, SecondaryTierManager):
    """A secondary tier storing one file per block on a local disk or any fsspec filesystem.

    Config (``secondary_tiers`` entry)::

        {"type": "fs", "root": "/var/cache/tiering", "capacity_bytes": 107374182400}

    Each stored block occupies ``block_bytes + 4096`` bytes (payload, then a
    trailer page holding the header); ``capacity_bytes`` counts those sizes.
    The keys are those of :class:`~tiering.fs.config.FsConfig` (documented
    there and in the package README, with the layout and the multi-process
    semantics).

    Args:
        offloading_spec: the stack's spec (see :class:`~tiering.core.SecondaryTierManager`).
        primary_kv_view: the primary tier's ``(num_blocks, block_bytes)`` view.
        tier_type: the name the factory resolved this tier by.
        **config: the entry's keys (see :class:`~tiering.fs.config.FsConfig`).

    Attributes:
        o_direct: whether block files are read and written with ``O_DIRECT``.
        o_direct_reason: why not, when ``o_direct`` is False ("" otherwise).

    Raises:
        TypeError: a config value has the wrong type (the message names the key).
        ValueError: a config value is out of range or ``root`` has an unknown protocol.
        RootNotUsableError: the root cannot be created or written (path and reason in the message).
        DirectIONotUsableError: ``o_direct=True`` and ``O_DIRECT`` cannot be used (path and reason in the message).
    """

    def __init__(
        self, offloading_spec: OffloadingSpec, primary_kv_view: memoryview, tier_type: str, **config: Any
    ) -> None:
        SecondaryTierManager.__init__(self, offloading_spec, primary_kv_view, tier_type)
        self.stored_block_bytes = self.block_bytes + TRAILER_BYTES
        if config.get("storage_options") is None:
            config["storage_options"] = {}
        cfg = FsConfig.check(f"tier {tier_type!r}", self.stored_block_bytes, **config)
        self.config = cfg
        self.fsync = cfg.fsync
        self.capacity_bytes = cfg.capacity_bytes
        self.stale_temp_s = float(cfg.stale_temp_s)
        self.rescan_interval_s = float(cfg.rescan_interval_s)
        self.namespace = offloading_spec.namespace
        self._digest = self.namespace.digest_bytes
        try:
            self.backend, base = open_backend(cfg.root, cfg.storage_options)
        except ValueError as exc:
            raise ValueError(f"tier {tier_type!r}: {exc}") from exc
        self.root = base
        self.namespace_dir = f"{base.rstrip('/')}/{self.namespace.digest}"
        fallback = cfg.lookup_fallback
        if fallback == "auto":
            fallback = "stat" if self.backend.is_local else "async"
        self.lookup_fallback = fallback
        BlockWorkers.__init__(self, cfg.n_read_threads, cfg.n_write_threads)
        self._made_dirs: set[str] = set()

        self._probe_root()
        self.o_direct = False
        self.o_direct_reason = ""
        self._setup_direct(cfg.o_direct)
        self._trailers = threading.local()
        self.start_workers()
        self._scan_lock = threading.Lock()
        self._rescanner = Rescanner(
            self._scan, self.rescan_interval_s if self.capacity_bytes is not None else 0.0, "tiering-fs-scan"
        )
        self._scan_done = self._rescanner.first_done
        if cfg.startup_scan_wait_s > 0:
            self._scan_done.wait(cfg.startup_scan_wait_s)

    # -- construction ---------------------------------------------------------
    def _root_error(self, exc: OSError, what: str) -> RootNotUsableError:
        return RootNotUsableError(exc.errno or errno.EIO, f"fs tier root {self.root!r}: {what}: {exc.strerror or exc}")

    def _probe_root(self) -> None:
        """Create the namespace directory, prove it writable, publish ``namespace.json``."""
        path = self.namespace_dir
        try:
            self.backend.makedirs(path)
        except OSError as exc:
            raise self._root_error(exc, f"cannot create directory {path!r}") from exc
        if not self.backend.is_real_directory(path):
            raise RootNotUsableError(errno.ELOOP, f"fs tier root {self.root!r}: {path!r} is a symlink, not a directory")
        probe = temp_namer(f"{path}/{PROBE_NAME}")
        try:
            # Written under a temporary name and published under another one: removed either way.
            final = temp_namer(f"{path}/{PROBE_NAME}")
            self.backend.write_block(probe, final, memoryview(b"probe"), memoryview(b""), False)
            self.backend.remove(final)
        except OSError as exc:
            raise self._root_error(exc, f"directory {path!r} is not writable") from exc
        ns_path = f"{path}/{NAMESPACE_FILE}"
        wanted = dict(self.namespace.to_dict(), digest=self.namespace.digest)
        try:
            current = self.backend.read_small(ns_path)
            if current is not None:
                try:
                    if json.loads(current) == wanted:
                        return
                except ValueError:
                    pass
                logger.warning("fs tier: %s does not match this namespace; rewriting it", ns_path)
            data = json.dumps(wanted, indent=2, sort_keys=True).encode() + b"\n"
            self.backend.write_small_atomic(temp_namer(ns_path), ns_path, data)
        except OSError as exc:
            raise self._root_error(exc, f"cannot write {ns_path!r}") from exc

    def _setup_direct(self, wanted: bool | str) -> None:
        """Decide whether block files use ``O_DIRECT`` (see the ``o_direct`` key)."""
        if wanted is False:
            self.o_direct_reason = "disabled by config (o_direct: false)"
            return
        reason = self._direct_obstacle()
        if reason is None:
            self.backend.direct = True
            self.o_direct = True
            logger.info("fs tier: %s uses O_DIRECT", self.namespace_dir)
            return
        self.o_direct_reason = reason
        if wanted is True:
            raise DirectIONotUsableError(
                errno.EINVAL, f"fs tier root {self.root!r}: o_direct is true but O_DIRECT cannot be used: {reason}"
            )
        logger.info("fs tier: %s uses buffered I/O (no O_DIRECT: %s)", self.namespace_dir, reason)

    def _direct_obstacle(self) -> str | None:
        """Why ``O_DIRECT`` cannot be used here, None when it can."""
        if not isinstance(self.backend, LocalBackend):
            return "the root is not a local filesystem"
        if self.block_bytes % DIRECT_ALIGN:
            return f"block_bytes {self.block_bytes} is not a multiple of {DIRECT_ALIGN}"
        address = _view_address(self.primary_kv_view)
        if address is None:
            return "the primary buffer's address cannot be taken (read-only or not contiguous)"
        if address % DIRECT_ALIGN:
            return f"the primary buffer is not {DIRECT_ALIGN}-byte aligned (address {address:#x})"
        return LocalBackend.probe_direct(self.namespace_dir)

    def _trailer(self) -> memoryview:
        """This thread's page-aligned :data:`TRAILER_BYTES` buffer (an anonymous mapping)."""
        buf: memoryview | None = getattr(self._trailers, "buf", None)
        if buf is None:
            buf = memoryview(mmap.mmap(-1, TRAILER_BYTES))
            self._trailers.buf = buf
        return buf

    # -- paths -----------------------------------------------------------------
    @classmethod
    def inspector(cls, tier_config: Mapping[str, Any]) -> TierInspector:
        """A :class:`~tiering.fs.inspection.FsInspector` of a config entry's root (``tiering ls/gc/verify``)."""
        from tiering.fs.inspection import FsInspector

        return FsInspector.from_config(tier_config)

    def block_path(self, key: bytes) -> str:
        """Path of ``key``'s block file: ``<namespace dir>/<ab>/<key hex>.kvb``."""
        return block_path(self.namespace_dir, key)

    # -- the contract ------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """Whether ``key`` is stored: index first, then the configured filesystem fallback.

        Returns:
            True (stored and complete), False (absent), None (this process is
            writing it, an asynchronous probe is in flight, or the start-up
            scan is still running with ``lookup_fallback="off"``).
        """
        return self._lookup_index(key)

    def submit_store(self, job: JobMetadata) -> None:
        """Queue ``job``'s blocks for writing; returns at once (see the base class)."""
        self._enqueue(job, load=False)

    def submit_load(self, job: JobMetadata) -> None:
        """Queue ``job``'s blocks for reading into their primary slots; returns at once."""
        self._enqueue(job, load=True)

    def get_finished(self) -> Iterable[JobResult]:
        """The jobs finished since the last call, each exactly once (thread-safe)."""
        return self._take_finished()

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` most recently used in the tier's own LRU record (not atime)."""
        self._touch(keys)

    def wait_for_scan(self, timeout_s: float | None = None) -> bool:
        """Block until the start-up scan has indexed the namespace directory.

        Not needed for correctness (lookups work during the scan); useful for
        tools and tests. Returns False when ``timeout_s`` passes first.
        """
        return self._scan_done.wait(timeout_s)

    # -- one block ---------------------------------------------------------------
    def _ensure_dir(self, directory: str) -> None:
        if directory in self._made_dirs:
            return
        self.backend.makedirs(directory)
        self._made_dirs.add(directory)

    def _write_block(self, key: OffloadKey, block_id: int) -> None:
        """Encode and publish one block (the caller reserved its bytes)."""
        if len(key) > MAX_KEY_BYTES:
            raise ValueError(f"key of {len(key)} bytes; at most {MAX_KEY_BYTES}")
        final = self.block_path(key)
        payload = self.block(block_id)
        trailer = self._trailer()
        trailer[:HEADER_SIZE] = encode_header(self._digest, key, payload)
        trailer[HEADER_SIZE:] = _ZERO_TAIL
        directory = final.rsplit("/", 1)[0]
        self._ensure_dir(directory)
        tmp = temp_namer(final)
        try:
            self.backend.write_block(tmp, final, payload, trailer, self.fsync)
        except FileNotFoundError:
            # The shard directory was removed under us (cleanup by hand): recreate once.
            self._made_dirs.discard(directory)
            self._ensure_dir(directory)
            self.backend.write_block(tmp, final, payload, trailer, self.fsync)

    def _read_block(self, key: OffloadKey, block_id: int) -> int:
        """Read and verify one block into its slot; returns the stored size."""
        target = self.block(block_id)
        trailer = self._trailer()
        # read_block checks the file is exactly block_bytes + TRAILER_BYTES and read whole.
        size = self.backend.read_block(self.block_path(key), target, trailer, self.stored_block_bytes)
        verify_block(trailer[:HEADER_SIZE], target, self._digest, key)
        return size

    def _remove_bad(self, key: OffloadKey, exc: BaseException) -> bool | None:
        """Remove a block file that failed verification: True when gone, False when kept, None: not bad."""
        if isinstance(exc, BlockFormatError):
            return self.backend.remove(self.block_path(key))
        return None

    def _cause(self, exc: BaseException, load: bool, in_index: bool) -> str:
        return failure_cause(exc, load=load, in_index=in_index)

    def _delete(self, key: OffloadKey) -> bool:
        return self.backend.remove(self.block_path(key))

    def _stored_size(self, key: OffloadKey) -> int | None:
        return self.backend.size(self.block_path(key))

    # -- scanning --------------------------------------------------------------------
    def _scan(self, first: bool) -> None:
        """One pass over the namespace directory, merged into the index (see :mod:`tiering.fs.scanner`)."""
        token = self._begin_scan()
        result = scan_namespace(
            self.backend, self.namespace_dir, self.stored_block_bytes, self.stale_temp_s, self._is_stopping
        )
        new, vanished, resident = self._end_scan(token, result)
        self._evict_to_cap()
        log = logger.info if first else logger.debug
        log(
            "fs tier: %s scan of %s took %.3f s: %d blocks (%d bytes) indexed, %d new, %d vanished, "
            "%d stale temporaries and %d bad files removed",
            "startup" if first else "periodic",
            self.namespace_dir,
            self._last_scan_s,
            resident[0],
            resident[1],
            new,
            vanished,
            result.temps_removed,
            result.bad_removed,
        )

    def stats(self) -> dict[str, int | float]:
        """Counters of this tier instance (this process); see the package README for every key."""
        out = self._stats()
        out["scan_done"] = int(self._scan_done.is_set())
        out["o_direct"] = int(self.o_direct and self.backend.direct)
        return out

    def shutdown(self) -> None:
        """Stop the threads. Queued blocks fail their jobs; running ones finish; each job is reported once."""
        if self._stop_workers():
            self._rescanner.stop()
