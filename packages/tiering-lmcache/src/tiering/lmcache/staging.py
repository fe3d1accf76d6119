"""The LMCache adapter's staging buffer: page-aligned rows, every page faulted in once at start. No LMCache import.

The tier reads and writes the rows of this buffer (its primary view), and
each store and load copies an object into or out of one row. A freshly
mapped buffer has no pages behind it: the first copy into each 4 KiB page
takes a page fault, and on a busy host those faults, not the copy, are
most of a first pass's time (a 128 MiB buffer: tens of thousands of faults).
:class:`StagingBuffer` pays them once, when the adapter starts: it maps the
buffer with ``MAP_POPULATE`` where the platform has it (the kernel fills in
every page in one call) and then writes one byte of every page, which
faults in whatever the kernel left out (a platform without
``MAP_POPULATE``, or a populate cut short under memory pressure). The
buffer is resident from then on, ``rows x row_bytes`` bytes of host
memory for the adapter's life.

The mapping starts on a page boundary and rows are whole multiples of
:data:`~tiering.lmcache.keys.ROW_ALIGN` bytes, so every row is
aligned as ``O_DIRECT`` requires and a tier may read and write it as it is.
"""

from __future__ import annotations

import ctypes
import mmap
import time


class StagingBuffer:
    """``rows`` rows of ``row_bytes`` bytes of anonymous, page-aligned, pre-faulted memory.

    Args:
        rows: number of rows (>= 1).
        row_bytes: bytes per row (>= 1).

    Attributes:
        view: the rows as a ``(rows, row_bytes)`` memoryview, format ``"B"``.
        populate_s: seconds spent mapping and faulting in the buffer.
        populated: whether the kernel was asked to populate the mapping
            (``MAP_POPULATE``); every page is touched either way.

    Raises:
        ValueError: ``rows`` or ``row_bytes`` < 1.
        OSError: the mapping could not be made (not enough memory).
    """

    def __init__(self, rows: int, row_bytes: int) -> None:
        if rows < 1 or row_bytes < 1:
            raise ValueError(f"staging buffer needs >= 1 row of >= 1 byte, got {rows} x {row_bytes}")
        size = rows * row_bytes
        populate = getattr(mmap, "MAP_POPULATE", 0)
        started = time.perf_counter()
        # Private anonymous memory: a populate on a writable private mapping allocates real pages
        # (not the shared zero page), so the first store into a row faults no more.
        self._mmap = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | populate)
        flat = memoryview(self._mmap)
        try:
            page = mmap.PAGESIZE
            flat[::page] = bytes(len(range(0, size, page)))  # one write per page, in C: faults in any page left out
            self.view = flat.cast("B", (rows, row_bytes))
        finally:
            flat.release()
        self.populate_s = time.perf_counter() - started
        self.populated = bool(populate)
        self.rows, self.row_bytes = rows, row_bytes

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer (``rows x row_bytes``)."""
        return self.rows * self.row_bytes

    def address(self) -> int:
        """The address of the buffer's first byte (a page boundary)."""
        return ctypes.addressof(ctypes.c_char.from_buffer(self._mmap))

    def close(self) -> None:
        """Release the view and unmap the buffer.

        Raises:
            BufferError: a view of the buffer is still exported (a tier still holds one).
        """
        self.view.release()
        self._mmap.close()
