"""Errors of the fs tier and the mapping of an I/O failure to its stats label.

A failed store or load of one block is counted under
``store_failed_<cause>`` / ``load_failed_<cause>``; :func:`failure_cause`
picks the cause from the exception.
"""

from __future__ import annotations

import errno

from tiering.core.format import BlockFormatError

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

_NO_SPACE = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG})
_DENIED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


class RootNotUsableError(OSError):
    """The configured root cannot be created or written; the message names the path and the reason."""


class DirectIONotUsableError(OSError):
    """``o_direct: true`` was configured but ``O_DIRECT`` cannot be used; the message names the path and the reason."""


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
    if isinstance(exc, OSError):
        if exc.errno in _NO_SPACE:
            return "io_error" if load else "no_space"
        if exc.errno in _DENIED:
            return "permission"
        return "io_error"
    return "internal"
