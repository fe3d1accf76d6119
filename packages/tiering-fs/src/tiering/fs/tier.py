"""The filesystem secondary tier: blocks as files under a namespace directory.

Layout under ``root``::

    <root>/<namespace digest>/namespace.json        every namespace field, clear text
    <root>/<namespace digest>/<ab>/<key hex>.kvb

``ab`` is the low byte of XXH3-64 of the key in two hex digits (keys are
opaque, so they are hashed once more to spread them evenly): 256 shard
directories, so a store creates a directory only the first time its shard is
used (a deeper tree would cost a ``mkdir`` for most stores of a young cache)
and each directory holds 1/256 of the namespace, which ext4 and XFS index.
Each ``.kvb`` file is the block bytes (one primary slot, at offset 0)
followed by a 4096-byte trailer page: the
:mod:`tiering.core.format` header (128 bytes), then zeros. Every part of the
file is page aligned, so on a local disk that supports it (and with
page-aligned primary slots) blocks move with ``O_DIRECT`` between the slot
and the disk, bypassing the page cache.

A block is written to ``<key hex>.kvb.tmp.<host>.<pid>.<token>`` in the same
directory and published by rename, so a reader never sees a partial block;
every load is verified (header, namespace digest, key, length, checksum) and
anything that does not verify is a miss: the job fails, the file is removed,
the in-memory index forgets the key.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import itertools
import json
import logging
import mmap
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext, SecondaryTierManager
from tiering.core.format import HEADER_SIZE, MAX_KEY_BYTES, BlockFormatError, checksum, encode_header, verify_block
from tiering.core.inspection import TierInspector
from tiering.core.spec import OffloadingSpec
from tiering.fs.backend import DIRECT_ALIGN, TRAILER_BYTES, Backend, FsspecBackend, LocalBackend

logger = logging.getLogger(__name__)

BLOCK_SUFFIX = ".kvb"
TMP_MARK = ".tmp."
NAMESPACE_FILE = "namespace.json"
LOOKUP_FALLBACKS = ("auto", "stat", "async", "off")
_ZERO_TAIL = bytes(TRAILER_BYTES - HEADER_SIZE)
NEGATIVE_PROBE_TTL_S = 1.0
_MAX_NEGATIVE = 65536
_MAX_TASKS_PER_TAKE = 16  # blocks (or probes) one worker takes off a queue at a time

STORE_CAUSES = ("no_space", "io_error", "permission", "internal")
LOAD_CAUSES = (
    "checksum",
    "truncated",
    "foreign",
    "corrupt",
    "missing",
    "vanished",
    "io_error",
    "permission",
    "internal",
)
BASE_COUNTERS = (
    "lookups_hit",
    "lookups_miss",
    "lookups_pending",
    "blocks_stored",
    "bytes_stored",
    "stores_skipped_present",
    "blocks_loaded",
    "bytes_loaded",
    "store_jobs_failed",
    "load_jobs_failed",
    "bad_files_removed",
    "bad_files_kept",
    "evictions",
    "evicted_bytes",
    "temps_removed",
    "scans",
)

_HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"
_TMP_OWNER = re.compile(r"\.tmp\.([A-Za-z0-9_-]+)\.(\d+)\.[0-9a-f]+$")


def _os_cause(exc: BaseException, *, load: bool, in_index: bool = False) -> str:
    """Map an exception to a failure counter label."""
    if isinstance(exc, BlockFormatError):
        return exc.reason if exc.reason in LOAD_CAUSES else "corrupt"
    if isinstance(exc, FileNotFoundError):
        return ("vanished" if in_index else "missing") if load else "io_error"
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG):
            return "no_space" if not load else "io_error"
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return "permission"
        return "io_error"
    return "internal"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True
    return True


class RootNotUsableError(OSError):
    """The configured root cannot be created or written; the message names the path and the reason."""


class DirectIONotUsableError(OSError):
    """``o_direct: true`` was configured but ``O_DIRECT`` cannot be used; the message names the path and the reason."""


def _view_address(view: memoryview) -> int | None:
    """Address of the first byte of a writable C-contiguous buffer, None when it cannot be taken."""
    try:
        flat = view.cast("B") if view.ndim != 1 or view.format != "B" else view
        return ctypes.addressof(ctypes.c_char.from_buffer(flat))
    except (TypeError, ValueError, BufferError):
        return None


class _Job:
    """Book-keeping of one submitted job, split into one task per block."""

    __slots__ = ("cause", "failed_at", "loaded", "lock", "meta", "ok", "remaining")

    def __init__(self, meta: JobMetadata) -> None:
        self.meta = meta
        self.remaining = len(meta.keys)
        self.ok = True
        self.cause = ""
        self.failed_at: int | None = None  # lowest block index that failed
        self.loaded: list[int] = []  # indices of blocks loaded and verified
        self.lock = threading.Lock()


class FsspecSecondaryTierManager(SecondaryTierManager):
    """A secondary tier storing one file per block on a local disk or any fsspec filesystem.

    Config (``secondary_tiers`` entry)::

        {"type": "fs", "root": "/var/cache/tiering", "capacity_bytes": 107374182400}

    Each stored block occupies ``block_bytes + 4096`` bytes (payload, then a
    trailer page holding the header); ``capacity_bytes`` counts those sizes.
    See the package README for the full reference, the layout and the
    multi-process semantics.

    Args:
        offloading_spec: the stack's spec (see :class:`~tiering.core.SecondaryTierManager`).
        primary_kv_view: the primary tier's ``(num_blocks, block_bytes)`` view.
        tier_type: the name the factory resolved this tier by.
        root: a local directory path or an fsspec URL (``file://...``,
            ``memory://...``, ``s3://bucket/prefix`` with s3fs installed...).
            Created when absent.
        storage_options: keyword arguments for the fsspec filesystem
            (credentials, endpoint...); ignored for plain local paths.
        n_read_threads: threads serving loads (and existence probes), >= 1.
            With no load or probe queued, a reader helps with stores, one
            block at a time, so a load arriving waits at most one block
            write for it.
        n_write_threads: threads serving stores, >= 1. Loads are preferred:
            every idle thread, reader or writer, takes a queued load before a
            queued store (stores only keep primary slots pinned; loads are on
            a request's critical path). The same split as vLLM's fs tier
            (read-priority and write-priority threads).
        fsync: fsync each block file and its directory at publish (local
            only). Off by default: it costs about 20-50% of store throughput
            on this class of disk; without it a power loss (not a process
            crash) can leave a published file empty or torn, which the
            verification on load then rejects as a miss.
        capacity_bytes: optional cap, in bytes, on the namespace directory's
            measured usage (sum of block file sizes); least recently used
            blocks are evicted to make room. At least one stored block.
        stale_temp_s: temporaries older than this (seconds) are removed by
            the start-up scan and periodic rescans even when their owner
            cannot be checked (another host); temporaries of a dead process
            on this host are removed at once.
        rescan_interval_s: seconds between background rescans of the
            namespace directory that re-measure usage (blocks of other
            processes included) and evict down to the cap. Only with
            ``capacity_bytes``; 0 disables.
        lookup_fallback: how a lookup of a key missing from the in-memory
            index checks the filesystem (blocks of other processes):
            ``"stat"`` (a synchronous ``os.stat``; local default),
            ``"async"`` (a background probe, the lookup answers None
            meanwhile; default for non-local roots), ``"off"``, or
            ``"auto"``.
        o_direct: move blocks with ``O_DIRECT`` on a local root (no page
            cache; much faster from a ``/dev/shm`` primary buffer):
            ``"auto"`` uses it when a probe write/read in the namespace
            directory succeeds and every primary slot is page aligned
            (``block_bytes`` a multiple of 4096, the buffer's base address
            too), else buffered I/O; ``True`` requires it; ``False``
            never. The file layout is the same either way. The outcome is
            :attr:`o_direct` (and ``stats()["o_direct"]``).
        startup_scan_wait_s: seconds the constructor waits for the start-up
            scan of the namespace directory (it runs on a background
            thread), so that the first lookups after a restart are answered
            from the in-memory index instead of ``lookup_fallback``; a
            larger namespace keeps scanning in the background after the
            wait. 0 returns at once.

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
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        root: str | os.PathLike[str] = "",
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
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        label = f"tier {tier_type!r}"
        if not isinstance(root, (str, os.PathLike)) or not os.fspath(root):
            raise TypeError(f"{label}: root must be a non-empty path or URL string, got {root!r}")
        if storage_options is not None and not isinstance(storage_options, dict):
            raise TypeError(f"{label}: storage_options must be an object, got {storage_options!r}")
        for name, value in (("n_read_threads", n_read_threads), ("n_write_threads", n_write_threads)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{label}: {name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"{label}: {name} must be >= 1, got {value}")
        if not isinstance(fsync, bool):
            raise TypeError(f"{label}: fsync must be true or false, got {fsync!r}")
        if o_direct is not True and o_direct is not False and o_direct != "auto":
            if not isinstance(o_direct, str):
                raise TypeError(f'{label}: o_direct must be true, false or "auto", got {o_direct!r}')
            raise ValueError(f'{label}: o_direct must be true, false or "auto", got {o_direct!r}')
        self.stored_block_bytes = self.block_bytes + TRAILER_BYTES
        if capacity_bytes is not None:
            if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int):
                raise TypeError(f"{label}: capacity_bytes must be an int or null, got {capacity_bytes!r}")
            if capacity_bytes < self.stored_block_bytes:
                raise ValueError(
                    f"{label}: capacity_bytes {capacity_bytes} is smaller than one stored block "
                    f"({self.stored_block_bytes} bytes = {self.block_bytes} block + {TRAILER_BYTES} trailer)"
                )
        seconds = (
            ("stale_temp_s", stale_temp_s),
            ("rescan_interval_s", rescan_interval_s),
            ("startup_scan_wait_s", startup_scan_wait_s),
        )
        for name, fvalue in seconds:
            if isinstance(fvalue, bool) or not isinstance(fvalue, (int, float)):
                raise TypeError(f"{label}: {name} must be a number of seconds, got {fvalue!r}")
            if fvalue < 0:
                raise ValueError(f"{label}: {name} must be >= 0, got {fvalue}")
        if lookup_fallback not in LOOKUP_FALLBACKS:
            raise ValueError(f"{label}: lookup_fallback must be one of {LOOKUP_FALLBACKS}, got {lookup_fallback!r}")

        self.fsync = fsync
        self.capacity_bytes = capacity_bytes
        self.stale_temp_s = float(stale_temp_s)
        self.rescan_interval_s = float(rescan_interval_s)
        self.n_read_threads = n_read_threads
        self.n_write_threads = n_write_threads
        self.namespace = offloading_spec.namespace
        self._digest = self.namespace.digest_bytes

        self.backend, base = self._open_backend(os.fspath(root), storage_options or {})
        self.root = base
        self.namespace_dir = f"{base.rstrip('/')}/{self.namespace.digest}"
        if lookup_fallback == "auto":
            lookup_fallback = "stat" if self.backend.is_local else "async"
        self.lookup_fallback = lookup_fallback

        # State shared by the scheduler thread, the workers and the scanner; guarded by _lock.
        self._lock = threading.Lock()
        # Idle readers and writers wait on their own condition (a new task wakes one thread, not all);
        # writes waiting for room under the cap wait on _space.
        self._readers_cv = threading.Condition(self._lock)
        self._writers_cv = threading.Condition(self._lock)
        self._space = threading.Condition(self._lock)
        self._index: collections.OrderedDict[OffloadKey, int] = collections.OrderedDict()  # LRU first
        self._resident_bytes = 0
        self._reserved_bytes = 0
        self._writing: collections.Counter[OffloadKey] = collections.Counter()
        self._probing: set[OffloadKey] = set()
        self._negative: collections.OrderedDict[OffloadKey, float] = collections.OrderedDict()
        self._unremovable: set[OffloadKey] = set()
        self._added_during_scan: set[OffloadKey] | None = None
        self._removed_during_scan: set[OffloadKey] | None = None
        self._made_dirs: set[str] = set()
        self._counters: collections.Counter[str] = collections.Counter()
        for name in (*BASE_COUNTERS, *(f"store_failed_{c}" for c in STORE_CAUSES)):
            self._counters[name] = 0
        for cause in LOAD_CAUSES:
            self._counters[f"load_failed_{cause}"] = 0
        self._in_flight_jobs = 0
        self._loads: collections.deque[tuple[_Job, int]] = collections.deque()
        self._stores: collections.deque[tuple[_Job, int]] = collections.deque()
        self._probes: collections.deque[OffloadKey] = collections.deque()
        self._finished: collections.deque[JobResult] = collections.deque()
        self._stopping = False
        self._tmp_tokens = itertools.count()
        self._scan_done = threading.Event()
        self._last_scan_s = 0.0
        self._wake_scanner = threading.Event()

        self._probe_root()
        self.o_direct = False
        self.o_direct_reason = ""
        self._setup_direct(o_direct)
        self._trailers = threading.local()
        self._threads: list[threading.Thread] = []
        for i in range(n_read_threads):
            self._start_thread(f"tiering-fs-read-{i}", self._worker, True)
        for i in range(n_write_threads):
            self._start_thread(f"tiering-fs-write-{i}", self._worker, False)
        self._scanner = threading.Thread(target=self._scanner_main, name="tiering-fs-scan", daemon=True)
        self._scanner.start()
        if startup_scan_wait_s > 0:
            self._scan_done.wait(startup_scan_wait_s)

    # -- construction ---------------------------------------------------------
    @staticmethod
    def _open_backend(root: str, storage_options: dict[str, Any]) -> tuple[Backend, str]:
        if "://" not in root and "::" not in root:
            return LocalBackend(), os.path.abspath(os.path.expanduser(root))
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        try:
            fs, path = fsspec.core.url_to_fs(root, **storage_options)
        except (ValueError, ImportError) as exc:
            raise ValueError(f"fs tier: cannot open root {root!r}: {exc}") from exc
        if isinstance(fs, LocalFileSystem):
            return LocalBackend(), os.path.abspath(path)
        return FsspecBackend(fs), str(path).rstrip("/") or "/"

    def _tmp_name(self, final: str) -> str:
        return f"{final}{TMP_MARK}{_HOST}.{os.getpid()}.{next(self._tmp_tokens):x}{secrets.token_hex(4)}"

    def _probe_root(self) -> None:
        """Create the namespace directory, prove it writable, publish ``namespace.json``."""
        path = self.namespace_dir
        try:
            self.backend.makedirs(path)
        except OSError as exc:
            raise RootNotUsableError(
                exc.errno or errno.EIO,
                f"fs tier root {self.root!r}: cannot create directory {path!r}: {exc.strerror or exc}",
            ) from exc
        probe = self._tmp_name(f"{path}/.probe")
        try:
            self.backend.write_block(
                probe, f"{path}/.probe-{_HOST}-{os.getpid()}", memoryview(b"probe"), memoryview(b""), False
            )
            self.backend.remove(f"{path}/.probe-{_HOST}-{os.getpid()}")
        except OSError as exc:
            raise RootNotUsableError(
                exc.errno or errno.EIO,
                f"fs tier root {self.root!r}: directory {path!r} is not writable: {exc.strerror or exc}",
            ) from exc
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
            self.backend.write_small_atomic(self._tmp_name(ns_path), ns_path, data)
        except OSError as exc:
            raise RootNotUsableError(
                exc.errno or errno.EIO,
                f"fs tier root {self.root!r}: cannot write {ns_path!r}: {exc.strerror or exc}",
            ) from exc

    def _setup_direct(self, wanted: bool | str) -> None:
        """Decide whether block files use ``O_DIRECT`` (see the ``o_direct`` argument)."""
        if wanted is False:
            self.o_direct_reason = "disabled by config (o_direct: false)"
            return
        reason = self._direct_obstacle()
        if reason is None:
            assert isinstance(self.backend, LocalBackend)
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

    def _start_thread(self, name: str, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- paths -----------------------------------------------------------------
    @classmethod
    def inspector(cls, tier_config: Mapping[str, Any]) -> TierInspector:
        """A :class:`~tiering.fs.inspection.FsInspector` of a config entry's root (``tiering ls/gc/verify``)."""
        from tiering.fs.inspection import FsInspector

        return FsInspector.from_config(tier_config)

    def block_path(self, key: bytes) -> str:
        """Path of ``key``'s block file: ``<namespace dir>/<ab>/<key hex>.kvb``."""
        return f"{self.namespace_dir}/{checksum(key) & 0xFF:02x}/{key.hex()}{BLOCK_SUFFIX}"

    # -- the contract ------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """Whether ``key`` is stored: index first, then the configured filesystem fallback.

        Returns:
            True (stored and complete), False (absent), None (this process is
            writing it, an asynchronous probe is in flight, or the start-up
            scan is still running with ``lookup_fallback="off"``).
        """
        with self._lock:
            if self._writing.get(key):
                self._counters["lookups_pending"] += 1
                return None
            if key in self._index:
                self._index.move_to_end(key)
                self._counters["lookups_hit"] += 1
                return True
            if key in self._unremovable:
                self._counters["lookups_miss"] += 1
                return False
            mode = self.lookup_fallback
            if mode == "off":
                if self._scan_done.is_set():
                    self._counters["lookups_miss"] += 1
                    return False
                self._counters["lookups_pending"] += 1
                return None
            if mode == "async":
                expiry = self._negative.get(key)
                if expiry is not None and expiry > time.monotonic():
                    self._counters["lookups_miss"] += 1
                    return False
                if key not in self._probing and not self._stopping:
                    self._probing.add(key)
                    self._probes.append(key)
                    self._readers_cv.notify()
                self._counters["lookups_pending"] += 1
                return None
        # "stat": outside the lock, a few microseconds on a local filesystem.
        found = self._stat_adopt(key)
        with self._lock:
            self._counters["lookups_hit" if found else "lookups_miss"] += 1
        return found

    def _stat_adopt(self, key: OffloadKey) -> bool:
        """Check the filesystem for ``key``; index it when a complete-sized file exists."""
        try:
            size = self.backend.size(self.block_path(key))
        except OSError:
            return False
        if size != self.stored_block_bytes:
            return False
        with self._lock:
            if self._writing.get(key):
                return False
            self._index_add(key, size)
        return True

    def _index_add(self, key: OffloadKey, size: int) -> None:
        """Add or refresh ``key`` as most recently used (caller holds the lock)."""
        old = self._index.get(key)
        if old is not None:
            self._resident_bytes -= old
        self._index[key] = size
        self._index.move_to_end(key)
        self._resident_bytes += size
        self._negative.pop(key, None)
        if self._added_during_scan is not None:
            self._added_during_scan.add(key)

    def _index_drop(self, key: OffloadKey) -> bool:
        """Forget ``key`` (caller holds the lock); True when it was indexed."""
        if self._removed_during_scan is not None:
            # A scan in progress may have listed its file already: do not let it resurrect the key.
            self._removed_during_scan.add(key)
        size = self._index.pop(key, None)
        if size is None:
            return False
        self._resident_bytes -= size
        return True

    def submit_store(self, job: JobMetadata) -> None:
        """Queue ``job``'s blocks for writing; returns at once (see the base class)."""

        def note(key: OffloadKey) -> None:
            if key not in self._index:
                self._writing[key] += 1

        self._enqueue(job, self._stores, note)

    def submit_load(self, job: JobMetadata) -> None:
        """Queue ``job``'s blocks for reading into their primary slots; returns at once."""

        def note(key: OffloadKey) -> None:
            if key in self._index:
                self._index.move_to_end(key)

        self._enqueue(job, self._loads, note)

    def _enqueue(
        self, job: JobMetadata, queue: collections.deque[tuple[_Job, int]], note: Callable[[OffloadKey], None]
    ) -> None:
        """Queue one task per block of ``job`` (``note`` runs per key under the lock)."""
        state = _Job(job)
        with self._lock:
            if self._stopping or not job.keys:
                self._finished.append(JobResult(job.job_id, not self._stopping))
                return
            self._in_flight_jobs += 1
            for i, key in enumerate(job.keys):
                note(key)
                queue.append((state, i))
            n = len(job.keys)
            self._readers_cv.notify(n)
            self._writers_cv.notify(n)

    def get_finished(self) -> Iterable[JobResult]:
        """The jobs finished since the last call, each exactly once (thread-safe)."""
        out: list[JobResult] = []
        while True:
            try:
                out.append(self._finished.popleft())
            except IndexError:
                return out

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` most recently used in the tier's own LRU record (not atime)."""
        with self._lock:
            for key in keys:
                if key in self._index:
                    self._index.move_to_end(key)

    def has_pending_work(self) -> bool:
        """Whether a job is queued or running."""
        with self._lock:
            return self._in_flight_jobs > 0

    def wait_for_scan(self, timeout_s: float | None = None) -> bool:
        """Block until the start-up scan has indexed the namespace directory.

        Not needed for correctness (lookups work during the scan); useful for
        tools and tests. Returns False when ``timeout_s`` passes first.
        """
        return self._scan_done.wait(timeout_s)

    def stats(self) -> dict[str, int | float]:
        """Counters of this tier instance (this process).

        Keys: ``lookups_hit`` / ``lookups_miss`` / ``lookups_pending``;
        ``blocks_stored`` / ``bytes_stored`` (payload bytes written),
        ``stores_skipped_present``; ``blocks_loaded`` / ``bytes_loaded``;
        ``store_failed_<cause>`` per block for cause in ``no_space``,
        ``io_error``, ``permission``, ``internal``; ``load_failed_<cause>``
        per block for cause in ``checksum``, ``truncated``, ``foreign``,
        ``corrupt``, ``missing``, ``vanished``, ``io_error``,
        ``permission``, ``internal``; ``store_jobs_failed`` /
        ``load_jobs_failed``; ``bad_files_removed``; ``evictions`` /
        ``evicted_bytes``; ``temps_removed``; ``resident_blocks`` /
        ``resident_bytes`` (indexed files, bytes on disk incl. trailers);
        ``capacity_bytes`` (0 = unlimited); ``in_flight_jobs``;
        ``scans`` / ``scan_done`` (0/1) / ``last_scan_s``; ``o_direct``
        (1 when block files use ``O_DIRECT``).
        """
        with self._lock:
            out: dict[str, int | float] = dict(self._counters)
            out["resident_blocks"] = len(self._index)
            out["resident_bytes"] = self._resident_bytes
            out["capacity_bytes"] = self.capacity_bytes or 0
            out["in_flight_jobs"] = self._in_flight_jobs
            out["scan_done"] = int(self._scan_done.is_set())
            out["last_scan_s"] = self._last_scan_s
        out["o_direct"] = int(self.o_direct)
        return out

    def shutdown(self) -> None:
        """Stop the threads. Queued blocks fail their jobs; running ones finish; each job is reported once."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            dropped = list(self._loads) + list(self._stores)
            self._loads.clear()
            self._stores.clear()
            self._probes.clear()
            self._probing.clear()
            for cv in (self._readers_cv, self._writers_cv, self._space):
                cv.notify_all()
        for state, i in dropped:
            self._finish_block(state, i, False, "shutdown")
        self._wake_scanner.set()
        for thread in self._threads:
            thread.join()
        self._scanner.join(timeout=5.0)

    # -- workers -------------------------------------------------------------------
    @staticmethod
    def _take(queue: collections.deque[Any], parts: int) -> list[Any]:
        """Pop ``1/parts`` of ``queue`` (caller holds the lock): 1 to :data:`_MAX_TASKS_PER_TAKE` tasks.

        Taking several tasks rather than one cuts the per-block locking and
        wake-ups when many blocks are queued; a short queue is still spread
        over every thread, one task each.
        """
        take = min(_MAX_TASKS_PER_TAKE, max(1, len(queue) // parts))
        return [queue.popleft() for _ in range(take)]

    def _worker(self, is_reader: bool) -> None:
        # Writers take their whole share of stores (throughput is what counts); loads are taken a
        # quarter share at a time, so no thread is left with a long tail of blocks (a promotion is
        # done when its last block is).
        load_parts = 4 * (self.n_read_threads + self.n_write_threads)
        while True:
            with self._lock:
                while True:
                    if self._loads:
                        kind, tasks = "load", self._take(self._loads, load_parts)
                        break
                    if is_reader and self._probes:
                        kind, tasks = "probe", self._take(self._probes, self.n_read_threads)
                        break
                    if self._stores:
                        # A reader helps one block at a time, to be back for the next load soon.
                        kind = "store"
                        if is_reader:
                            tasks = [self._stores.popleft()]
                        else:
                            tasks = self._take(self._stores, self.n_write_threads)
                        break
                    if self._stopping:
                        return
                    (self._readers_cv if is_reader else self._writers_cv).wait()
            for task in tasks:
                if self._stopping and kind != "probe":
                    self._finish_block(task[0], task[1], False, "shutdown")  # taken, not started
                    continue
                try:
                    if kind == "probe":
                        self._probe(task)
                    else:
                        self._run_block(task[0], task[1], load=kind == "load")
                except BaseException:  # never let a worker die silently
                    logger.exception("fs tier worker: unexpected error in %s task", kind)
                    if kind != "probe":
                        self._finish_block(task[0], task[1], False, "internal")

    def _run_block(self, state: _Job, i: int, load: bool) -> None:
        if load and state.failed_at is not None and i > state.failed_at:
            # Blocks after a failed one are not used by the request (it recomputes from there):
            # skip them, so each key gets at most one read attempt per job.
            self._finish_block(state, i, False, "")
            return
        try:
            if load:
                self._load_one(state.meta.keys[i], state.meta.block_ids[i])
            else:
                self._store_one(state.meta.keys[i], state.meta.block_ids[i])
        except Exception as exc:
            key = state.meta.keys[i]
            with self._lock:
                in_index = key in self._index
            cause = _os_cause(exc, load=load, in_index=in_index)
            if cause == "internal":
                logger.exception("fs tier: %s of %s failed", "load" if load else "store", key.hex())
            else:
                logger.warning("fs tier: %s of %s failed (%s): %s", "load" if load else "store", key.hex(), cause, exc)
            if load:
                self._on_load_failure(key, exc)
            self._finish_block(state, i, False, cause)
            return
        self._finish_block(state, i, True, "")

    def _finish_block(self, state: _Job, i: int, ok: bool, cause: str) -> None:
        """Count one block of ``state`` done; report the job when it was the last one."""
        meta = state.meta
        with self._lock:
            if not meta.is_promotion:
                key = meta.keys[i]
                if self._writing.get(key):
                    self._writing[key] -= 1
                    if not self._writing[key]:
                        del self._writing[key]
            if cause and cause != "shutdown":
                prefix = "load" if meta.is_promotion else "store"
                self._counters[f"{prefix}_failed_{cause}"] += 1
        with state.lock:
            state.remaining -= 1
            if ok and meta.is_promotion:
                state.loaded.append(i)
            if not ok:
                state.failed_at = i if state.failed_at is None else min(state.failed_at, i)
                if state.ok:
                    state.ok = False
                    state.cause = cause
            done = state.remaining == 0
        if done:
            with self._lock:
                self._in_flight_jobs -= 1
                if not state.ok:
                    self._counters["load_jobs_failed" if meta.is_promotion else "store_jobs_failed"] += 1
                successful = None
                if not state.ok and meta.is_promotion and state.loaded:
                    successful = [meta.keys[i] for i in sorted(state.loaded)]
                self._finished.append(JobResult(meta.job_id, state.ok, successful))

    def _ensure_dir(self, directory: str) -> None:
        if directory in self._made_dirs:
            return
        self.backend.makedirs(directory)
        with self._lock:
            self._made_dirs.add(directory)

    def _store_one(self, key: OffloadKey, block_id: int) -> None:
        if len(key) > MAX_KEY_BYTES:
            raise ValueError(f"key of {len(key)} bytes; at most {MAX_KEY_BYTES}")
        with self._lock:
            if key in self._index:
                self._counters["stores_skipped_present"] += 1
                return
        final = self.block_path(key)
        if self.backend.size(final) == self.stored_block_bytes:
            # Published by another process (or before a restart): do not rewrite it.
            with self._lock:
                self._index_add(key, self.stored_block_bytes)
                self._unremovable.discard(key)
                self._counters["stores_skipped_present"] += 1
            return
        size = self.stored_block_bytes
        self._reserve(size)
        try:
            payload = self.block(block_id)
            trailer = self._trailer()
            trailer[:HEADER_SIZE] = encode_header(self._digest, key, payload)
            trailer[HEADER_SIZE:] = _ZERO_TAIL
            directory = final.rsplit("/", 1)[0]
            self._ensure_dir(directory)
            tmp = self._tmp_name(final)
            try:
                self.backend.write_block(tmp, final, payload, trailer, self.fsync)
            except FileNotFoundError:
                # The shard directory was removed under us (cleanup by hand): recreate once.
                with self._lock:
                    self._made_dirs.discard(directory)
                self._ensure_dir(directory)
                self.backend.write_block(tmp, final, payload, trailer, self.fsync)
        except BaseException:
            with self._lock:
                self._reserved_bytes -= size
                self._space.notify_all()
            raise
        with self._lock:
            self._reserved_bytes -= size
            self._index_add(key, size)
            self._unremovable.discard(key)
            self._counters["blocks_stored"] += 1
            self._counters["bytes_stored"] += self.block_bytes
            self._space.notify_all()

    def _reserve(self, size: int) -> None:
        """Reserve ``size`` bytes under the cap, evicting least recently used blocks first."""
        if self.capacity_bytes is None:
            with self._lock:
                self._reserved_bytes += size
            return
        cap = self.capacity_bytes
        while True:
            victims: list[tuple[OffloadKey, int]] = []
            with self._lock:
                while self._index and self._resident_bytes + self._reserved_bytes + size > cap:
                    key, vsize = next(iter(self._index.items()))
                    self._index_drop(key)
                    victims.append((key, vsize))
                fits = self._resident_bytes + self._reserved_bytes + size <= cap
                if fits or self._reserved_bytes == 0 or self._stopping:
                    self._reserved_bytes += size
                    reserved = True
                else:
                    reserved = False
                self._counters["evictions"] += len(victims)
                self._counters["evicted_bytes"] += sum(v for _, v in victims)
            for key, _ in victims:
                self.backend.remove(self.block_path(key))
            if reserved:
                return
            # Every byte of the cap is held by writes in flight: wait for one to publish.
            with self._lock:
                self._space.wait(0.05)

    def _load_one(self, key: OffloadKey, block_id: int) -> None:
        path = self.block_path(key)
        target = self.block(block_id)
        trailer = self._trailer()
        # read_block checks the file is exactly block_bytes + TRAILER_BYTES and read whole.
        size = self.backend.read_block(path, target, trailer, self.stored_block_bytes)
        verify_block(trailer[:HEADER_SIZE], target, self._digest, key)
        with self._lock:
            self._index_add(key, size)
            self._counters["blocks_loaded"] += 1
            self._counters["bytes_loaded"] += self.block_bytes

    def _on_load_failure(self, key: OffloadKey, exc: BaseException) -> None:
        """Invalidate ``key``; remove its file when the file itself is bad."""
        removed = True
        if isinstance(exc, BlockFormatError):
            removed = self.backend.remove(self.block_path(key))
            with self._lock:
                self._counters["bad_files_removed" if removed else "bad_files_kept"] += 1
        with self._lock:
            self._index_drop(key)
            if not removed:
                # Never answer True again for a file we could not remove (no retry loop).
                self._unremovable.add(key)

    def _probe(self, key: OffloadKey) -> None:
        """Background existence check for ``lookup_fallback="async"``."""
        try:
            size = self.backend.size(self.block_path(key))
        except Exception:
            logger.warning("fs tier: existence probe of %s failed", key.hex(), exc_info=True)
            size = None
        with self._lock:
            self._probing.discard(key)
            if size == self.stored_block_bytes and not self._writing.get(key):
                self._index_add(key, size)
            elif key not in self._index:
                self._negative[key] = time.monotonic() + NEGATIVE_PROBE_TTL_S
                self._negative.move_to_end(key)
                while len(self._negative) > _MAX_NEGATIVE:
                    self._negative.popitem(last=False)

    # -- scanning --------------------------------------------------------------------
    def _scanner_main(self) -> None:
        first = True
        while True:
            try:
                self._scan(first)
            except Exception:
                logger.exception("fs tier: scan of %s failed", self.namespace_dir)
            finally:
                if first:
                    self._scan_done.set()
                first = False
            interval = self.rescan_interval_s if self.capacity_bytes is not None else 0.0
            if interval <= 0:
                return
            self._wake_scanner.wait(interval)
            self._wake_scanner.clear()
            with self._lock:
                if self._stopping:
                    return

    def _scan(self, first: bool) -> None:
        """List the namespace directory: index blocks, remove stale temporaries and bad files, evict to cap."""
        started = time.monotonic()
        with self._lock:
            self._added_during_scan = set()
            self._removed_during_scan = set()
        found: dict[OffloadKey, tuple[int, float]] = {}
        temps_removed = bad_removed = 0
        now = time.time()
        for entry in self.backend.scan(self.namespace_dir):
            with self._lock:
                if self._stopping:
                    break
            name = entry.name
            if TMP_MARK in name:
                if self._stale_temp(name, entry.mtime, now) and self.backend.remove(entry.path):
                    temps_removed += 1
                continue
            if not name.endswith(BLOCK_SUFFIX):
                continue
            try:
                key = OffloadKey(bytes.fromhex(name[: -len(BLOCK_SUFFIX)]))
            except ValueError:
                continue
            if entry.path != self.block_path(key):
                continue  # not where this tier would put it: leave it alone
            if entry.size != self.stored_block_bytes:
                # Final names appear only complete: a wrong size is damage (or a torn file after power loss).
                if self.backend.remove(entry.path):
                    bad_removed += 1
                continue
            found[key] = (entry.size, entry.mtime)
        with self._lock:
            added = self._added_during_scan or set()
            removed = self._removed_during_scan or set()
            self._added_during_scan = self._removed_during_scan = None
            new = [
                k
                for k in found
                if k not in self._index and k not in removed and k not in self._unremovable and not self._writing.get(k)
            ]
            new.sort(key=lambda k: found[k][1], reverse=True)  # newest first, each pushed to the LRU end
            for key in new:
                size = found[key][0]
                self._index[key] = size
                self._index.move_to_end(key, last=False)
                self._resident_bytes += size
            vanished = [k for k in self._index if k not in found and k not in added]
            for key in vanished:
                self._index_drop(key)
            self._counters["temps_removed"] += temps_removed
            self._counters["bad_files_removed"] += bad_removed
            self._counters["scans"] += 1
            elapsed = time.monotonic() - started
            self._last_scan_s = elapsed
            resident = (len(self._index), self._resident_bytes)
        self._evict_to_cap()
        log = logger.info if first else logger.debug
        log(
            "fs tier: %s scan of %s took %.3f s: %d blocks (%d bytes) indexed, %d new, %d vanished, "
            "%d stale temporaries and %d bad files removed",
            "startup" if first else "periodic",
            self.namespace_dir,
            elapsed,
            resident[0],
            resident[1],
            len(new),
            len(vanished),
            temps_removed,
            bad_removed,
        )

    def _stale_temp(self, name: str, mtime: float, now: float) -> bool:
        """Whether a temporary can be removed without harming a live writer."""
        match = _TMP_OWNER.search(name)
        if match is not None and match.group(1) == _HOST:
            pid = int(match.group(2))
            if pid == os.getpid():
                return False  # ours: our own writer removes it on failure
            if not _pid_alive(pid):
                return True
        return mtime > 0 and now - mtime > self.stale_temp_s

    def _evict_to_cap(self) -> None:
        if self.capacity_bytes is None:
            return
        victims: list[OffloadKey] = []
        with self._lock:
            while self._index and self._resident_bytes + self._reserved_bytes > self.capacity_bytes:
                key, size = next(iter(self._index.items()))
                self._index_drop(key)
                victims.append(key)
                self._counters["evictions"] += 1
                self._counters["evicted_bytes"] += size
        for key in victims:
            self.backend.remove(self.block_path(key))
