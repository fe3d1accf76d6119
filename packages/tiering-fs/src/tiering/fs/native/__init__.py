"""The native batch path of the local back end: a whole share of a job (up to 16 blocks) in one C call.

``libblockio.so`` (built from ``_blockio.c`` next to this module by the
package's hatchling build hook) is a plain shared library without the Python
C API, loaded with :mod:`ctypes`; ctypes releases the GIL for the whole call,
so the I/O threads do no Python work per block: per share, one call hashes
(XXH3-64, the vendored ``xxhash.h``), writes the trailer header, creates the
temporary file, writes, renames, and on load reads and verifies every block.
The files are byte for byte those of the pure-Python path
(:mod:`tiering.fs.blocks`, :mod:`tiering.fs.io.local`), so either path reads
what the other wrote.

The pure-Python path is used when the library is missing (built without a C
compiler: the wheel then warns at build time), cannot be loaded, reports
another ABI version, or when ``TIERING_FS_NATIVE=0`` is set in the
environment (read when a tier opens). :func:`status` says which path and
why; ``tiering check --probe`` and the tier's ``stats()`` (``native_io``)
report it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tiering.core.format import (
    MAX_KEY_BYTES,
    CorruptBlockError,
    ForeignBlockError,
    TruncatedBlockError,
)
from tiering.fs.errors import NotRegularFileError

LIBRARY_NAME = "libblockio.so"
"""File name of the library, next to this module."""

ABI_VERSION = 2
"""The ``tkvb_abi_version()`` this module speaks."""

ENV_VAR = "TIERING_FS_NATIVE"
"""Environment variable: ``0`` (or ``false``, ``off``, ``no``) selects the pure-Python path."""

TRUNCATED, CHECKSUM, FOREIGN, BAD_SLOT, NOT_REGULAR = -1, -2, -3, -4, -5
"""Negative per-block result codes of the library (positive ones are errnos)."""

NATIVE_MIN_SHARE = 4
"""Fewest blocks per worker share on the native path (the I/O pool's ``min_batch``): a call's fixed cost
(the pool's hand-off, index and job settling in Python) is paid per share, so a job is not cut into
one-block shares just because threads are idle."""

_DIRECT, _FSYNC = 1, 2
_SHARDS = 256
_OPEN_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

_i32p = ctypes.POINTER(ctypes.c_int32)
_i64p = ctypes.POINTER(ctypes.c_int64)
_COMMON: list[Any] = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_int,
    ctypes.c_void_p,
    _i64p,
    ctypes.c_int64,
]
_COMMON += [ctypes.c_uint64, ctypes.c_int, _i32p]


def _disabled_by_env() -> bool:
    return os.environ.get(ENV_VAR, "").strip().lower() in ("0", "false", "off", "no")


@functools.lru_cache(maxsize=1)
def _load() -> tuple[ctypes.CDLL | None, str]:
    """The loaded library and "", or None and why not (cached: loaded once per process)."""
    path = Path(__file__).with_name(LIBRARY_NAME)
    if not path.is_file():
        return None, f"{LIBRARY_NAME} not built (no C compiler when this package was built)"
    try:
        lib = ctypes.CDLL(str(path))
        version = lib.tkvb_abi_version()
    except (OSError, AttributeError) as exc:
        return None, f"{path} cannot be loaded: {exc}"
    if version != ABI_VERSION:
        return None, f"{path} has ABI version {version}, this module needs {ABI_VERSION}"
    lib.tkvb_store.argtypes = [ctypes.c_int, _i32p, ctypes.c_char_p, *_COMMON]
    lib.tkvb_load.argtypes = [ctypes.c_int, _i32p, *_COMMON]
    lib.tkvb_store.restype = lib.tkvb_load.restype = ctypes.c_int
    lib.tkvb_xxh3_64.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.tkvb_xxh3_64.restype = ctypes.c_uint64
    return lib, ""


def library() -> ctypes.CDLL | None:
    """The library when the native path is to be used now, else None (see :func:`status`)."""
    return None if _disabled_by_env() else _load()[0]


def status() -> str:
    """Which block I/O path a local fs tier opened now would use, and why (one line)."""
    if _disabled_by_env():
        return f"pure-Python block I/O ({ENV_VAR}=0)"
    lib, reason = _load()
    return f"native batch block I/O ({LIBRARY_NAME})" if lib is not None else f"pure-Python block I/O ({reason})"


def block_error(code: int, path: str) -> Exception:
    """The exception the pure-Python path would raise for a non-zero result ``code`` of block ``path``."""
    if code == TRUNCATED:
        return TruncatedBlockError(f"{path}: wrong size")
    if code == CHECKSUM:
        return CorruptBlockError(f"{path}: header or payload checksum mismatch")
    if code == FOREIGN:
        return ForeignBlockError(f"{path}: block of another namespace, key, length or format version")
    if code == BAD_SLOT:
        return IndexError(f"{path}: block id outside the primary buffer")
    if code == NOT_REGULAR:
        return NotRegularFileError(errno.ENXIO, "not a regular file", path)
    if code == errno.ENOENT:
        return FileNotFoundError(code, os.strerror(code), path)
    return OSError(code, os.strerror(code), path)


def _same_dir(fd: int, path: str, dir_fd: int | None) -> bool:
    """Whether ``path`` (relative to ``dir_fd``, not followed if a symlink) is still the directory ``fd`` is open on."""
    try:
        now = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
        kept = os.fstat(fd)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (kept.st_dev, kept.st_ino)


class NativeBlockIO:
    """Stores and loads shares of blocks of one namespace directory through the library.

    Args:
        lib: the library (:func:`library`).
        namespace_dir: ``<root>/<namespace digest>`` (must exist; opened here, never through a symlink).
        digest: the namespace digest (16 raw bytes) written into and checked in every header.
        base_address: address of the primary buffer's first byte (writable, C-contiguous).
        num_blocks: primary slots in that buffer; block ids outside ``[0, num_blocks)`` fail the block.
        block_bytes: payload bytes per block (one slot).

    Raises:
        OSError: ``namespace_dir`` cannot be opened.
    """

    def __init__(
        self, lib: ctypes.CDLL, namespace_dir: str, digest: bytes, base_address: int, num_blocks: int, block_bytes: int
    ) -> None:
        self._lib = lib
        self.namespace_dir = namespace_dir
        self._digest = bytes(digest)
        self._base = base_address
        self._num_blocks = num_blocks
        self.block_bytes = block_bytes
        self._ns_fd = os.open(namespace_dir, _OPEN_DIR)
        self._shards = (ctypes.c_int32 * _SHARDS)(*([-1] * _SHARDS))
        self._retired: list[int] = []
        self._lock = threading.Lock()

    @staticmethod
    def accepts(keys: Sequence[bytes]) -> bool:
        """Whether every key fits the header (longer ones take the Python path, which names the error)."""
        return all(len(k) <= MAX_KEY_BYTES for k in keys)

    def _args(
        self, keys: Sequence[bytes], block_ids: Sequence[int]
    ) -> tuple[bytes, bytes, int, ctypes.Array[ctypes.c_int64]]:
        n = len(keys)
        packed = b"".join([k.ljust(MAX_KEY_BYTES, b"\0") for k in keys])
        return packed, bytes(map(len, keys)), n, (ctypes.c_int64 * n)(*block_ids)

    def store(
        self, keys: Sequence[bytes], block_ids: Sequence[int], temp_prefix: str, direct: bool, fsync: bool
    ) -> tuple[list[int], int]:
        """Publish ``keys[i]`` from primary slot ``block_ids[i]``, atomically, one call for all.

        Args:
            keys: OffloadKeys, at most :data:`MAX_KEY_BYTES` bytes each (see :meth:`accepts`).
            block_ids: primary slot per key.
            temp_prefix: the temporary-name part after the final name, before the counter
                (:attr:`tiering.fs.layout.TempNamer.prefix`: host, pid, per-process nonce).
            direct: open block files with ``O_DIRECT``.
            fsync: fsync each file before and its directory after the rename.

        Returns:
            Per key 0 (published) or an errno (nothing left behind); and the errno with which
            ``O_DIRECT`` was refused during the call (the rest went buffered), 0 when it was not.

        Raises:
            MemoryError: the library could not allocate its trailer page (nothing was attempted).
        """
        packed, lens, n, ids = self._args(keys, block_ids)
        results = (ctypes.c_int32 * n)()
        flags = (_DIRECT if direct else 0) | (_FSYNC if fsync else 0)
        lost = self._lib.tkvb_store(
            self._ns_fd, self._shards, temp_prefix.encode(), self._digest, packed, lens, n,
            self._base, ids, self._num_blocks, self.block_bytes, flags, results,
        )  # fmt: skip
        if lost < 0:
            raise MemoryError("native store: no trailer page")
        return list(results), lost

    def load(self, keys: Sequence[bytes], block_ids: Sequence[int], direct: bool) -> tuple[list[int], int]:
        """Read ``keys[i]`` into primary slot ``block_ids[i]`` and verify it, one call for all (every block attempted).

        Returns:
            Per key 0 (read and verified), an errno (``ENOENT``: no such file; ``ELOOP`` /
            ``ENOTDIR``: a symlink refused), :data:`TRUNCATED`, :data:`CHECKSUM`,
            :data:`FOREIGN`, :data:`NOT_REGULAR` (a FIFO, socket, device node or directory:
            opened without blocking, never read) or :data:`BAD_SLOT`; and the errno with
            which ``O_DIRECT`` was refused, else 0.

        Raises:
            MemoryError: the library could not allocate its trailer page (nothing was attempted).
        """
        packed, lens, n, ids = self._args(keys, block_ids)
        results = (ctypes.c_int32 * n)()
        flags = _DIRECT if direct else 0
        lost = self._lib.tkvb_load(
            self._ns_fd, self._shards, self._digest, packed, lens, n,
            self._base, ids, self._num_blocks, self.block_bytes, flags, results,
        )  # fmt: skip
        if lost < 0:
            raise MemoryError("native load: no trailer page")
        return list(results), lost

    def refresh(self, shard: str) -> None:
        """Drop kept descriptors whose directory was removed, replaced or moved away (after an ``ENOENT``).

        Checks the namespace directory (reopened when replaced) and ``shard`` (two hex
        digits; the library opens, and on store creates, it again at its next use).
        Dropped descriptors are closed by :meth:`close` only, never while a call may
        be using them.
        """
        with self._lock:
            if not _same_dir(self._ns_fd, self.namespace_dir, None):
                try:
                    fresh = os.open(self.namespace_dir, _OPEN_DIR)
                except OSError:
                    return  # keep the stale one (calls fail ENOENT, the Python path recreates the directory)
                self._retired.append(self._ns_fd)
                self._ns_fd = fresh
                for i in range(_SHARDS):
                    if self._shards[i] >= 0:
                        self._retired.append(self._shards[i])
                        self._shards[i] = -1
                return
            slot = int(shard, 16)
            fd = self._shards[slot]
            if fd >= 0 and not _same_dir(fd, shard, self._ns_fd):
                self._shards[slot] = -1
                self._retired.append(fd)

    def xxh3_64(self, data: bytes) -> int:
        """XXH3-64 of ``data`` as the library computes it (equal to python-xxhash's ``xxh3_64``)."""
        return int(self._lib.tkvb_xxh3_64(data, len(data)))

    def close(self) -> None:
        """Close the namespace and shard directory descriptors (after every call has returned)."""
        with self._lock:
            fds = [self._ns_fd, *(fd for fd in self._shards if fd >= 0), *self._retired]
            self._ns_fd = -1
            for i in range(_SHARDS):
                self._shards[i] = -1
            self._retired.clear()
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


def open_native(
    backend: object, namespace_dir: str, digest: bytes, primary_kv_view: memoryview
) -> tuple[NativeBlockIO | None, str]:
    """The native batch path for a tier, or None; and a line saying which block I/O path is used and why.

    Args:
        backend: the tier's back end (only a :class:`~tiering.fs.io.local.LocalBackend` qualifies).
        namespace_dir: the tier's namespace directory (exists).
        digest: the namespace digest (16 raw bytes).
        primary_kv_view: the primary tier's ``(num_blocks, block_bytes)`` view (writable, C-contiguous).
    """
    from tiering.fs.io.local import LocalBackend
    from tiering.fs.root import _view_address

    lib = library()
    if lib is None:
        return None, status()
    if not isinstance(backend, LocalBackend):
        return None, "pure-Python block I/O (the root is not a local filesystem)"
    address, shape, strides = _view_address(primary_kv_view), primary_kv_view.shape, primary_kv_view.strides
    if address is None or not shape or not strides:
        return None, "pure-Python block I/O (the primary buffer's address cannot be taken)"
    block_bytes = int(strides[0])
    try:
        io = NativeBlockIO(lib, namespace_dir, digest, address, int(shape[0]), block_bytes)
    except OSError as exc:
        return None, f"pure-Python block I/O ({namespace_dir} cannot be opened: {exc.strerror or exc})"
    return io, status()
