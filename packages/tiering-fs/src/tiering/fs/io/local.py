"""The local fast path: POSIX files through ``os``, no payload copies, optional ``O_DIRECT``.

Blocks move with ``os.pwritev`` / ``os.preadv`` straight from / into the
primary tier's slot memory (the trailer page goes in the same system call as
a second buffer), so no payload byte is copied in Python and the GIL is
released while the kernel copies. With ``direct=True`` block files are opened
with ``O_DIRECT`` (the caller guarantees page-aligned buffers of page-multiple
sizes), which bypasses the page cache: from a ``/dev/shm`` mapping, buffered
writes are several times slower than direct ones.

**O_DIRECT at run time.** The tier probes ``O_DIRECT`` once at start-up; a
filesystem can still refuse it later (remounted, a shard directory moved to
another mount). A block whose ``O_DIRECT`` open or transfer fails with an
errno meaning "unsupported" (:data:`DIRECT_UNSUPPORTED`) is redone with
buffered I/O at once, so the block is not lost, and the back end stops
using ``O_DIRECT`` for good, with one warning (:attr:`LocalBackend.direct_lost`).

**Symlinks.** Nothing below the namespace directory is reached through a
symlink: a block's directory is opened with ``O_DIRECTORY | O_NOFOLLOW`` and
the file relative to it with ``O_NOFOLLOW`` (a symlinked shard directory or
block file fails with ``ELOOP`` / ``ENOTDIR``: a failed store, a missed load),
and :meth:`LocalBackend.size` (the lookup fallback) answers None for both.

**Special files.** A FIFO, socket, device node or directory where a block
file should be is never read: files are opened with ``O_NONBLOCK`` (opening a
FIFO would otherwise wait for a writer, holding an I/O thread for good) and
refused after ``fstat`` unless regular (:class:`~tiering.fs.errors.NotRegularFileError`;
a socket already fails the open with ``ENXIO``). An ``O_DIRECT`` open such a
file refuses with ``EINVAL`` is not taken for the filesystem refusing
``O_DIRECT``. :meth:`LocalBackend.scan` lists them with ``is_special``.

**Directory descriptors.** With ``cache_dirs`` (the tier's setting) each
shard directory is opened once and its descriptor kept, instead of an
``open`` and a ``close`` of the directory per block (two system calls of
about 7 us each on the development VM). When a block operation fails with
``ENOENT`` and the path no longer names the kept directory (removed by a
``gc`` or by hand, replaced, moved away: compared by device and inode), the
descriptor is dropped and the operation retried once through a fresh
``O_NOFOLLOW`` open (so a symlink put in its place is still refused).
Dropped descriptors are closed only by :meth:`LocalBackend.close`, never
while another thread may be using them.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from tiering.fs.errors import NotRegularFileError
from tiering.fs.io.base import Backend, StoredFile
from tiering.fs.io.posix import (
    DIRECT_ALIGN,
    O_DIRECT,
    OPEN_DIR,
    OPEN_READ,
    OPEN_WRITE,
    is_special,
    open_regular,
    publish,
    read_block_file,
)
from tiering.fs.layout import ODIRECT_PROBE_NAME, temp_namer

logger = logging.getLogger(__name__)

DIRECT_UNSUPPORTED = frozenset(
    {errno.EINVAL, getattr(errno, "EOPNOTSUPP", errno.EINVAL), getattr(errno, "ENOTSUP", errno.EINVAL)}
)
"""Errnos of an ``O_DIRECT`` open or transfer that mean "not supported here" (the fallback triggers on them)."""

_MAX_CACHED_DIRS = 4096
"""Directory descriptors one back end keeps at most (the fs layout has 256 shard directories per namespace)."""

T = TypeVar("T")


def _split(path: str) -> tuple[str, str]:
    directory, _, name = path.rpartition("/")
    return directory or "/", name


def _same_dir(dfd: int, directory: str) -> bool:
    """Whether ``directory`` (not followed if a symlink) is still the directory ``dfd`` was opened on."""
    try:
        now = os.lstat(directory)
    except OSError:
        return False
    kept = os.fstat(dfd)
    return (now.st_dev, now.st_ino) == (kept.st_dev, kept.st_ino)


def _open_dir(directory: str) -> int:
    """A descriptor of ``directory``, refusing a symlink as its last component (``ELOOP`` / ``ENOTDIR``)."""
    return os.open(directory, OPEN_DIR)


class LocalBackend(Backend):
    """POSIX files through ``os``: positional vectored I/O, no payload copies.

    Args:
        direct: open block files with ``O_DIRECT`` (see :meth:`probe_direct`);
            every buffer passed to :meth:`write_block` / :meth:`read_block`
            must then start on a :data:`DIRECT_ALIGN` boundary and be a
            multiple of it long. Small files (``namespace.json``) are always
            buffered. Falls back to buffered I/O for good when the
            filesystem refuses ``O_DIRECT`` at run time (see the module doc).
    """

    is_local = True

    def __init__(self, direct: bool = False, cache_dirs: bool = False) -> None:
        self.direct = direct
        self.direct_lost = ""
        self.cache_dirs = cache_dirs
        self._dirs: dict[str, int] = {}
        self._retired: list[int] = []
        self._dirs_lock = threading.Lock()
        self._closed = False

    def _in_dir(self, directory: str, op: Callable[[int], T]) -> T:
        """Run ``op(directory descriptor)``; see the module doc on directory descriptors."""
        if not self.cache_dirs:
            dfd = _open_dir(directory)
            try:
                return op(dfd)
            finally:
                os.close(dfd)
        kept = self._dirs.get(directory)
        dfd = kept if kept is not None else self._keep(directory, _open_dir(directory))
        try:
            return op(dfd)
        except FileNotFoundError:
            if _same_dir(dfd, directory):
                raise  # the directory is the one kept: the file is not there
            self._retire(directory, dfd)  # removed, replaced or moved away: open the path again, once
            return self._in_dir(directory, op)

    def _keep(self, directory: str, dfd: int) -> int:
        with self._dirs_lock:
            if self._closed or len(self._dirs) >= _MAX_CACHED_DIRS:
                self._retired.append(dfd)  # closed with the back end; never reused meanwhile
                return dfd
            kept = self._dirs.setdefault(directory, dfd)
        if kept != dfd:
            os.close(dfd)  # another thread opened it first; ours was never shared
        return kept

    def _retire(self, directory: str, dfd: int) -> None:
        with self._dirs_lock:
            if self._dirs.get(directory) == dfd:
                del self._dirs[directory]
                self._retired.append(dfd)

    def close(self) -> None:
        """Close the kept directory descriptors (see :meth:`Backend.close`)."""
        with self._dirs_lock:
            self._closed = True
            fds = [*self._dirs.values(), *self._retired]
            self._dirs.clear()
            self._retired.clear()
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    @staticmethod
    def probe_direct(directory: str) -> str | None:
        """Whether ``O_DIRECT`` works in ``directory``: None when it does, else the reason.

        Writes and reads back one aligned page in a temporary file (a
        :mod:`tiering.fs.layout` temporary name, removed afterwards, and
        removed by a later start-up scan if this process dies first); tmpfs
        and some overlay filesystems refuse ``O_DIRECT`` with ``EINVAL``.
        """
        if not O_DIRECT:
            return "O_DIRECT is not available on this platform"
        path = temp_namer(f"{directory}/{ODIRECT_PROBE_NAME}")
        page = mmap.mmap(-1, DIRECT_ALIGN)
        back = mmap.mmap(-1, DIRECT_ALIGN)
        try:
            page[:8] = b"TKVBPROB"
            fd = os.open(path, OPEN_WRITE | O_DIRECT, 0o600)
            try:
                if os.pwritev(fd, [page], 0) != DIRECT_ALIGN:
                    return "short O_DIRECT write"
            finally:
                os.close(fd)
            fd = os.open(path, OPEN_READ | O_DIRECT)
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

    def give_up_direct(self, exc: OSError, what: str) -> None:
        """Stop using ``O_DIRECT`` for good after the filesystem refused it (``what``: "write"/"read"); warns once."""
        if self.direct:
            self.direct = False
            self.direct_lost = f"O_DIRECT {what} failed at run time: {exc.strerror or exc}"
            logger.warning("fs tier: %s; using buffered I/O from now on", self.direct_lost)

    def makedirs(self, path: str) -> None:
        """See :meth:`Backend.makedirs`."""
        os.makedirs(path, exist_ok=True)

    def free_bytes(self, path: str) -> int | None:
        """See :meth:`Backend.free_bytes` (``statvfs``: the blocks available to unprivileged users)."""
        try:
            return shutil.disk_usage(path).free
        except OSError:
            return None

    def is_real_directory(self, path: str) -> bool:
        """See :meth:`Backend.is_real_directory` (``lstat``: a symlink to a directory is not one)."""
        try:
            return stat.S_ISDIR(os.lstat(path).st_mode)
        except OSError:
            return False

    def write_block(self, tmp: str, final: str, payload: memoryview, trailer: memoryview, fsync: bool) -> None:
        """See :meth:`Backend.write_block` (``tmp`` and ``final`` in the same directory, never via a symlink)."""
        directory, tmp_name = _split(tmp)
        final_name = _split(final)[1]

        def write(dfd: int) -> None:
            direct = self.direct
            try:
                publish(dfd, tmp_name, final_name, [payload, trailer], O_DIRECT if direct else 0, fsync)
            except OSError as exc:
                if not (direct and exc.errno in DIRECT_UNSUPPORTED):
                    raise
                self.give_up_direct(exc, "write")
                publish(dfd, tmp_name, final_name, [payload, trailer], 0, fsync)

        self._in_dir(directory, write)

    def read_block(self, path: str, payload: memoryview, trailer: memoryview, expected_size: int) -> int:
        """See :meth:`Backend.read_block` (never via a symlink: ``ELOOP`` / ``ENOTDIR`` instead)."""
        directory, name = _split(path)

        def read(dfd: int) -> int:
            direct = self.direct
            try:
                return read_block_file(dfd, name, path, payload, trailer, expected_size, direct)
            except OSError as exc:
                if not (direct and exc.errno in DIRECT_UNSUPPORTED):
                    raise
                if not is_special(dfd, name):  # else the file's type refused O_DIRECT, not the filesystem
                    self.give_up_direct(exc, "read")
                return read_block_file(dfd, name, path, payload, trailer, expected_size, False)

        return self._in_dir(directory, read)

    def size(self, path: str) -> int | None:
        """See :meth:`Backend.size`: None for a symlinked file or a file in a symlinked directory."""
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode) or not self.is_real_directory(_split(path)[0]):
            return None
        return st.st_size

    def remove(self, path: str) -> bool:
        """See :meth:`Backend.remove` (a symlink is removed itself, never its target)."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def write_small_atomic(self, tmp: str, final: str, data: bytes) -> None:
        """See :meth:`Backend.write_small_atomic` (buffered, always fsynced: written once per namespace)."""
        directory, tmp_name = _split(tmp)
        dfd = _open_dir(directory)
        try:
            publish(dfd, tmp_name, _split(final)[1], [memoryview(data)], 0, fsync=True)
        finally:
            os.close(dfd)

    def read_small(self, path: str) -> bytes | None:
        """See :meth:`Backend.read_small` (never via a symlinked file; None for a special file, never read)."""
        try:
            fd = open_regular(path, OPEN_READ)[0]
        except (FileNotFoundError, NotRegularFileError):
            return None
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def scan(self, directory: str) -> Iterator[StoredFile]:
        """See :meth:`Backend.scan` (``os.scandir``, depth first; vanished entries are skipped)."""
        stack = [directory]
        while stack:
            current = stack.pop()
            try:
                with os.scandir(current) as it:
                    entries = list(it)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                try:
                    if entry.is_symlink():
                        st = entry.stat(follow_symlinks=False)
                        yield StoredFile(entry.path, entry.name, st.st_size, st.st_mtime, True)
                    elif entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    else:
                        st = entry.stat(follow_symlinks=False)
                        special = not stat.S_ISREG(st.st_mode)  # a FIFO, socket or device node: listed, never opened
                        yield StoredFile(entry.path, entry.name, st.st_size, st.st_mtime, is_special=special)
                except FileNotFoundError:
                    continue
