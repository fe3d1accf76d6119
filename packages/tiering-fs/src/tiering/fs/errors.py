"""Errors of the fs tier and the mapping of an I/O failure to its stats label.

A failed store or load of one block is counted under
``store_failed_<cause>`` / ``load_failed_<cause>``; :func:`failure_cause`
picks the cause from the exception.
"""

from __future__ import annotations

import errno
from typing import Any

from tiering.core.format import BlockFormatError
from tiering.core.toolkit.config import InvalidValueError

STORE_CAUSES = ("no_space", "io_error", "permission", "internal")
"""Causes of a failed block store, in stats order."""

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
"""Causes of a failed block load, in stats order."""

DISK_FULL = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})
"""Errnos of a failed write meaning the filesystem (or the user's quota) holds no more bytes.

A store that fails with one of them makes the tier lower its cap to what the
filesystem holds, evict and try once more. ``EFBIG`` (one file over a size
limit) is not among them: evicting would not help it.
"""

_NO_SPACE = DISK_FULL | {errno.EFBIG}
_DENIED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
_SYMLINK = frozenset({errno.ELOOP, errno.ENOTDIR})


class _KeyOSError(InvalidValueError, OSError):
    """A config value that turned out unusable when the tier opened it: both an ``OSError`` and a config error.

    As an :class:`~tiering.core.toolkit.config.InvalidValueError` it names the
    key (and, relabelled with :meth:`with_entry`, its ``secondary_tiers[N]``
    entry); as an ``OSError`` it keeps the ``errno`` the filesystem gave.
    """

    key_name = ""

    def __init__(self, tier: str, problem: str, err: int = errno.EIO, entry: str | None = None) -> None:
        InvalidValueError.__init__(self, tier, self.key_name, problem, entry)
        self.errno = err
        self.strerror = problem

    def with_entry(self, entry: str) -> _KeyOSError:
        """The same error labelled with ``entry`` (e.g. ``"secondary_tiers[1]"``), errno kept."""
        return type(self)(self.tier, self.problem, self.errno or errno.EIO, entry)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle support."""
        return (type(self), (self.tier, self.problem, self.errno, self.entry))

    def __str__(self) -> str:
        """The config error's message (not OSError's ``[Errno n]`` form)."""
        return self._message()


class NotRegularFileError(OSError):
    """Something other than a regular file where a block file should be: a FIFO, socket, device node or directory.

    Raised by a block read, which opens the path without blocking and refuses
    it after ``fstat`` before reading a byte. A load counts it as ``foreign``
    and leaves it in place, as it does a symlink.
    """


class RootNotUsableError(_KeyOSError):
    """The configured ``root`` cannot be created, is a symlink, or is not writable; names the path and the reason."""

    key_name = "root"


class DirectIONotUsableError(_KeyOSError):
    """``o_direct: true`` was configured but ``O_DIRECT`` cannot be used; names the path and the reason."""

    key_name = "o_direct"


def failure_cause(exc: BaseException, *, load: bool, in_index: bool = False) -> str:
    """The stats label of one block's failure.

    Args:
        exc: what the store or load raised.
        load: True for a load, False for a store.
        in_index: for a missing file on load, whether the tier had it indexed
            (``vanished``: removed behind its back) or not (``missing``).

    Returns:
        One of :data:`LOAD_CAUSES` (load) or :data:`STORE_CAUSES` (store).
    """
    if isinstance(exc, BlockFormatError):
        return exc.reason if exc.reason in LOAD_CAUSES else "corrupt"
    if isinstance(exc, FileNotFoundError):
        return ("vanished" if in_index else "missing") if load else "io_error"
    if load and (isinstance(exc, NotRegularFileError) or (isinstance(exc, OSError) and exc.errno in _SYMLINK)):
        return "foreign"  # a symlink or a special file where a block file or shard directory should be
    if isinstance(exc, OSError):
        if exc.errno in _NO_SPACE:
            return "io_error" if load else "no_space"
        if exc.errno in _DENIED:
            return "permission"
        return "io_error"
    return "internal"
