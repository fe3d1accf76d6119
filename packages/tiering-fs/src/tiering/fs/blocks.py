"""One block to and from its file: the trailer header on store, verification on load.

A block file is the payload (one primary slot, at offset 0) followed by a
:data:`~tiering.fs.layout.TRAILER_BYTES` trailer page: the
:mod:`tiering.core.format` header (128 bytes: namespace digest, key, length,
XXH3 checksum), then zeros. :class:`BlockFiles` holds no state about which
blocks exist (the tier's :class:`~tiering.core.toolkit.index.CapacityIndex`
does); it only moves bytes, through the root's back end.

Per block, a store costs: the header (one XXH3 pass over the payload), one
temporary name (no system call: :class:`~tiering.fs.layout.TempNamer`), no
``stat`` of the final path (the rename replaces atomically; dedupe is the
index's job), and a ``mkdir`` only the first time a shard directory is used
by this instance (cached; redone once when a shard was removed under us).
"""

from __future__ import annotations

import mmap
import threading

from tiering.core.base import OffloadKey
from tiering.core.format import HEADER_SIZE, MAX_KEY_BYTES, encode_header, verify_block
from tiering.fs.io import Backend
from tiering.fs.layout import TRAILER_BYTES, block_path, temp_namer

_ZERO_TAIL = bytes(TRAILER_BYTES - HEADER_SIZE)


class BlockFiles:
    """Writes, reads, sizes and removes the block files of one namespace directory.

    Args:
        backend: the root's back end.
        namespace_dir: ``<root>/<namespace digest>``.
        digest: the namespace digest bytes written into (and checked in) every header.
        block_bytes: payload bytes per block.
        fsync: fsync each file and its directory at publish.
    """

    def __init__(self, backend: Backend, namespace_dir: str, digest: bytes, block_bytes: int, fsync: bool) -> None:
        self.backend = backend
        self.namespace_dir = namespace_dir
        self.digest = digest
        self.block_bytes = block_bytes
        self.stored_block_bytes = block_bytes + TRAILER_BYTES
        self.fsync = fsync
        self._made_dirs: set[str] = set()
        self._trailers = threading.local()

    def path(self, key: bytes) -> str:
        """Path of ``key``'s block file (see :func:`tiering.fs.layout.block_path`)."""
        return block_path(self.namespace_dir, key)

    def _trailer(self) -> memoryview:
        """This thread's page-aligned trailer buffer (an anonymous mapping, so ``O_DIRECT`` can use it)."""
        buf: memoryview | None = getattr(self._trailers, "buf", None)
        if buf is None:
            buf = memoryview(mmap.mmap(-1, TRAILER_BYTES))
            self._trailers.buf = buf
        return buf

    def _ensure_dir(self, directory: str) -> None:
        if directory not in self._made_dirs:
            self.backend.makedirs(directory)
            self._made_dirs.add(directory)  # set.add is atomic; a duplicate makedirs is harmless

    def write(self, key: OffloadKey, payload: memoryview) -> None:
        """Publish ``payload`` as ``key``'s block (atomically: temporary name, then rename).

        Raises:
            ValueError: the key is longer than the header holds.
            OSError: the write failed (nothing is left behind).
        """
        if len(key) > MAX_KEY_BYTES:
            raise ValueError(f"key of {len(key)} bytes; at most {MAX_KEY_BYTES}")
        final = self.path(key)
        trailer = self._trailer()
        trailer[:HEADER_SIZE] = encode_header(self.digest, key, payload)
        trailer[HEADER_SIZE:] = _ZERO_TAIL
        directory = final.rsplit("/", 1)[0]
        self._ensure_dir(directory)
        tmp = temp_namer(final)
        try:
            self.backend.write_block(tmp, final, payload, trailer, self.fsync)
        except FileNotFoundError:
            # The shard directory was removed under us (gc, cleanup by hand): recreate it once.
            self._made_dirs.discard(directory)
            self._ensure_dir(directory)
            self.backend.write_block(tmp, final, payload, trailer, self.fsync)

    def read(self, key: OffloadKey, target: memoryview) -> int:
        """Read ``key``'s block into ``target`` and verify it; returns the stored size in bytes.

        Raises:
            FileNotFoundError: no such block file.
            BlockFormatError: wrong size, header, namespace, key or checksum (the bytes in ``target`` are not valid).
            OSError: the read failed.
        """
        trailer = self._trailer()
        size = self.backend.read_block(self.path(key), target, trailer, self.stored_block_bytes)
        verify_block(trailer[:HEADER_SIZE], target, self.digest, key)
        return size

    def size(self, key: OffloadKey) -> int | None:
        """Size of ``key``'s block file in bytes; None when absent (or reached through a symlink)."""
        return self.backend.size(self.path(key))

    def remove(self, key: OffloadKey) -> bool:
        """Remove ``key``'s block file; True when it is gone (also when it was already), False on an error."""
        return self.backend.remove(self.path(key))
