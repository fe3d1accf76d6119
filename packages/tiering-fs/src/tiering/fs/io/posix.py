"""Descriptor-level primitives of the local back end: vectored transfers, atomic publish, regular files only.

:class:`~tiering.fs.io.local.LocalBackend` composes these. Every transfer
moves all of its bytes or says how many it moved (short reads and writes are
resumed); a published file appears only by an atomic rename; a FIFO, socket,
device node or directory in a block file's place is refused after ``fstat``
without a byte read (its open never waits: ``O_NONBLOCK``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence

from tiering.core.format import TruncatedBlockError
from tiering.fs.errors import NotRegularFileError

DIRECT_ALIGN = 4096
"""Alignment ``O_DIRECT`` needs here for buffer addresses, lengths and file offsets."""

O_DIRECT: int = getattr(os, "O_DIRECT", 0)
_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
OPEN_WRITE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
"""Flags of a new temporary block file (never follows a symlink, never reuses a name)."""
OPEN_READ = os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | _CLOEXEC
"""Flags of a block file read: ``O_NONBLOCK`` so a FIFO's open never waits for a writer."""
OPEN_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _CLOEXEC
"""Flags of a shard directory's descriptor (a symlink as its last component is refused)."""


def pwritev_all(fd: int, buffers: Sequence[memoryview], offset: int) -> int:
    """Write every buffer at ``offset`` with ``os.pwritev``, resuming after short writes."""
    bufs = [b for b in buffers if b.nbytes]
    total = 0
    while bufs:
        n = os.pwritev(fd, bufs, offset + total)
        if n <= 0:
            raise OSError(errno.EIO, "pwritev wrote no bytes")
        total += n
        _consume(bufs, n)
    return total


def _consume(bufs: list[memoryview], n: int) -> None:
    """Drop the first ``n`` bytes of ``bufs`` in place (after a vectored read or write moved ``n`` bytes)."""
    while bufs and n >= bufs[0].nbytes:
        n -= bufs[0].nbytes
        bufs.pop(0)
    if n:
        bufs[0] = bufs[0][n:]


def preadv_all(fd: int, buffers: Sequence[memoryview], offset: int, direct: bool = False) -> int:
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
        _consume(bufs, n)
    return total


def publish(dfd: int, tmp: str, final: str, buffers: Sequence[memoryview], extra_flags: int, fsync: bool) -> None:
    """Write ``buffers`` to the new file ``tmp`` in directory ``dfd``, rename it to ``final``.

    Never leaves ``tmp`` behind. ``fsync`` syncs the file before the rename
    and the directory after it. No ``stat`` of ``final`` first: the rename
    replaces an existing block atomically (same bytes for the same key).
    """
    fd = os.open(tmp, OPEN_WRITE | extra_flags, 0o644, dir_fd=dfd)
    try:
        try:
            pwritev_all(fd, buffers, 0)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise
    if fsync:
        os.fsync(dfd)


def is_special(dfd: int, name: str) -> bool:
    """Whether ``name`` in directory ``dfd`` exists and is not a regular file (``lstat``: nothing opened)."""
    try:
        return not stat.S_ISREG(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def open_regular(path: str, flags: int, dir_fd: int | None = None) -> tuple[int, os.stat_result]:
    """Open ``path`` (``flags`` include ``O_NONBLOCK``) and make sure it is a regular file.

    Returns:
        The descriptor and its ``fstat``.

    Raises:
        NotRegularFileError: a FIFO, socket, device node or directory (closed again, nothing read).
        OSError: the open failed otherwise.
    """
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket, or a device node without its device
            raise NotRegularFileError(errno.ENXIO, "not a regular file", path) from exc
        raise
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegularFileError(errno.ENXIO, f"not a regular file ({stat.filemode(st.st_mode)})", path)
    return fd, st


def read_block_file(
    dfd: int, name: str, path: str, payload: memoryview, trailer: memoryview, expected_size: int, direct: bool
) -> int:
    """Read block file ``name`` of directory ``dfd`` (``path`` for messages) into ``payload`` and ``trailer``.

    Returns:
        The file's size in bytes (``expected_size``).

    Raises:
        NotRegularFileError: not a regular file (nothing read).
        TruncatedBlockError: the file is not ``expected_size`` bytes, or shrank while being read.
        OSError: the open or the read failed.
    """
    fd, st = open_regular(name, OPEN_READ | (O_DIRECT if direct else 0), dfd)
    try:
        size = st.st_size
        if size != expected_size:
            raise TruncatedBlockError(f"{path} is {size} bytes, expected {expected_size}")
        got = preadv_all(fd, [payload, trailer], 0, direct)
        if got != size:
            # The file shrank under us (replaced or truncated): treat as torn.
            raise TruncatedBlockError(f"{path}: read {got} bytes of {size}")
        return size
    finally:
        os.close(fd)
