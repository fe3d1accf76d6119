"""Errors of the fs tier: an unusable root or ``O_DIRECT``, a block path that is not a regular file.

A failed store or load of one block is counted under
``store_failed_<cause>`` / ``load_failed_<cause>``; the cause is picked by
:meth:`tiering.fs.medium.FsMedium.failure_cause`.
"""

from __future__ import annotations

import errno
from typing import Any

from tiering.core.schema import InvalidValueError


class _KeyOSError(InvalidValueError, OSError):
    """A config value that turned out unusable when the tier opened it: both an ``OSError`` and a config error.

    As an :class:`~tiering.core.schema.InvalidValueError` it names the
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
