"""The fs tier's scan of its namespace directory (start-up scan and rescans), stale temporary gc.

A scan lists the namespace directory once and sorts every entry:

- a block file where this tier would put it, of the stored size: indexed
  (newest first at the LRU end), unless this process removed or is writing
  it meanwhile;
- a block file of the wrong size: damage (final names only ever appear
  complete), removed;
- a temporary (:mod:`tiering.fs.layout`): removed when provably stale
  (:func:`is_stale_temp`), else its bytes count against the cap until it is
  gone;
- a symlink, a FIFO, socket or device node (never opened), or anything
  else: never indexed, never removed (``tiering ls`` / ``verify`` report it
  as foreign).

The block store (:mod:`tiering.core.store.scans`) runs the scans and
reconciles the index with what they found: keys indexed before that no longer
have a file were removed by another process (``tiering gc``, another tier
instance evicting, a user) and are forgotten; then it evicts down to its cap.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from tiering.core.store import ScanResult
from tiering.fs.io import Backend
from tiering.fs.layout import HOST, TempOwner, block_path, key_of_block_name, temp_namer, temp_owner


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def is_stale_temp(owner: TempOwner, age_s: float, stale_temp_s: float) -> bool:
    """Whether a temporary can be removed without harming a live writer.

    Provably stale: written on this host by a process that is gone (its pid
    is not alive), or by an earlier process that had this process's pid (same
    pid, another nonce: pid reuse after a restart in a container). Any
    temporary older than ``stale_temp_s`` is stale too (another host, or a
    live pid that may have been reused), this process's own included (its
    writers remove their temporaries on failure; one still there that old is
    a leak).

    Args:
        owner: parsed from the name (:func:`tiering.fs.layout.temp_owner`).
        age_s: seconds since the file's last modification.
        stale_temp_s: the configured age limit, seconds.
    """
    if age_s > stale_temp_s:
        return True
    if owner.host != HOST:
        return False
    if owner.pid == os.getpid():
        return owner.nonce != temp_namer.nonce
    return not _pid_alive(owner.pid)


def scan_namespace(
    backend: Backend,
    namespace_dir: str,
    stored_block_bytes: int,
    stale_temp_s: float,
    stopping: Callable[[], bool],
    read_only: bool = False,
) -> ScanResult:
    """List ``namespace_dir`` once (see the module doc); removes stale temporaries and wrong-sized blocks.

    With ``read_only`` (a tier opened for inspection) nothing is removed: they are only left out.

    Returns:
        Every valid block file (key -> (size, mtime)), the bytes of temporaries left in place (not ours,
        not provably stale), the counters ``temps_removed`` and ``bad_blocks_removed`` (files of the wrong
        size), and in the summary the symlinks and special files left alone (never opened).
    """
    blocks: dict[bytes, tuple[int, float]] = {}
    temp_bytes = temps_removed = bad_removed = foreign = 0
    now = time.time()
    mine = temp_namer.owner()
    complete = True
    for entry in backend.scan(namespace_dir):
        if stopping():
            complete = False
            break
        if entry.is_link or entry.is_special:
            foreign += 1
            continue
        owner = temp_owner(entry.name)
        if owner is not None:
            age = now - entry.mtime if entry.mtime > 0 else 0.0
            if not read_only and is_stale_temp(owner, age, stale_temp_s) and backend.remove(entry.path):
                temps_removed += 1
                continue
            if owner != mine:  # this process's own writes are reserved in its index already
                temp_bytes += entry.size
            continue
        key = key_of_block_name(entry.name)
        if key is None or entry.path.replace(os.sep, "/") != block_path(namespace_dir, key):
            continue  # not where this tier would put it: leave it alone
        if entry.size != stored_block_bytes:
            # Final names appear only complete: a wrong size is damage (or a torn file after power loss).
            if not read_only and backend.remove(entry.path):
                bad_removed += 1
            continue
        blocks[key] = (entry.size, entry.mtime)
    counters = {"temps_removed": temps_removed, "bad_blocks_removed": bad_removed}
    summary = (
        f"{temps_removed} stale temporaries and {bad_removed} bad files removed, "
        f"{foreign} symlinks and special files ignored"
    )
    return ScanResult(blocks, temp_bytes, counters, complete, summary)
