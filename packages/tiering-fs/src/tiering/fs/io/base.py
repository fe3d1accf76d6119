"""The interface every storage back end of the fs tier implements, and what its scans list.

:class:`Backend` is implemented by :class:`~tiering.fs.io.local.LocalBackend`
and :class:`~tiering.fs.io.remote.FsspecBackend`;
:func:`~tiering.fs.io.open_backend` picks one for a configured root.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple


class StoredFile(NamedTuple):
    """One entry found by :meth:`Backend.scan`.

    Attributes:
        path: full path (back-end syntax, ``/`` separators).
        name: base name.
        size: size in bytes (of the link itself for a symlink).
        mtime: modification time, seconds since the epoch (0.0 when unknown).
        is_link: a symbolic link (to a file or a directory; never followed).
        is_special: a FIFO, socket or device node (never opened; local back end only).
    """

    path: str
    name: str
    size: int
    mtime: float
    is_link: bool = False
    is_special: bool = False


class Backend:
    """Interface of a storage back end (paths use ``/`` separators).

    Every method may raise ``OSError`` (with ``errno`` set where the
    filesystem reports one); :class:`~tiering.core.format.BlockFormatError`
    only from :meth:`read_block`.

    Attributes:
        is_local: whether paths are local POSIX paths (``os`` calls work on them).
        direct: whether block files move with ``O_DIRECT`` (local back end only).
        direct_lost: why ``O_DIRECT`` was given up at run time, "" while it was not.
    """

    is_local = False
    direct = False
    direct_lost = ""

    def makedirs(self, path: str) -> None:
        """Create ``path`` and its parents; an existing directory is fine."""
        raise NotImplementedError

    def write_block(self, tmp: str, final: str, payload: memoryview, trailer: memoryview, fsync: bool) -> None:
        """Write ``payload + trailer`` to ``tmp``, then rename it to ``final`` (same directory).

        ``tmp`` is removed when anything fails. ``fsync`` syncs the file
        before and its directory after the rename (local back end only).

        Raises:
            FileNotFoundError: the directory of ``final`` does not exist.
            OSError: any other failure (nothing is left behind).
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
        """Size in bytes of the regular file ``path``; None when absent (or not a regular file)."""
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
        """Every file below ``directory`` (any depth); symlinks are listed with ``is_link`` and not followed.

        FIFOs, sockets and device nodes are listed with ``is_special`` (never opened).
        """
        raise NotImplementedError

    def free_bytes(self, path: str) -> int | None:
        """Bytes still free for this user on the filesystem holding ``path``; None where unknown."""
        return None

    def is_real_directory(self, path: str) -> bool:
        """Whether ``path`` is a directory and not a symlink to one (True where the back end has no symlinks)."""
        return True

    def give_up_direct(self, exc: OSError, what: str) -> None:
        """Stop using ``O_DIRECT`` after the filesystem refused it at run time (a no-op where it is never used)."""

    def close(self) -> None:
        """Release what the back end holds open (the tier calls it at shutdown, after its threads stopped)."""
