"""The fs tier's medium: block files under ``<root>/<namespace digest>`` (see :class:`FsMedium`).

What only the filesystem knows, for the block store
(:class:`~tiering.core.store.IndexedTier`): the root and its back end
(:mod:`tiering.fs.io`: the local fast path, fsspec otherwise), the namespace
directory and ``namespace.json`` (:mod:`tiering.fs.root`), ``O_DIRECT``,
one block to and from its file (:mod:`tiering.fs.blocks`, a whole share in
one native call where possible), the scan of the directory
(:mod:`tiering.fs.scanner`), pin markers (:mod:`tiering.fs.pins`) and the
free space after a write refused with ``ENOSPC`` / ``EDQUOT``.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.schema import InvalidValueError
from tiering.core.spec import Namespace
from tiering.core.store import Medium, ScanResult, WriteOutcome
from tiering.fs.blocks import BlockFiles
from tiering.fs.config import FsConfig
from tiering.fs.errors import DirectIONotUsableError, NotRegularFileError
from tiering.fs.io import open_backend
from tiering.fs.io.local import LocalBackend
from tiering.fs.layout import TRAILER_BYTES
from tiering.fs.native import open_native
from tiering.fs.pins import FsPins
from tiering.fs.root import direct_obstacle, prepare_namespace_dir, write_namespace_file
from tiering.fs.scanner import scan_namespace

logger = logging.getLogger(__name__)

_SYMLINK = frozenset({errno.ELOOP, errno.ENOTDIR})


class FsMedium(Medium):
    """Block files of one namespace directory, on a local disk or any fsspec filesystem.

    Args:
        tier_type: the tier's name (messages).
        cfg: the checked configuration.
        namespace: the stack's namespace (its digest names the directory).
        block_bytes: payload bytes per block.
        primary_kv_view: the primary tier's ``(num_blocks, block_bytes)`` view (``O_DIRECT`` and the
            native path need its address).

    Attributes:
        backend, root: the root's back end and its path there.
        namespace_dir: ``<root>/<namespace digest>``.
        files: the block files (:class:`~tiering.fs.blocks.BlockFiles`).
        block_io: which block I/O path is used (native batch or pure Python) and why.

    Raises:
        InvalidValueError: an unknown protocol or a filesystem package not installed (names ``root``).
        RootNotUsableError: the namespace directory cannot be created or written.
        DirectIONotUsableError: ``o_direct=True`` and ``O_DIRECT`` cannot be used.
    """

    label = "fs tier"
    counters = ("temps_removed",)

    def __init__(
        self, tier_type: str, cfg: FsConfig, namespace: Namespace, block_bytes: int, primary_kv_view: memoryview
    ) -> None:
        self.stored_block_bytes = block_bytes + TRAILER_BYTES
        self.stale_temp_s = cfg.stale_temp_s
        try:
            self.backend, self.root = open_backend(cfg.root, dict(cfg.storage_options or {}))
        except ValueError as exc:  # an unknown protocol, a filesystem package not installed
            raise InvalidValueError(tier_type, "root", str(exc)) from exc
        if isinstance(self.backend, LocalBackend):
            self.backend.cache_dirs = True  # one open per shard directory, not one per block
        self.namespace_dir = f"{self.root.rstrip('/')}/{namespace.digest}"
        self.location = self.namespace_dir
        self._tier_type, self._root_key = tier_type, cfg.root
        prepare_namespace_dir(self.backend, cfg.root, self.namespace_dir, tier_type)
        self._direct_reason = self._setup_direct(cfg.o_direct, block_bytes, primary_kv_view)
        self.files = BlockFiles(self.backend, self.namespace_dir, namespace.digest_bytes, block_bytes, cfg.fsync)
        self.files.native, self.block_io = open_native(
            self.backend, self.namespace_dir, namespace.digest_bytes, primary_kv_view
        )
        logger.info("fs tier: %s uses %s", self.namespace_dir, self.block_io)

    def _setup_direct(self, wanted: bool | str, block_bytes: int, view: memoryview) -> str:
        """Decide whether block files use ``O_DIRECT`` (the ``o_direct`` key); returns why not ("" when they do)."""
        if wanted is False:
            return "disabled by config (o_direct: false)"
        reason = direct_obstacle(self.backend, self.namespace_dir, block_bytes, view)
        if reason is None:
            self.backend.direct = True
            logger.info("fs tier: %s uses O_DIRECT", self.namespace_dir)
            return ""
        if wanted is True:
            problem = f"{self.root!r}: o_direct is true but O_DIRECT cannot be used: {reason}"
            raise DirectIONotUsableError(self._tier_type, problem)
        logger.info("fs tier: %s uses buffered I/O (no O_DIRECT: %s)", self.namespace_dir, reason)
        return reason

    @property
    def direct_reason(self) -> str:
        """Why block files do not use ``O_DIRECT`` ("" while they do)."""
        return "" if self.backend.direct else self.backend.direct_lost or self._direct_reason

    def write_many(
        self,
        keys: Sequence[OffloadKey],
        block_ids: Sequence[int],
        slot: Callable[[int], memoryview],
        stopping: Callable[[], bool],
    ) -> list[WriteOutcome]:
        """See :meth:`BlockFiles.write_many` (a whole share in one native call where possible)."""
        return list(self.files.write_many(keys, block_ids, slot, stopping))

    def read_many(
        self, keys: Sequence[OffloadKey], block_ids: Sequence[int], slot: Callable[[int], memoryview]
    ) -> list[BaseException | None]:
        """See :meth:`BlockFiles.read_many`."""
        return list(self.files.read_many(keys, block_ids, slot))

    def size(self, key: OffloadKey) -> int | None:
        """Size of ``key``'s block file (one ``lstat``); None when absent or not a regular file."""
        return self.files.size(key)

    def remove(self, key: OffloadKey) -> bool:
        """Unlink ``key``'s block file; True when it is gone."""
        return self.files.remove(key)

    def scan(self, stopping: Callable[[], bool]) -> ScanResult:
        """List the namespace directory (see :func:`~tiering.fs.scanner.scan_namespace`)."""
        return scan_namespace(
            self.backend, self.namespace_dir, self.stored_block_bytes, self.stale_temp_s, stopping, self.read_only
        )

    def write_namespace_record(self, record: Mapping[str, Any]) -> None:
        """Publish ``namespace.json`` in the namespace directory (when missing or different)."""
        write_namespace_file(self.backend, self._root_key, self.namespace_dir, dict(record), self._tier_type)

    def free_bytes(self) -> int | None:
        """Bytes the filesystem reports free for this user; None where unknown."""
        return self.backend.free_bytes(self.namespace_dir)

    def pin_records(self) -> FsPins:
        """Pin markers under ``<namespace dir>/pins``."""
        return FsPins(self.backend, self.namespace_dir)

    def failure_cause(self, exc: BaseException, *, load: bool, in_index: bool = False) -> str:
        """As :meth:`Medium.failure_cause`; a symlink or special file in a block's place is ``foreign`` on load."""
        if load and (isinstance(exc, NotRegularFileError) or (isinstance(exc, OSError) and exc.errno in _SYMLINK)):
            return "foreign"
        return super().failure_cause(exc, load=load, in_index=in_index)

    def stats(self) -> dict[str, int | float]:
        """``o_direct`` and ``native_io`` (1/0)."""
        return {"o_direct": int(self.backend.direct), "native_io": int(self.files.native is not None)}

    def close(self) -> None:
        """Close the back end's and the native path's descriptors."""
        self.backend.close()
        self.files.close()
