"""Storage back ends of the fs tier: the local fast path and any fsspec filesystem.

A back end knows how to publish one block atomically (temporary name, then
rename), read one block into a caller-supplied buffer, and list what is
stored. It holds no state about blocks; :mod:`tiering.fs.tier` does.

The local back end issues ``os.pwritev`` / ``os.preadv`` straight from / into
the primary tier's slot memory (the 128-byte header goes in the same system
call as a second buffer), so no payload byte is copied in Python and the GIL
is released while the kernel copies. The fsspec back end goes through
fsspec file objects (``fs.open``), which buffer as the filesystem requires.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from tiering.core.format import HEADER_SIZE, TruncatedBlockError

_OPEN_WRITE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_OPEN_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


class StoredFile(NamedTuple):
    """One file found by :meth:`Backend.scan`.

    Attributes:
        path: full path (back-end syntax).
        name: base name.
        size: size in bytes.
        mtime: modification time, seconds since the epoch (0.0 when unknown).
    """

    path: str
    name: str
    size: int
    mtime: float


def _pwritev_all(fd: int, buffers: Sequence[memoryview], offset: int) -> int:
    """Write every buffer at ``offset`` with ``os.pwritev``, resuming after short writes."""
    bufs = [b for b in buffers if b.nbytes]
    total = 0
    while bufs:
        n = os.pwritev(fd, bufs, offset + total)
        if n <= 0:
            raise OSError(errno.EIO, "pwritev wrote no bytes")
        total += n
        while bufs and n >= bufs[0].nbytes:
            n -= bufs[0].nbytes
            bufs.pop(0)
        if n:
            bufs[0] = bufs[0][n:]
    return total


def _preadv_all(fd: int, buffers: Sequence[memoryview], offset: int) -> int:
    """Fill every buffer from ``offset`` with ``os.preadv``; stop early at end of file."""
    bufs = [b for b in buffers if b.nbytes]
    total = 0
    while bufs:
        n = os.preadv(fd, bufs, offset + total)
        if n <= 0:
            break
        total += n
        while bufs and n >= bufs[0].nbytes:
            n -= bufs[0].nbytes
            bufs.pop(0)
        if n:
            bufs[0] = bufs[0][n:]
    return total


class Backend:
    """Interface of a storage back end (paths use ``/`` separators).

    Every method may raise ``OSError`` (with ``errno`` set where the
    filesystem reports one); :class:`~tiering.core.format.BlockFormatError`
    only from :meth:`read_block`.
    """

    is_local = False

    def makedirs(self, path: str) -> None:
        """Create ``path`` and its parents; an existing directory is fine."""
        raise NotImplementedError

    def write_block(self, tmp: str, final: str, header: bytes, payload: memoryview, fsync: bool) -> None:
        """Write ``header + payload`` to ``tmp``, then rename it to ``final``.

        ``tmp`` is removed when anything fails. ``fsync`` syncs the file
        before and its directory after the rename (local back end only).
        """
        raise NotImplementedError

    def read_block(self, path: str, header: bytearray, payload: memoryview, expected_size: int) -> int:
        """Read ``path`` into ``header`` (first bytes) and ``payload`` (the rest).

        Returns:
            The stored size of the file in bytes.

        Raises:
            FileNotFoundError: ``path`` does not exist.
            TruncatedBlockError: the size is not ``expected_size`` (nothing is read then).
        """
        raise NotImplementedError

    def size(self, path: str) -> int | None:
        """Size of ``path`` in bytes, None when absent."""
        raise NotImplementedError

    def remove(self, path: str) -> bool:
        """Remove ``path``; True when removed or already absent, False on another error."""
        raise NotImplementedError

    def write_small_atomic(self, tmp: str, final: str, data: bytes) -> None:
        """Publish a small file atomically (``namespace.json``)."""
        raise NotImplementedError

    def read_small(self, path: str) -> bytes | None:
        """Contents of a small file, None when absent."""
        raise NotImplementedError

    def scan(self, directory: str) -> Iterator[StoredFile]:
        """Every file below ``directory`` (any depth)."""
        raise NotImplementedError


class LocalBackend(Backend):
    """POSIX files through ``os``: positional vectored I/O, no payload copies."""

    is_local = True

    def makedirs(self, path: str) -> None:
        """See :meth:`Backend.makedirs`."""
        os.makedirs(path, exist_ok=True)

    def write_block(self, tmp: str, final: str, header: bytes, payload: memoryview, fsync: bool) -> None:
        """See :meth:`Backend.write_block`."""
        fd = os.open(tmp, _OPEN_WRITE, 0o644)
        try:
            try:
                _pwritev_all(fd, [memoryview(header), payload], 0)
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if fsync:
            dfd = os.open(os.path.dirname(final), os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def read_block(self, path: str, header: bytearray, payload: memoryview, expected_size: int) -> int:
        """See :meth:`Backend.read_block`."""
        fd = os.open(path, _OPEN_READ)
        try:
            size = os.fstat(fd).st_size
            if size != expected_size:
                raise TruncatedBlockError(f"{path} is {size} bytes, expected {expected_size}")
            got = _preadv_all(fd, [memoryview(header), payload], 0)
            if got != size:
                # The file shrank under us (replaced or truncated): treat as torn.
                raise TruncatedBlockError(f"{path}: read {got} bytes of {size}")
            return size
        finally:
            os.close(fd)

    def size(self, path: str) -> int | None:
        """See :meth:`Backend.size`."""
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            return None

    def remove(self, path: str) -> bool:
        """See :meth:`Backend.remove`."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def write_small_atomic(self, tmp: str, final: str, data: bytes) -> None:
        """See :meth:`Backend.write_small_atomic` (always fsynced: written once per namespace)."""
        self.write_block(tmp, final, data, memoryview(b""), fsync=True)

    def read_small(self, path: str) -> bytes | None:
        """See :meth:`Backend.read_small`."""
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def scan(self, directory: str) -> Iterator[StoredFile]:
        """See :meth:`Backend.scan` (``os.scandir``, depth first; vanished entries are skipped)."""
        stack = [directory]
        while stack:
            current = stack.pop()
            try:
                with os.scandir(current) as it:
                    entries = list(it)
            except FileNotFoundError:
                continue
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        st = entry.stat(follow_symlinks=False)
                        yield StoredFile(entry.path, entry.name, st.st_size, st.st_mtime)
                except FileNotFoundError:
                    continue


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

    def write_block(self, tmp: str, final: str, header: bytes, payload: memoryview, fsync: bool) -> None:
        """See :meth:`Backend.write_block` (``fsync`` is not available through fsspec and ignored)."""
        try:
            with self.fs.open(tmp, "wb") as f:
                f.write(header)
                if payload.nbytes:
                    f.write(payload)
            self.fs.mv(tmp, final)
        except BaseException:
            self.remove(tmp)
            raise

    def read_block(self, path: str, header: bytearray, payload: memoryview, expected_size: int) -> int:
        """See :meth:`Backend.read_block`."""
        with self.fs.open(path, "rb") as f:
            size = getattr(f, "size", None)
            if size is None:
                size = self.fs.size(path)
            size = int(size)
            if size != expected_size:
                raise TruncatedBlockError(f"{path} is {size} bytes, expected {expected_size}")
            got = f.readinto(memoryview(header)) or 0
            if got == HEADER_SIZE:
                got += f.readinto(payload) or 0
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
        self.write_block(tmp, final, data, memoryview(b""), fsync=False)

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
