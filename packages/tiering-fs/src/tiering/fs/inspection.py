"""Offline inspection of an fs tier root for ``tiering ls / gc / verify``.

Only files laid out by this package are blocks or namespace files
(``<root>/<32 hex digest>/namespace.json`` and
``<root>/<digest>/<ab>/<key hex>.kvb``, each the payload followed by a
4096-byte trailer page that starts with the header); temporaries
(``<name>.tmp.<host>.<pid>.<nonce>.<counter>``, see :mod:`tiering.fs.layout`)
are neither reported as foreign nor removed here (the tier's own start-up scan
cleans stale ones); pin markers (``<root>/<digest>/pins/<key hex>.<ms>.pin``,
:mod:`tiering.fs.pins`) are not foreign and go with their namespace; anything
else, every symlink (to a file or a directory, wherever it is) and every FIFO,
socket or device node is foreign and is never deleted, followed or opened.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from tiering.core.format import HEADER_SIZE, TruncatedBlockError
from tiering.core.inspection import BlockInfo, TierInspector
from tiering.core.policies.pin_records import parse_marker
from tiering.fs.io import Backend, StoredFile, open_backend
from tiering.fs.layout import BLOCK_RE as _BLOCK
from tiering.fs.layout import DIGEST_RE as _DIGEST
from tiering.fs.layout import NAMESPACE_FILE, TRAILER_BYTES, is_temp_name
from tiering.fs.pins import PINS_DIR, FsPins


class FsInspector(TierInspector):
    """Walks an fs tier root (local path or fsspec URL).

    Args:
        backend: the tier's storage back end for the root.
        root: the root path in the back end's syntax.
        display_root: the root as configured, for messages.
    """

    def __init__(self, backend: Backend, root: str, display_root: str) -> None:
        self.backend = backend
        self.root = root.rstrip("/") or "/"
        self.display_root = display_root

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> FsInspector:
        """Open the root of an ``fs`` tier config entry (``root``, ``storage_options``).

        Nothing is touched here (``location()`` works for a root that does not
        exist yet, e.g. for ``tiering check --probe``); listing a root that
        does not exist raises ``FileNotFoundError``.

        Raises:
            ValueError: no ``root`` or an unknown protocol.
        """
        root = config.get("root")
        if not isinstance(root, str) or not root:
            raise ValueError(f"fs tier: 'root' must be a non-empty path or URL, got {root!r}")
        backend, base = open_backend(root, dict(config.get("storage_options") or {}))
        return cls(backend, base, root)

    def _require_root(self) -> None:
        if self.backend.is_local and not os.path.isdir(self.root):
            raise FileNotFoundError(f"fs tier root {self.display_root!r} does not exist")

    def location(self) -> str:
        return self.display_root

    def free_bytes(self) -> int | None:
        """Free bytes of the disk under a local root (of its nearest existing ancestor if it is not created yet)."""
        if not self.backend.is_local:
            return None
        existing = self.root
        while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
            existing = os.path.dirname(existing)
        return self.backend.free_bytes(existing)

    def _files(self) -> Iterator[tuple[str, StoredFile]]:
        self._require_root()
        prefix = self.root + "/"
        for stored in self.backend.scan(self.root):
            path = stored.path.replace(os.sep, "/")
            if path.startswith(prefix):
                yield path[len(prefix) :], stored

    def namespaces(self) -> list[str]:
        found = set()
        for rel, stored in self._files():
            top = rel.split("/", 1)[0]
            if _DIGEST.match(top) and not (stored.is_link or stored.is_special):
                found.add(top)
        return sorted(found)

    def read_namespace_file(self, digest: str) -> bytes | None:
        return self.backend.read_small(f"{self.root}/{digest}/{NAMESPACE_FILE}")

    def blocks(self, digest: str) -> Iterator[BlockInfo]:
        self._require_root()
        for stored in self.backend.scan(f"{self.root}/{digest}"):
            rel = stored.path.replace(os.sep, "/").split(f"/{digest}/", 1)[-1]
            match = _BLOCK.match(rel)
            if match and not (stored.is_link or stored.is_special):
                yield BlockInfo(stored.path, bytes.fromhex(match.group(2)), stored.size, stored.mtime)

    def foreign(self) -> Iterator[str]:
        for rel, stored in self._files():
            top, _, rest = rel.partition("/")
            ours = _DIGEST.match(top) and (
                rest == NAMESPACE_FILE or _BLOCK.match(rest) or is_temp_name(rest) or _is_marker(rest)
            )
            if stored.is_link or stored.is_special or not ours:
                yield stored.path

    def read_block(self, digest: str, block: BlockInfo) -> bytes:
        data = self.backend.read_small(block.name)
        if data is None:
            raise FileNotFoundError(block.name)
        return data

    def split_block(self, data: memoryview) -> tuple[memoryview, memoryview]:
        """Payload first, then the trailer page whose first bytes are the header.

        Raises:
            TruncatedBlockError: ``data`` is shorter than the trailer.
        """
        if data.nbytes < TRAILER_BYTES:
            raise TruncatedBlockError(
                f"block file is {data.nbytes} bytes, shorter than its {TRAILER_BYTES}-byte trailer"
            )
        end = data.nbytes - TRAILER_BYTES
        return data[end : end + HEADER_SIZE], data[:end]

    def remove_blocks(self, digest: str, blocks: list[BlockInfo]) -> int:
        removed = 0
        for block in blocks:
            if not _BLOCK.match(block.name.replace(os.sep, "/").split(f"/{digest}/", 1)[-1]):
                raise ValueError(f"refusing to remove {block.name!r}: not a block file of this tier")
            if self.backend.remove(block.name):
                removed += 1
        if self.backend.is_local:
            # Shard directories left empty would keep costing disk space and scan time.
            shards = {os.path.dirname(block.name) for block in blocks}
            for shard in sorted(shards):
                with contextlib.suppress(OSError):  # not empty (or already gone): keep it
                    os.rmdir(shard)
        return removed

    def remove_namespace(self, digest: str) -> int:
        if not _DIGEST.match(digest):
            raise ValueError(f"{digest!r} is not a namespace digest (32 hex characters)")
        removed = self.remove_blocks(digest, list(self.blocks(digest)))
        self.backend.remove(f"{self.root}/{digest}/{NAMESPACE_FILE}")
        pins = FsPins(self.backend, f"{self.root}/{digest}")
        with contextlib.suppress(OSError):  # a marker left behind expires by itself
            pins.remove_pins(list(pins.list_pins()))
        if self.backend.is_local:
            _remove_empty_dirs(os.path.join(self.root, digest))
        return removed


def _is_marker(rest: str) -> bool:
    """Whether ``rest`` (relative to a namespace directory) is a pin marker (:mod:`tiering.fs.pins`)."""
    directory, _, name = rest.partition("/")
    return directory == PINS_DIR and parse_marker(name) is not None


def _remove_empty_dirs(top: str) -> None:
    """Remove empty directories below and including ``top`` (a directory with anything left stays)."""
    for current, _, _ in sorted(os.walk(top), key=lambda entry: -len(entry[0])):
        with contextlib.suppress(OSError):
            os.rmdir(current)
