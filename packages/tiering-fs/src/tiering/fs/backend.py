"""Storage back ends of the fs tier: the local fast path and any fsspec filesystem.

A back end knows how to publish one block atomically (temporary name, then
rename), read one block into caller-supplied buffers, and list what is
stored. It holds no state about blocks; :mod:`tiering.fs.tier` does.

A block file is the payload (one primary slot, at offset 0) followed by a
:data:`TRAILER_BYTES` trailer page whose first ``HEADER_SIZE`` bytes are the
:mod:`tiering.core.format` header (the rest zeros). Keeping the payload at
offset 0 and the trailer a whole page keeps every part of the file page
aligned, so the local back end can move it with ``O_DIRECT``.

The local back end issues ``os.pwritev`` / ``os.preadv`` straight from / into
the primary tier's slot memory (the trailer page goes in the same system call
as a second buffer), so no payload byte is copied in Python and the GIL is
released while the kernel copies. With ``direct=True`` the block files are
opened with ``O_DIRECT`` (the caller guarantees page-aligned buffers of
page-multiple sizes), which bypasses the page cache: from a ``/dev/shm``
mapping, buffered writes are several times slower than direct ones. The
fsspec back end goes through fsspec file objects (``fs.open``), which buffer
as the filesystem requires.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import mmap
import os
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from tiering.core.format import TruncatedBlockError

TRAILER_BYTES = 4096
"""Size of the trailer page after the payload: the block header, then zeros."""

DIRECT_ALIGN = 4096
"""Alignment ``O_DIRECT`` needs here for buffer addresses, lengths and file offsets."""

_O_DIRECT: int = getattr(os, "O_DIRECT", 0)
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


def _preadv_all(fd: int, buffers: Sequence[memoryview], offset: int, direct: bool = False) -> int:
    """Fill every buffer from ``offset`` with ``os.preadv``; stop early at end of file.

    With ``direct`` (an ``O_DIRECT`` descriptor) a short read that ends off
    :data:`DIRECT_ALIGN` is the end of the file (a truncated file): it is not
    resumed, since an unaligned offset would fail with ``EINVAL``.
    """
    bufs = [b for b in buffers if b.nbytes]
    total = 0
    while bufs:
        n = os.preadv(fd, bufs, offset + total)
        if n <= 0:
            break
        total += n
        if direct and (offset + total) % DIRECT_ALIGN:
            break
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

    def write_block(self, tmp: str, final: str, payload: memoryview, trailer: memoryview, fsync: bool) -> None:
        """Write ``payload + trailer`` to ``tmp``, then rename it to ``final``.

        ``tmp`` is removed when anything fails. ``fsync`` syncs the file
        before and its directory after the rename (local back end only).
        """
        raise NotImplementedError

    def read_block(self, path: str, payload: memoryview, trailer: memoryview, expected_size: int) -> int:
        """Read ``path`` into ``payload`` (first bytes) and ``trailer`` (the rest).

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


def _publish(tmp: str, final: str, buffers: Sequence[memoryview], extra_flags: int, fsync: bool) -> None:
    """Write ``buffers`` to the new file ``tmp``, rename it to ``final``; never leave ``tmp`` behind.

    ``fsync`` syncs the file before the rename and its directory after it.
    """
    fd = os.open(tmp, _OPEN_WRITE | extra_flags, 0o644)
    try:
        try:
            _pwritev_all(fd, buffers, 0)
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


class LocalBackend(Backend):
    """POSIX files through ``os``: positional vectored I/O, no payload copies.

    Args:
        direct: open block files with ``O_DIRECT`` (see :meth:`probe_direct`);
            every buffer passed to :meth:`write_block` / :meth:`read_block`
            must then start on a :data:`DIRECT_ALIGN` boundary and be a
            multiple of it long. Small files (``namespace.json``) are always
            buffered.
    """

    is_local = True

    def __init__(self, direct: bool = False) -> None:
        self.direct = direct

    @staticmethod
    def probe_direct(directory: str) -> str | None:
        """Whether ``O_DIRECT`` works in ``directory``: None when it does, else the reason.

        Writes and reads back one aligned page in a temporary file (removed
        afterwards); tmpfs and some overlay filesystems refuse ``O_DIRECT``
        with ``EINVAL``.
        """
        if not _O_DIRECT:
            return "O_DIRECT is not available on this platform"
        path = os.path.join(directory, f".odirect-probe.{os.getpid()}.{os.urandom(4).hex()}")
        page = mmap.mmap(-1, DIRECT_ALIGN)
        back = mmap.mmap(-1, DIRECT_ALIGN)
        try:
            page[:8] = b"TKVBPROB"
            fd = os.open(path, _OPEN_WRITE | _O_DIRECT, 0o600)
            try:
                if os.pwritev(fd, [page], 0) != DIRECT_ALIGN:
                    return "short O_DIRECT write"
            finally:
                os.close(fd)
            fd = os.open(path, _OPEN_READ | _O_DIRECT)
            try:
                if os.preadv(fd, [back], 0) != DIRECT_ALIGN or back[:] != page[:]:
                    return "O_DIRECT read back differs"
            finally:
                os.close(fd)
        except OSError as exc:
            return f"O_DIRECT probe failed: {exc.strerror or exc}"
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
            page.close()
            back.close()
        return None

    def makedirs(self, path: str) -> None:
        """See :meth:`Backend.makedirs`."""
        os.makedirs(path, exist_ok=True)

    def write_block(self, tmp: str, final: str, payload: memoryview, trailer: memoryview, fsync: bool) -> None:
        """See :meth:`Backend.write_block`."""
        _publish(tmp, final, [payload, trailer], _O_DIRECT if self.direct else 0, fsync)

    def read_block(self, path: str, payload: memoryview, trailer: memoryview, expected_size: int) -> int:
        """See :meth:`Backend.read_block`."""
        fd = os.open(path, _OPEN_READ | (_O_DIRECT if self.direct else 0))
        try:
            size = os.fstat(fd).st_size
            if size != expected_size:
                raise TruncatedBlockError(f"{path} is {size} bytes, expected {expected_size}")
            got = _preadv_all(fd, [payload, trailer], 0, self.direct)
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
        """See :meth:`Backend.write_small_atomic` (buffered, always fsynced: written once per namespace)."""
        _publish(tmp, final, [memoryview(data)], 0, fsync=True)

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
