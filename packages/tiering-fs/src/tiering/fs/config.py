"""The fs tier's configuration keys, their defaults and their checks.

A ``secondary_tiers`` entry of type ``fs``::

    {"type": "fs", "root": "/var/cache/tiering", "capacity_bytes": 107374182400}

Every key is declared once, with its default, in :data:`FS_SCHEMA` (the
toolkit's :class:`~tiering.core.schema.ConfigSchema`: ``tiering
check`` checks an entry against it without side effects, and it marks
``storage_options`` secret). :class:`FsConfig` holds the checked values; its
fields take their defaults from the schema
(:func:`~tiering.core.declared.schema_defaults`). Each key is also a
keyword argument of :class:`~tiering.fs.tier.FsspecSecondaryTierManager`,
whose defaults the tests compare with the schema's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tiering.core.declared import check_one_block, schema_defaults
from tiering.core.policies.pin_records import MAX_PINNED_BYTES, pins_below_capacity
from tiering.core.policies.tenancy import TENANTS_KEY
from tiering.core.schema import ConfigKey, ConfigSchema

LOOKUP_FALLBACKS = ("auto", "stat", "async", "off")
"""Values of ``lookup_fallback``."""


def _seconds(name: str, default: float, doc: str) -> ConfigKey:
    return ConfigKey(name, (float,), default=default, minimum=0, duration=True, doc=doc)


FS_SCHEMA = ConfigSchema(
    "fs",
    [
        ConfigKey("root", (str,), required=True, non_empty=True, doc="local directory or fsspec URL"),
        ConfigKey(
            "storage_options",
            (dict,),
            nullable=True,
            secret=True,
            doc="fsspec filesystem options (may hold credentials: redacted)",
        ),
        ConfigKey("n_read_threads", (int,), default=8, minimum=1, doc="threads serving loads and probes"),
        ConfigKey("n_write_threads", (int,), default=4, minimum=1, doc="threads serving stores"),
        ConfigKey("fsync", (bool,), default=False, doc="fsync each block file and its directory at publish"),
        ConfigKey("capacity_bytes", (int,), nullable=True, minimum=1, size=True, doc="cap on the namespace's bytes"),
        _seconds("stale_temp_s", 600.0, "age after which any temporary is removed"),
        _seconds("rescan_interval_s", 30.0, "seconds between rescans (with capacity_bytes; 0: none)"),
        ConfigKey("lookup_fallback", (str,), default="auto", choices=LOOKUP_FALLBACKS, doc="lookup of unindexed keys"),
        ConfigKey("o_direct", (bool, str), default="auto", choices=(True, False, "auto"), doc="use O_DIRECT"),
        _seconds("startup_scan_wait_s", 2.0, "seconds the constructor waits for the start-up scan"),
        MAX_PINNED_BYTES,
        TENANTS_KEY,
    ],
    [pins_below_capacity],
)
"""Every key of an ``fs`` entry (:attr:`FsspecSecondaryTierManager.config_schema`)."""


@dataclasses.dataclass(frozen=True)
@schema_defaults(FS_SCHEMA)
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
            processes included) and evict down to the cap (and expired
            blocks). Only with ``capacity_bytes`` or ``tenants``; 0 disables.
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
        max_pinned_bytes: bound on the bytes of pinned blocks (stored size,
            trailer included; every pinned key counts, stored or not); 0
            (default) turns pinning off. Below ``capacity_bytes``.
        tenants: per-tenant byte quotas and TTL (``{"default": {...}, "overrides": {...}}``, see
            :mod:`tiering.core.policies.tenancy`); None (default): off. A block's tenant is in its file
            name, its age is the file's mtime.
    """

    root: str
    storage_options: dict[str, Any] | None
    n_read_threads: int
    n_write_threads: int
    fsync: bool
    capacity_bytes: int | None
    stale_temp_s: float
    rescan_interval_s: float
    lookup_fallback: str
    o_direct: bool | str
    startup_scan_wait_s: float
    max_pinned_bytes: int
    tenants: dict[str, Any] | None

    @classmethod
    def check(cls, tier_type: str, stored_block_bytes: int, values: Mapping[str, Any]) -> FsConfig:
        """Check an entry against :data:`FS_SCHEMA` and the block geometry; no side effects.

        Args:
            tier_type: the tier's registered name, for messages.
            stored_block_bytes: bytes one stored block occupies (the lower
                bound of ``capacity_bytes``, ``max_pinned_bytes`` and quotas).
            values: the entry's keys (missing ones take their defaults).

        Raises:
            MissingKeyError: no ``root``.
            UnknownKeyError: a key the fs tier does not have (also a ``TypeError``).
            InvalidTypeError: a value of the wrong type (also a ``TypeError``).
            InvalidValueError: a value out of range, or ``capacity_bytes``, ``max_pinned_bytes`` or a
                tenant's ``quota_bytes`` smaller than one stored block.
        """
        schema = (
            FS_SCHEMA
            if tier_type == FS_SCHEMA.tier
            else ConfigSchema(tier_type, list(FS_SCHEMA.keys.values()), [pins_below_capacity])
        )
        checked = schema.validate(values)
        check_one_block(tier_type, checked, stored_block_bytes)
        cfg = cls(**checked)
        return cfg
