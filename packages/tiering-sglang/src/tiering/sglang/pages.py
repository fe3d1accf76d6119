"""SGLang's pages as tiering blocks: the page geometry and the staging buffer the tiers read and write.

SGLang's host pool describes the pages of a call by
``get_page_buffer_meta(host_indices) -> (pointers, sizes)``: for each page
the same number of segments, in a fixed order (layer_first MHA: K then V of
each layer; page_first MHA: K then V; MLA: one per layer or one per page).
A tiering block is one page: its segments, concatenated in that order.

The tiers read and write rows of a ``(slots, page_bytes)`` host buffer (their
primary view); :class:`Staging` is that buffer. A store gathers each page's
segments into a slot, a load scatters a verified slot back to the page's
segments. Slots are lent to one call at a time (:meth:`Staging.acquire`).
"""

from __future__ import annotations

import ctypes
import dataclasses
import struct
import threading
from collections.abc import Sequence

from tiering.core.base import OffloadKey
from tiering.core.format import MAX_KEY_BYTES

VALUE_MAGIC = bytes.fromhex("9e3779b97f4a7c15")
"""First half of a short value's trailer (8 bytes; the second half is the value's length, uint64 LE)."""

VALUE_TRAILER_BYTES = 16
"""Bytes a short value's trailer takes at the end of its block: a value is at most a page less this."""

_TRAILER = struct.Struct("<8sQ")


def page_key(key: str) -> OffloadKey:
    """SGLang's page key (hex SHA-256) as a tiering key (its UTF-8 bytes).

    Raises:
        ValueError: the key is longer than tiering's 64-byte limit.
    """
    raw = key.encode()
    if len(raw) > MAX_KEY_BYTES:
        raise ValueError(f"SGLang key of {len(raw)} bytes exceeds {MAX_KEY_BYTES} bytes: {key[:80]!r}")
    return OffloadKey(raw)


@dataclasses.dataclass(frozen=True)
class PageGeometry:
    """The segments of one page, as the host pool's ``get_page_buffer_meta`` reports them.

    Attributes:
        segment_bytes: bytes of each segment of a page, in order.
    """

    segment_bytes: tuple[int, ...]

    @property
    def page_bytes(self) -> int:
        """Bytes of one page (all segments)."""
        return sum(self.segment_bytes)

    @classmethod
    def from_meta(cls, sizes: Sequence[int], pages: int) -> PageGeometry:
        """The geometry of ``pages`` pages described by ``sizes`` (bytes per segment, all pages).

        Raises:
            ValueError: the sizes do not split into ``pages`` equal runs of positive sizes.
        """
        if pages <= 0 or not sizes or len(sizes) % pages:
            raise ValueError(f"host pool page meta: {len(sizes)} segments do not split into {pages} page(s)")
        per_page = len(sizes) // pages
        first = tuple(int(s) for s in sizes[:per_page])
        if any(s <= 0 for s in first) or any(
            tuple(int(s) for s in sizes[i : i + per_page]) != first for i in range(per_page, len(sizes), per_page)
        ):
            raise ValueError(f"host pool page meta: pages differ in their segment sizes ({list(sizes)[:8]}...)")
        return cls(first)

    def segments(self, pointers: Sequence[int], sizes: Sequence[int], pages: int) -> list[list[tuple[int, int]]]:
        """Per page, its ``(address, bytes)`` segments, checked against this geometry.

        Raises:
            ValueError: the meta of the call does not match this geometry (count or sizes).
        """
        if len(pointers) != len(sizes) or len(sizes) != pages * len(self.segment_bytes):
            raise ValueError(
                f"host pool page meta: {len(pointers)} pointers and {len(sizes)} sizes for {pages} page(s) "
                f"of {len(self.segment_bytes)} segments"
            )
        per_page = len(self.segment_bytes)
        out = []
        for page in range(pages):
            start = page * per_page
            segs = [(int(pointers[i]), int(sizes[i])) for i in range(start, start + per_page)]
            if tuple(size for _, size in segs) != self.segment_bytes:
                raise ValueError(f"host pool page meta: page {page} has segment sizes other than the pool's")
            out.append(segs)
        return out


class Staging:
    """A host buffer of ``slots`` page slots, the tiers' primary view, lent out slot by slot.

    Args:
        slots: number of page slots (>= 1).
        page_bytes: bytes per slot (>= 1).

    Raises:
        ValueError: ``slots`` or ``page_bytes`` < 1.
    """

    def __init__(self, slots: int, page_bytes: int) -> None:
        if slots < 1 or page_bytes < 1:
            raise ValueError(f"staging buffer needs >= 1 slot of >= 1 byte, got {slots} x {page_bytes}")
        self.slots = slots
        self.page_bytes = page_bytes
        self._buffer = bytearray(slots * page_bytes)
        self._anchor = ctypes.c_char.from_buffer(self._buffer)
        self._base = ctypes.addressof(self._anchor)
        self.view = memoryview(self._buffer).cast("B", (slots, page_bytes))
        """The tiers' primary view: ``(slots, page_bytes)``, format ``"B"``."""
        self._free = list(range(slots - 1, -1, -1))
        self._cond = threading.Condition()

    def acquire(self, count: int, timeout_s: float | None = None) -> list[int]:
        """Take ``count`` free slots, waiting until that many are free (at most ``timeout_s`` seconds).

        Raises:
            ValueError: ``count`` is not in ``[1, slots]``.
            TimeoutError: not that many slots came free in time (slots of
                timed-out jobs stay lent until their tier reports them).
        """
        if not 1 <= count <= self.slots:
            raise ValueError(f"cannot take {count} of {self.slots} staging slots")
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._free) >= count, timeout_s):
                raise TimeoutError(f"{count} staging slots not free within {timeout_s} s ({len(self._free)} free)")
            return [self._free.pop() for _ in range(count)]

    def release(self, slots: Sequence[int]) -> None:
        """Give slots back (each exactly once)."""
        with self._cond:
            self._free.extend(slots)
            self._cond.notify_all()

    def free_slots(self) -> int:
        """How many slots are free now."""
        with self._cond:
            return len(self._free)

    def address(self, slot: int) -> int:
        """The address of slot ``slot``'s first byte.

        Raises:
            IndexError: ``slot`` is outside ``[0, slots)``.
        """
        if not 0 <= slot < self.slots:
            raise IndexError(f"staging slot {slot} outside [0, {self.slots})")
        return self._base + slot * self.page_bytes

    def gather(self, slot: int, segments: Sequence[tuple[int, int]]) -> None:
        """Copy a page's segments (``(address, bytes)``, in order) into ``slot``.

        Segments of less than a page are a short value: zeros, then the trailer, fill the slot's rest.

        Raises:
            ValueError: the segments hold more than a page, or a short value too long for its trailer.
        """
        total = sum(size for _, size in segments)
        if total > self.page_bytes or self.page_bytes - VALUE_TRAILER_BYTES < total < self.page_bytes:
            raise ValueError(f"{total} bytes do not fit a page of {self.page_bytes} (or at most a page less 16)")
        offset = self.address(slot)
        for address, size in segments:
            ctypes.memmove(offset, address, size)
            offset += size
        if total < self.page_bytes:
            ctypes.memset(offset, 0, self.page_bytes - total - VALUE_TRAILER_BYTES)
            trailer = _TRAILER.pack(VALUE_MAGIC, total)
            ctypes.memmove(self.address(slot) + self.page_bytes - VALUE_TRAILER_BYTES, trailer, VALUE_TRAILER_BYTES)

    def stored_length(self, slot: int) -> int:
        """Bytes of the value in ``slot``: a short value's length (its trailer), else ``page_bytes``."""
        if self.page_bytes <= VALUE_TRAILER_BYTES:
            return self.page_bytes
        tail = ctypes.string_at(self.address(slot) + self.page_bytes - VALUE_TRAILER_BYTES, VALUE_TRAILER_BYTES)
        magic, length = _TRAILER.unpack(tail)
        if magic == VALUE_MAGIC and 0 < length <= self.page_bytes - VALUE_TRAILER_BYTES:
            return int(length)
        return self.page_bytes

    def scatter(self, slot: int, segments: Sequence[tuple[int, int]]) -> bool:
        """Copy ``slot`` out to a page's segments (``(address, bytes)``, in order).

        Returns:
            False (nothing copied) when the slot holds a value of another length than the segments
            (:meth:`stored_length`): a short value asked as a page, a page as a short value.
        """
        if self.stored_length(slot) != sum(size for _, size in segments):
            return False
        offset = self.address(slot)
        for address, size in segments:
            ctypes.memmove(address, offset, size)
            offset += size
        return True

    def close(self) -> None:
        """Release the buffer's views (call once no tier uses them any more)."""
        self.view.release()
