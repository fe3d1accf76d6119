"""The fsspec path: any fsspec filesystem through its file objects (``memory://``, ``s3://``, ...).

fsspec file objects buffer as the filesystem requires; publishing is write to
a temporary name, then ``fs.mv`` (atomic where the filesystem's rename is).
Object stores and in-memory filesystems have no symlinks, so nothing here
needs to guard against them.

A chained cache (``filecache::``, ``simplecache::``, ``blockcache::`` over
any filesystem) keeps its cache metadata without a lock: concurrent opens
from the tier's I/O threads can fail inside it (a load would then be a
spurious miss). :func:`backend_for` gives such a filesystem
:class:`SerializedFsspecBackend`, which makes one call at a time per
filesystem instance (fsspec hands every tier on the same URL the same one).
"""

from __future__ import annotations

import datetime
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from tiering.core.format import TruncatedBlockError
from tiering.fs.io.base import Backend, StoredFile


def _timestamp(value: Any) -> float:
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    if isinstance(value, (int, float)):
        return float(value)
    return 0.0


class FsspecBackend(Backend):
    """Any fsspec filesystem through its file objects (``memory://``, ``s3://``, ...).

    Args:
        fs: the ``fsspec.AbstractFileSystem`` instance.
    """

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def makedirs(self, path: str) -> None:
        """See :meth:`Backend.makedirs`."""
        self.fs.makedirs(path, exist_ok=True)

    def write_block(self, tmp: str, final: str, payload: memoryview, trailer: memoryview, fsync: bool) -> None:
        """See :meth:`Backend.write_block` (``fsync`` is not available through fsspec and ignored)."""
        try:
            with self.fs.open(tmp, "wb") as f:
                if payload.nbytes:
                    f.write(payload)
                if trailer.nbytes:
                    f.write(trailer)
            self.fs.mv(tmp, final)
        except BaseException:
            self.remove(tmp)
            raise

    def read_block(self, path: str, payload: memoryview, trailer: memoryview, expected_size: int) -> int:
        """See :meth:`Backend.read_block`."""
        with self.fs.open(path, "rb") as f:
            size = getattr(f, "size", None)
            if size is None:
                size = self.fs.size(path)
            size = int(size)
            if size != expected_size:
                raise TruncatedBlockError(f"{path} is {size} bytes, expected {expected_size}")
            got = f.readinto(payload) or 0
            if got == payload.nbytes:
                got += f.readinto(trailer) or 0
            if got != size:
                raise TruncatedBlockError(f"{path}: read {got} bytes of {size}")
            return size

    def size(self, path: str) -> int | None:
        """See :meth:`Backend.size`."""
        try:
            return int(self.fs.size(path))
        except FileNotFoundError:
            return None

    def remove(self, path: str) -> bool:
        """See :meth:`Backend.remove`."""
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def write_small_atomic(self, tmp: str, final: str, data: bytes) -> None:
        """See :meth:`Backend.write_small_atomic`."""
        self.write_block(tmp, final, memoryview(data), memoryview(b""), fsync=False)

    def read_small(self, path: str) -> bytes | None:
        """See :meth:`Backend.read_small`."""
        try:
            data = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        return bytes(data)

    def scan(self, directory: str) -> Iterator[StoredFile]:
        """See :meth:`Backend.scan` (``fs.find(detail=True)``)."""
        try:
            found = self.fs.find(directory, detail=True)
        except FileNotFoundError:
            return
        for path, info in found.items():
            if info.get("type", "file") != "file":
                continue
            mtime = _timestamp(info.get("mtime") or info.get("created") or info.get("LastModified"))
            yield StoredFile(path, path.rsplit("/", 1)[-1], int(info.get("size") or 0), mtime)


_LOCKS: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def _lock_of(fs: Any) -> threading.RLock:
    """The one lock of filesystem instance ``fs`` (shared by every back end over it)."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(fs)
        if lock is None:
            lock = _LOCKS[fs] = threading.RLock()
        return lock


def is_chained_cache(fs: Any) -> bool:
    """Whether ``fs`` is, or wraps, an fsspec caching filesystem (``filecache``, ``simplecache``, ``blockcache``)."""
    from fsspec.implementations.cached import CachingFileSystem

    seen = 0
    while fs is not None and seen < 16:  # a chain is a few layers: the bound only guards against a cycle
        if isinstance(fs, CachingFileSystem):
            return True
        fs, seen = getattr(fs, "fs", None), seen + 1
    return False


def backend_for(fs: Any) -> FsspecBackend:
    """The fsspec back end for ``fs``: serialized where ``fs`` is a chained cache (see the module doc)."""
    return SerializedFsspecBackend(fs) if is_chained_cache(fs) else FsspecBackend(fs)


class SerializedFsspecBackend(FsspecBackend):
    """:class:`FsspecBackend` making one filesystem call at a time (a chained cache is not thread safe).

    Args:
        fs: the ``fsspec.AbstractFileSystem`` instance; every back end over the same instance shares one lock.
    """

    def __init__(self, fs: Any) -> None:
        super().__init__(fs)
        self._lock = _lock_of(fs)

    def makedirs(self, path: str) -> None:
        """See :meth:`Backend.makedirs`."""
        with self._lock:
            super().makedirs(path)

    def write_block(self, tmp: str, final: str, payload: memoryview, trailer: memoryview, fsync: bool) -> None:
        """See :meth:`Backend.write_block`."""
        with self._lock:
            super().write_block(tmp, final, payload, trailer, fsync)

    def read_block(self, path: str, payload: memoryview, trailer: memoryview, expected_size: int) -> int:
        """See :meth:`Backend.read_block`."""
        with self._lock:
            return super().read_block(path, payload, trailer, expected_size)

    def size(self, path: str) -> int | None:
        """See :meth:`Backend.size`."""
        with self._lock:
            return super().size(path)

    def remove(self, path: str) -> bool:
        """See :meth:`Backend.remove`."""
        with self._lock:
            return super().remove(path)

    def read_small(self, path: str) -> bytes | None:
        """See :meth:`Backend.read_small`."""
        with self._lock:
            return super().read_small(path)

    def scan(self, directory: str) -> Iterator[StoredFile]:
        """See :meth:`Backend.scan` (the listing is taken under the lock, then yielded)."""
        with self._lock:
            found = list(super().scan(directory))
        yield from found
