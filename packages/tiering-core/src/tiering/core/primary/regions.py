"""Shared-memory primary regions that outlive their engine: an owner lock, and a sweep at the next start.

vLLM keeps the CPU primary tier in a file of ``/dev/shm``
(``vllm_offload_<engine_id>.mmap``), created by the first of the engine's
processes to open it and unlinked by that process when it shuts down. An
engine killed (vLLM's OpenAI server force-kills its engine core at
shutdown, an OOM kill, a crash) never unlinks it: gigabytes of shared memory
stay taken until the machine reboots.

Every process of ours that maps such a region holds a shared ``flock`` on a
small lock file beside it (``<region>.owners``), taken *before* the region is
created or opened (:func:`hold_region`) and kept while the process lives: the
kernel drops it when the process dies, however it dies. At start,
:func:`sweep_dead_regions` removes every region whose lock file nobody holds
any more (an exclusive, non-blocking ``flock`` succeeds): its owners are all
gone. A region some live process holds is never touched, also one another
container or pid namespace maps (a lock is on the file, not a process id),
and also one being created right now (its creator locked first). A forked
child shares its parent's lock (and mapping), so the region stays while
either lives. Regions without a lock file (another program's, or written
before this module existed) are left alone.
"""

from __future__ import annotations

import dataclasses
import fcntl
import fnmatch
import logging
import os
import threading

logger = logging.getLogger(__name__)

OWNERS_SUFFIX = ".owners"
"""Appended to a region's path to name its lock file."""

VLLM_REGION_PATTERN = "vllm_offload_*.mmap"
"""File names of vLLM's primary regions in ``/dev/shm``."""


@dataclasses.dataclass
class RegionHold:
    """This process's shared lock on a region's lock file; the region is not swept while any hold lives.

    Attributes:
        path: the region's path.
        fd: the open lock file (None once released, or when no lock could be taken).
    """

    path: str
    fd: int | None

    def release(self) -> None:
        """Drop the lock (idempotent); the region may be swept once no other process holds it."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


_holds: dict[str, RegionHold] = {}
_holds_lock = threading.Lock()


def _reset_after_fork() -> None:
    # A thread of the parent may have held the lock at fork time; the holds themselves are shared with the parent.
    global _holds_lock
    _holds_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _open_locked(lock_path: str, operation: int) -> int | None:
    """Open (creating it) ``lock_path`` and take ``operation``; None when it cannot be opened.

    Retries when the lock file was swept between the open and the lock (the
    lock then sits on a file no other process can find).
    """
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            logger.warning("cannot create the owner lock %s of a shared-memory region: %s", lock_path, exc)
            return None
        try:
            fcntl.flock(fd, operation)
            same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            return fd
        os.close(fd)


def hold_region(path: str, sweep_pattern: str | None = VLLM_REGION_PATTERN) -> RegionHold:
    """Sweep the regions of dead owners beside ``path``, then hold ``path`` for this process's lifetime.

    Call it before the region is created or opened (and mapped). A second
    call for the same path in this process returns the same hold.

    Args:
        path: the region's file (e.g. ``/dev/shm/vllm_offload_<engine_id>.mmap``).
        sweep_pattern: which file names in ``path``'s directory are regions to
            sweep (:func:`sweep_dead_regions`); None: sweep nothing.

    Returns:
        The hold; its ``fd`` is None when the lock file could not be created
        (logged; the region is then simply not protected from nor swept by this module).
    """
    if sweep_pattern is not None:
        sweep_dead_regions(os.path.dirname(path) or ".", sweep_pattern)
    with _holds_lock:
        hold = _holds.get(path)
        if hold is None or hold.fd is None:
            hold = _holds[path] = RegionHold(path, _open_locked(path + OWNERS_SUFFIX, fcntl.LOCK_SH))
        return hold


def sweep_dead_regions(directory: str, pattern: str = VLLM_REGION_PATTERN) -> list[str]:
    """Remove every region in ``directory`` whose name matches ``pattern`` and whose owners are all gone.

    A region is removed (with its lock file) only when its lock file exists
    and no process holds a lock on it; a region without a lock file is left
    alone. Files this process cannot open (another user's) are skipped.

    Returns:
        The paths of the regions removed (their lock files are removed too).
    """
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for name in names:
        if not name.endswith(OWNERS_SUFFIX) or not fnmatch.fnmatchcase(name[: -len(OWNERS_SUFFIX)], pattern):
            continue
        lock_path = os.path.join(directory, name)
        region = lock_path[: -len(OWNERS_SUFFIX)]
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue  # gone meanwhile, or not ours to open
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live process holds it
            if os.fstat(fd).st_ino != os.stat(lock_path).st_ino:
                continue  # replaced meanwhile: a new owner's file
            try:
                size = os.stat(region).st_size
                os.unlink(region)
            except FileNotFoundError:
                size = -1  # the owner unlinked its region at shutdown; only the lock file was left
            os.unlink(lock_path)  # still under the exclusive lock: no new owner could have taken it
            if size >= 0:
                removed.append(region)
                logger.warning(
                    "removed shared-memory region %s (%d bytes) of an engine that is gone (killed before it "
                    "could remove it)",
                    region,
                    size,
                )
        except OSError as exc:
            logger.debug("sweep of %s skipped: %s", lock_path, exc)
        finally:
            os.close(fd)
    return removed
