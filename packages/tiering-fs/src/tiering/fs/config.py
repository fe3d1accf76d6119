"""The fs tier's configuration keys, their defaults and their checks.

A ``secondary_tiers`` entry of type ``fs``::

    {"type": "fs", "root": "/var/cache/tiering", "capacity_bytes": 107374182400}

Every key is a keyword argument of
:class:`~tiering.fs.tier.FsspecSecondaryTierManager`; :class:`FsConfig`
holds the checked values.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

LOOKUP_FALLBACKS = ("auto", "stat", "async", "off")
"""Values of ``lookup_fallback``."""


@dataclasses.dataclass(frozen=True)
class FsConfig:
    """The checked configuration of one fs tier.

    Attributes:
        root: a local directory path or an fsspec URL (``file://...``,
            ``memory://...``, ``s3://bucket/prefix`` with s3fs installed...).
            Created when absent. Required.
        storage_options: keyword arguments for the fsspec filesystem
            (credentials, endpoint...); ignored for plain local paths.
        n_read_threads: threads serving loads (and existence probes), >= 1.
            With no load or probe queued, a reader helps with stores, one
            block at a time, so a load arriving waits at most one block
            write for it.
        n_write_threads: threads serving stores, >= 1. Loads are preferred:
            every idle thread, reader or writer, takes a queued load before a
            queued store (stores only keep primary slots pinned; loads are on
            a request's critical path). The same split as vLLM's fs tier
            (read-priority and write-priority threads).
        fsync: fsync each block file and its directory at publish (local
            only). Off by default: it costs about 20-50% of store throughput
            on this class of disk; without it a power loss (not a process
            crash) can leave a published file empty or torn, which the
            verification on load then rejects as a miss.
        capacity_bytes: optional cap, in bytes, on the namespace directory's
            measured usage (block files and temporaries); least recently used
            blocks are evicted to make room. At least one stored block
            (``block_bytes + 4096``).
        stale_temp_s: temporaries older than this (seconds) are removed by
            the start-up scan and periodic rescans even when their owner
            cannot be checked (another host); temporaries of a dead process
            on this host are removed at once.
        rescan_interval_s: seconds between background rescans of the
            namespace directory that re-measure usage (blocks of other
            processes included) and evict down to the cap. Only with
            ``capacity_bytes``; 0 disables.
        lookup_fallback: how a lookup of a key missing from the in-memory
            index checks the filesystem (blocks of other processes):
            ``"stat"`` (a synchronous ``lstat``; local default), ``"async"``
            (a background probe, the lookup answers None meanwhile; default
            for non-local roots), ``"off"``, or ``"auto"``.
        o_direct: move blocks with ``O_DIRECT`` on a local root (no page
            cache; much faster from a ``/dev/shm`` primary buffer):
            ``"auto"`` uses it when a probe write/read in the namespace
            directory succeeds and every primary slot is page aligned
            (``block_bytes`` a multiple of 4096, the buffer's base address
            too), else buffered I/O; ``True`` requires it; ``False`` never.
            The file layout is the same either way.
        startup_scan_wait_s: seconds the constructor waits for the start-up
            scan of the namespace directory (it runs on a background
            thread), so that the first lookups after a restart are answered
            from the in-memory index instead of ``lookup_fallback``; a
            larger namespace keeps scanning in the background after the
            wait. 0 returns at once.
    """

    root: str
    storage_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    n_read_threads: int = 8
    n_write_threads: int = 4
    fsync: bool = False
    capacity_bytes: int | None = None
    stale_temp_s: float = 600.0
    rescan_interval_s: float = 30.0
    lookup_fallback: str = "auto"
    o_direct: bool | str = "auto"
    startup_scan_wait_s: float = 2.0

    @classmethod
    def check(cls, label: str, stored_block_bytes: int, **values: Any) -> FsConfig:
        """Check every value and return the config.

        Args:
            label: how messages name the entry (e.g. ``tier 'fs'``).
            stored_block_bytes: bytes one stored block occupies (the lower
                bound of ``capacity_bytes``).
            **values: the entry's keys (missing ones take their defaults).

        Raises:
            TypeError: a value has the wrong type (the message names the key).
            ValueError: a value is out of range (the message names the key and value).
        """
        cfg = cls(**values)
        root = cfg.root
        if not isinstance(root, (str, os.PathLike)) or not os.fspath(root):
            raise TypeError(f"{label}: root must be a non-empty path or URL string, got {root!r}")
        if not isinstance(cfg.storage_options, dict):
            raise TypeError(f"{label}: storage_options must be an object, got {cfg.storage_options!r}")
        for name in ("n_read_threads", "n_write_threads"):
            value = getattr(cfg, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{label}: {name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"{label}: {name} must be >= 1, got {value}")
        if not isinstance(cfg.fsync, bool):
            raise TypeError(f"{label}: fsync must be true or false, got {cfg.fsync!r}")
        o_direct = cfg.o_direct
        if o_direct is not True and o_direct is not False and o_direct != "auto":
            kind = ValueError if isinstance(o_direct, str) else TypeError
            raise kind(f'{label}: o_direct must be true, false or "auto", got {o_direct!r}')
        cap = cfg.capacity_bytes
        if cap is not None:
            if isinstance(cap, bool) or not isinstance(cap, int):
                raise TypeError(f"{label}: capacity_bytes must be an int or null, got {cap!r}")
            if cap < stored_block_bytes:
                raise ValueError(
                    f"{label}: capacity_bytes {cap} is smaller than one stored block ({stored_block_bytes} bytes = "
                    f"{stored_block_bytes - 4096} block + 4096 trailer)"
                )
        for name in ("stale_temp_s", "rescan_interval_s", "startup_scan_wait_s"):
            value = getattr(cfg, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{label}: {name} must be a number of seconds, got {value!r}")
            if value < 0:
                raise ValueError(f"{label}: {name} must be >= 0, got {value}")
        if cfg.lookup_fallback not in LOOKUP_FALLBACKS:
            raise ValueError(f"{label}: lookup_fallback must be one of {LOOKUP_FALLBACKS}, got {cfg.lookup_fallback!r}")
        return dataclasses.replace(cfg, root=os.fspath(root), storage_options=dict(cfg.storage_options))
