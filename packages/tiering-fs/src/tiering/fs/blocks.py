"""One block to and from its file: the trailer header on store, verification on load.

A block file is the payload (one primary slot, at offset 0) followed by a
:data:`~tiering.fs.layout.TRAILER_BYTES` trailer page: the
:mod:`tiering.core.format` header (128 bytes: namespace digest, key, length,
XXH3 checksum), then zeros. :class:`BlockFiles` holds no state about which
blocks exist (the tier's :class:`~tiering.core.store.index.CapacityIndex`
does); it only moves bytes, through the root's back end.

Per block, a store costs: the header (one XXH3 pass over the payload), one
temporary name (no system call: :class:`~tiering.fs.layout.TempNamer`), no
``stat`` of the final path (the rename replaces atomically; dedupe is the
index's job), and a ``mkdir`` only the first time a shard directory is used
by this instance (cached; redone once when a shard was removed under us).

With :attr:`BlockFiles.native` set (a local root, the library loaded: see
:mod:`tiering.fs.native`), :meth:`BlockFiles.write_many` and
:meth:`BlockFiles.read_many` move a whole share in one native call; a block
that fails there with ``ENOENT`` (its shard directory removed under us) is
redone once through the Python path, which recreates the directory.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from collections.abc import Callable, Sequence

from tiering.core.base import OffloadKey
from tiering.core.format import HEADER_SIZE, MAX_KEY_BYTES, encode_header, verify_block
from tiering.core.store import NotStartedError
from tiering.fs.io import Backend
from tiering.fs.layout import TRAILER_BYTES, block_path, shard_of, temp_namer
from tiering.fs.native import NativeBlockIO, block_error

_ZERO_TAIL = bytes(TRAILER_BYTES - HEADER_SIZE)


class BlockFiles:
    """Writes, reads, sizes and removes the block files of one namespace directory.

    Args:
        backend: the root's back end.
        namespace_dir: ``<root>/<namespace digest>``.
        digest: the namespace digest bytes written into (and checked in) every header.
        block_bytes: payload bytes per block.
        fsync: fsync each file and its directory at publish.

    Attributes:
        native: the native batch path (set by the tier for a local root when the
            library is usable), None for the pure-Python path.
    """

    native: NativeBlockIO | None = None

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

    def write_many(
        self,
        keys: Sequence[OffloadKey],
        block_ids: Sequence[int],
        slot: Callable[[int], memoryview],
        stopping: Callable[[], bool] = lambda: False,
    ) -> list[Exception | None]:
        """Publish ``keys[i]`` from primary slot ``block_ids[i]`` (as :meth:`write`, one native call when possible).

        Args:
            keys: the blocks' keys.
            block_ids: the primary slot of each.
            slot: primary slot ``block_id`` -> its ``memoryview``.
            stopping: checked before each block of the pure-Python path; once True the
                rest is not written (:class:`NotStartedError`). A native call writes its
                whole share (a few milliseconds).

        Returns:
            Per key None (published) or what :meth:`write` would have raised.
        """
        native = self.native
        if native is None or not native.accepts(keys):
            out: list[Exception | None] = []
            for key, block_id in zip(keys, block_ids, strict=True):
                stop = stopping()
                out.append(NotStartedError() if stop else _attempt(self.write, key, block_id, slot))
            return out
        backend = self.backend
        codes, lost = native.store(keys, block_ids, temp_namer.prefix, backend.direct, self.fsync)
        if lost:
            backend.give_up_direct(OSError(lost, os.strerror(lost)), "write")
        if not any(codes):
            return [None] * len(codes)
        return self._settle(native, self.write, codes, keys, block_ids, slot)

    def read_many(
        self, keys: Sequence[OffloadKey], block_ids: Sequence[int], slot: Callable[[int], memoryview]
    ) -> list[Exception | None]:
        """Read and verify ``keys[i]`` into slot ``block_ids[i]`` (as :meth:`read`), one native call when possible.

        Every block is attempted, also after a failure (a share may hold blocks of several jobs).

        Returns:
            Per key None (read and verified) or what :meth:`read` would have raised.
        """
        native = self.native
        if native is None or not native.accepts(keys):
            return [_attempt(self.read, key, block_id, slot) for key, block_id in zip(keys, block_ids, strict=True)]
        codes, lost = native.load(keys, block_ids, self.backend.direct)
        if lost:
            self.backend.give_up_direct(OSError(lost, os.strerror(lost)), "read")
        return self._settle(native, self.read, codes, keys, block_ids, slot)

    def _settle(
        self,
        native: NativeBlockIO,
        op: Callable[[OffloadKey, memoryview], object],
        codes: Sequence[int],
        keys: Sequence[OffloadKey],
        block_ids: Sequence[int],
        slot: Callable[[int], memoryview],
    ) -> list[Exception | None]:
        """Per key the outcome of a native call's ``codes``; ``ENOENT`` is tried again on the Python path.

        ``ENOENT`` means a shard directory was removed under a store, or a kept
        directory descriptor went stale under a load: the library drops the
        descriptor (``native.refresh``) and ``op`` (:meth:`write` /
        :meth:`read`) looks again by path.
        """
        out: list[Exception | None] = []
        for key, block_id, code in zip(keys, block_ids, codes, strict=True):
            if code == errno.ENOENT:
                native.refresh(shard_of(key))
                out.append(_attempt(op, key, block_id, slot))
            else:
                out.append(block_error(code, self.path(key)) if code else None)
        return out

    def close(self) -> None:
        """Close the native path's directory descriptors (the tier calls it at shutdown, after its threads)."""
        if self.native is not None:
            self.native.close()


def _attempt(
    op: Callable[[OffloadKey, memoryview], object], key: OffloadKey, block_id: int, slot: Callable[[int], memoryview]
) -> Exception | None:
    """Run one block operation on primary slot ``block_id``; None when it succeeded, else what it raised."""
    try:
        op(key, slot(block_id))
    except Exception as exc:
        return exc
    return None
