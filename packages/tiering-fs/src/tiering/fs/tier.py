"""The filesystem secondary tier: blocks as files under a namespace directory.

The tier is the toolkit's indexed block store
(:class:`~tiering.core.store.IndexedTier`: index, lookups, stores and loads
on an I/O pool, deletes, scans, stats, shutdown) around the fs medium
(:class:`~tiering.fs.medium.FsMedium`). This module holds the config keys'
use and the fs knobs; the rest is the fs tier's own, each in its module:

- :mod:`tiering.fs.config`: the config keys (schema), defaults and checks;
- :mod:`tiering.fs.medium`: the medium (root, namespace directory, ``O_DIRECT``, block I/O path);
- :mod:`tiering.fs.layout`: block paths, names, temporary names and owners;
- :mod:`tiering.fs.io`: the storage back ends (local fast path, fsspec path);
- :mod:`tiering.fs.blocks`: one block to/from its file (header, verification);
- :mod:`tiering.fs.root`: opening the root, ``namespace.json``, ``O_DIRECT``;
- :mod:`tiering.fs.scanner`: the scan of the namespace directory, stale temporary gc;
- :mod:`tiering.fs.errors`: errors;
- :mod:`tiering.fs.inspection`: offline inspection (``tiering ls/gc/verify``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from tiering.core.schema import ConfigSchema
from tiering.core.spec import OffloadingSpec
from tiering.core.store import IndexedTier, StoreSettings
from tiering.fs.config import FS_SCHEMA, FsConfig
from tiering.fs.layout import TRAILER_BYTES
from tiering.fs.medium import FsMedium
from tiering.fs.native import NATIVE_MIN_SHARE

if TYPE_CHECKING:
    from tiering.core.inspection import TierInspector


class FsspecSecondaryTierManager(IndexedTier):
    """A secondary tier storing one file per block on a local disk or any fsspec filesystem.

    Config (``secondary_tiers`` entry)::

        {"type": "fs", "root": "/var/cache/tiering", "capacity_bytes": 107374182400}

    Each stored block occupies ``block_bytes + 4096`` bytes (payload, then a trailer page holding the header);
    ``capacity_bytes`` counts those sizes plus temporaries. The keys are declared in
    :data:`~tiering.fs.config.FS_SCHEMA` and documented on :class:`~tiering.fs.config.FsConfig` and in the
    package README (with the layout and the multi-process semantics); they are the keyword arguments after
    ``tier_type``.

    Args:
        offloading_spec: the stack's spec (see :class:`~tiering.core.SecondaryTierManager`).
        primary_kv_view: the primary tier's ``(num_blocks, block_bytes)`` view.
        tier_type: the name the factory resolved this tier by.

    Attributes:
        o_direct: whether block files are read and written with ``O_DIRECT``
            (False from the moment the filesystem refused it at run time).
        o_direct_reason: why not, when ``o_direct`` is False ("" otherwise).
        files, backend, root, namespace_dir, block_io: the medium's (see :class:`~tiering.fs.medium.FsMedium`).

    Raises:
        MissingKeyError, UnknownKeyError, InvalidTypeError, InvalidValueError:
            a config mistake (:mod:`tiering.core.schema`), naming the key.
        RootNotUsableError: the root cannot be created or written (names ``root``, the path and the reason).
        DirectIONotUsableError: ``o_direct=True`` and ``O_DIRECT`` cannot be used (names ``o_direct`` and the reason).
    """

    medium: ClassVar[str] = "storage"
    config_schema: ClassVar[ConfigSchema | None] = FS_SCHEMA
    block_overhead_bytes: ClassVar[int] = TRAILER_BYTES
    blocks: FsMedium
    config: FsConfig

    def __init__(
        self, offloading_spec: OffloadingSpec, primary_kv_view: memoryview, tier_type: str, **config: Any
    ) -> None:
        root = config.pop("root", None)
        if root is not None:  # None: not given (MissingKeyError names it)
            config["root"] = os.fspath(root) if isinstance(root, os.PathLike) else root
        super().__init__(offloading_spec, primary_kv_view, tier_type, **config)

    def check_config(self, config: Mapping[str, Any]) -> FsConfig:
        """Check the entry (see :meth:`FsConfig.check`)."""
        return FsConfig.check(self.tier_type, self.stored_block_bytes, config)

    def open_medium(self, config: FsConfig) -> FsMedium:
        """Open the root and the namespace directory (see :class:`~tiering.fs.medium.FsMedium`)."""
        medium = FsMedium(self.tier_type, config, self.namespace, self.block_bytes, self.primary_kv_view)
        self.files, self.backend, self.root = medium.files, medium.backend, medium.root
        self.namespace_dir, self.block_io, self.fsync = medium.namespace_dir, medium.block_io, config.fsync
        self.n_read_threads, self.n_write_threads = config.n_read_threads, config.n_write_threads
        return medium

    def store_settings(self, config: FsConfig) -> StoreSettings:
        """The config's store keys; ``lookup_fallback: "auto"`` is ``stat`` on a local root, else ``async``.

        A native call costs per share: shares of at least ``NATIVE_MIN_SHARE`` blocks, readers help
        writers with as many.
        """
        fallback = config.lookup_fallback
        self.lookup_fallback = fallback if fallback != "auto" else "stat" if self.backend.is_local else "async"
        share = NATIVE_MIN_SHARE if self.files.native is not None else 1
        values = dataclasses.asdict(config)
        return StoreSettings.from_config(values, lookup_fallback=self.lookup_fallback, min_batch=share)

    @property
    def o_direct(self) -> bool:
        """Whether block files move with ``O_DIRECT`` now (see the class doc)."""
        return self.backend.direct

    @property
    def o_direct_reason(self) -> str:
        """Why block files do not use ``O_DIRECT`` ("" while they do)."""
        return self.blocks.direct_reason

    def block_path(self, key: bytes) -> str:
        """Path of ``key``'s block file: ``<namespace dir>/<ab>/<key hex>.kvb``."""
        return self.files.path(key)

    # -- extension points ---------------------------------------------------------------
    @classmethod
    def inspector(cls, tier_config: Mapping[str, Any]) -> TierInspector:
        """A :class:`~tiering.fs.inspection.FsInspector` of a config entry's root (``tiering ls/gc/verify``)."""
        from tiering.fs.inspection import FsInspector

        return FsInspector.from_config(tier_config)

    @classmethod
    def default_local_config(cls, directory: str) -> dict[str, Any]:
        """An ``fs`` entry under ``directory``, capped at 1 GiB (the benchmark's default persistent tier)."""
        return {"type": "fs", "root": directory, "capacity_bytes": 1 << 30}

    @classmethod
    def probe(cls, tier_config: Mapping[str, Any]) -> str:
        """Whether the entry's root would work, creating nothing (``tiering check --probe``); see :func:`probe_root`.

        For a local root it also says which block I/O path is used and, when ``capacity_bytes`` is unbounded
        or more than the disk has free, that the cap in force will be what the disk holds.
        """
        from tiering.fs.probe import probe_entry

        return probe_entry(tier_config)
