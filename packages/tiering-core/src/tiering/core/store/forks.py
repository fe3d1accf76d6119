"""A tier stack belongs to the process that built it; a forked child's copy refuses work at once.

``os.fork()`` copies a process with only the calling thread: the I/O pools'
threads, a lookup cache's resolver, a rescanner do not exist in the child,
and a lock one of them held at that moment stays locked there forever. The
copies of the job table, the index and the open sockets (an S3 or Redis
connection shared with the parent) describe the parent's work, not the
child's. A child using that copy would wait forever for work no thread does,
or send on the parent's connections.

So every part of a stack that owns threads or shared state records its
:class:`ProcessOwner` when it is built, and in a forked child:

- every call that would start, wait for or report work (the manager's
  ``lookup`` / ``prepare_*`` / ``complete_store`` / ``touch`` /
  ``get_finished`` / ``has_pending_work``, a tier's ``lookup`` / ``touch`` /
  ``submit_store`` / ``submit_load`` / ``get_finished`` / ``has_pending_work`` / ``stats``)
  raises :class:`ForkedStackError` at once, before touching a lock, with
  what to do instead: build the stack in the child, after forking;
- ``shutdown`` does nothing: the parent's threads, files, sockets and
  queued deletes are the parent's to stop, and the parent goes on unaffected.

A stack built in the child after the fork works as anywhere else; the
module-level state it needs (locks, the fs tier's temporary-name nonce) is
re-armed in the child by ``os.register_at_fork`` hooks. Each tier's stats
count the forks of its process since it was built (``forks``), so an
operator sees that children got a copy they cannot use.

Detection costs one integer comparison per call: a counter incremented by an
``after_in_child`` fork hook (``os.fork``, ``multiprocessing``'s fork start
method), not a ``getpid`` system call.
"""

from __future__ import annotations

import os

_generation = 0
"""Incremented in every forked child: a part built under another value is a copy from an ancestor."""
_forks = 0
"""``fork()`` calls this process made (counted in the parent)."""


def _after_fork_in_child() -> None:
    global _generation
    _generation += 1


def _after_fork_in_parent() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


class ForkedStackError(RuntimeError):
    """A part of a tier stack was used in a child forked after the stack was built (see the module doc)."""


class ProcessOwner:
    """The process a stack part was built in, and the check its calls make.

    Args:
        what: the part, for the error message (``"fs tier 'fs'"``, ``"the tiering manager"``).
    """

    __slots__ = ("_forks_at", "_generation", "pid", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self.pid = os.getpid()
        self._generation = _generation
        self._forks_at = _forks

    @property
    def forked(self) -> bool:
        """True in a child forked after this part was built (its copy cannot be used)."""
        return self._generation != _generation

    def check(self) -> None:
        """Return when this process built the part.

        Raises:
            ForkedStackError: this is a child forked after the part was built;
                the message names both processes and says to build the stack after forking.
        """
        if self._generation != _generation:
            raise self.error()

    def error(self) -> ForkedStackError:
        """The error :meth:`check` raises in a forked child: both processes, and to build the stack after forking."""
        return ForkedStackError(
            f"{self.what} was built in process {self.pid} and cannot be used in process {os.getpid()}, "
            f"a child forked from it: its I/O threads and locks exist only in process {self.pid}. "
            "Build the tiering stack in this process after forking (e.g. in gunicorn's post_fork hook or a "
            "DataLoader's worker_init_fn), or start children with the 'spawn' or 'forkserver' method"
        )

    def forks(self) -> int:
        """``fork()`` calls of this process since the part was built (each child got an unusable copy of it)."""
        return _forks - self._forks_at
