"""A frequency sketch of bounded memory: how often a key was seen lately, TinyLFU-style.

:class:`FrequencySketch` follows TinyLFU (Einziger, Friedman and Manes,
"TinyLFU: A Highly Efficient Cache Admission Policy", 2017) as Caffeine
implements it: a count-min sketch of 4-bit counters (4 rows) in front of
which sits a *doorkeeper*, a Bloom filter that absorbs the first sighting
of each key so that keys seen once (most of them, in a KV-cache trace)
never take a counter. After ``sample_size`` recorded sightings every
counter is halved and the doorkeeper cleared (the "reset" of TinyLFU), so
the estimates follow the recent past and old popularity fades.

The memory is fixed at construction: half of ``memory_bytes`` holds the
counters (two per byte), the other half the doorkeeper's bits. Both are
``bytearray``s, so a record costs two XXH3 hashes and eight byte
operations, and the halving is one ``bytearray.translate`` in C.

An estimate can only be too high (hash collisions), never too low between
two resets: a key recorded ``n`` times since the last reset reads at least
``min(n, 16)``; a reset halves the counts (a key seen often stays above one).
"""

from __future__ import annotations

import struct

from xxhash import xxh3_128_digest

__all__ = ["MAX_COUNT", "MAX_SKETCH_BYTES", "MIN_SKETCH_BYTES", "FrequencySketch"]

DEPTH = 4
"""Rows of the count-min sketch (and hash functions of the doorkeeper)."""

MAX_COUNT = 15
"""The largest value of a 4-bit counter; an estimate is at most ``MAX_COUNT + 1`` (the doorkeeper adds one)."""

MIN_SKETCH_BYTES = 64
"""The smallest accepted ``memory_bytes``."""

MAX_SKETCH_BYTES = 1 << 30
"""The largest accepted ``memory_bytes`` (1 GiB: every index fits the 32 bits a hash gives it)."""

_FOUR = struct.Struct("<4I")  # a 128-bit hash as four 32-bit indices

# Each byte holds two counters; halving both is a table look-up per byte.
_HALVE = bytes(((b >> 4) >> 1) << 4 | ((b & 0x0F) >> 1) for b in range(256))


def _power_of_two_at_most(n: int) -> int:
    return 1 << (n.bit_length() - 1)


class FrequencySketch:
    """Approximate counts of recent sightings of byte-string keys, in at most ``memory_bytes`` bytes.

    Args:
        memory_bytes: bytes of the counters plus the doorkeeper (:data:`MIN_SKETCH_BYTES` to
            :data:`MAX_SKETCH_BYTES`); the sketch uses the largest power of two not above it.
        sample_size: sightings between two resets (halvings); default: the
            number of counters per row (``memory_bytes / 4``), which keeps
            the doorkeeper at 16 bits per distinct key (a false positive
            rate near 0.2 %) even when every sighting is of a new key.

    Raises:
        ValueError: ``memory_bytes`` out of that range, or ``sample_size`` below 1.
    """

    def __init__(self, memory_bytes: int, sample_size: int | None = None) -> None:
        if not MIN_SKETCH_BYTES <= memory_bytes <= MAX_SKETCH_BYTES:
            raise ValueError(
                f"sketch memory must be >= {MIN_SKETCH_BYTES} and <= {MAX_SKETCH_BYTES} bytes, got {memory_bytes}"
            )
        half = _power_of_two_at_most(memory_bytes) // 2
        self._table = bytearray(half)  # DEPTH rows of 4-bit counters, two counters a byte
        self._door = bytearray(half)  # doorkeeper bits
        self._row_mask = half * 2 // DEPTH - 1  # counters per row, minus one (a power of two)
        self._row2, self._row3, self._row4 = (row * (self._row_mask + 1) for row in range(1, DEPTH))
        self._door_mask = half * 8 - 1
        self.sample_size = sample_size if sample_size is not None else self._row_mask + 1
        if self.sample_size < 1:
            raise ValueError(f"sample_size must be >= 1, got {sample_size}")
        self._recorded = 0  # sightings since the last reset
        self.resets = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the counters and the doorkeeper."""
        return len(self._table) + len(self._door)

    def _slots(self, key: bytes) -> tuple[list[int], list[int]]:
        """``key``'s counter index in each row (into the whole table) and its doorkeeper bit indices."""
        mask, door = self._row_mask, self._door_mask
        a, b, c, d = _FOUR.unpack(xxh3_128_digest(key))
        counters = [a & mask, self._row2 + (b & mask), self._row3 + (c & mask), self._row4 + (d & mask)]
        a, b, c, d = _FOUR.unpack(xxh3_128_digest(key, seed=1))
        return counters, [a & door, b & door, c & door, d & door]

    def _low(self, counters: list[int]) -> int:
        """The smallest of the key's counters."""
        table = self._table
        a, b, c, d = counters
        return min(
            table[a >> 1] >> ((a & 1) << 2) & 0x0F,
            table[b >> 1] >> ((b & 1) << 2) & 0x0F,
            table[c >> 1] >> ((c & 1) << 2) & 0x0F,
            table[d >> 1] >> ((d & 1) << 2) & 0x0F,
        )

    def _in_door(self, bits: list[int]) -> int:
        door = self._door
        a, b, c, d = bits
        return door[a >> 3] >> (a & 7) & door[b >> 3] >> (b & 7) & door[c >> 3] >> (c & 7) & door[d >> 3] >> (d & 7) & 1

    def estimate(self, key: bytes) -> int:
        """Recent sightings of ``key`` (0 .. ``MAX_COUNT + 1``; may over-count): its smallest counter, plus one
        when the doorkeeper has it. A reset halves what the counters hold and forgets the doorkeeper's one.
        """  # noqa: D205
        counters, bits = self._slots(key)
        return self._low(counters) + self._in_door(bits)

    def record(self, key: bytes) -> int:
        """Count one sighting of ``key``; returns its estimate after it.

        The first sighting sets the doorkeeper's bits; later ones increment
        the key's smallest counters (conservative update), saturating at
        :data:`MAX_COUNT`. Every ``sample_size`` sightings the sketch resets.
        """
        counters, bits = self._slots(key)
        low = self._low(counters)
        if not self._in_door(bits):
            door = self._door
            for bit in bits:
                door[bit >> 3] |= 1 << (bit & 7)
        elif low < MAX_COUNT:
            table = self._table
            for i in counters:
                shift = (i & 1) << 2
                if table[i >> 1] >> shift & 0x0F == low:
                    table[i >> 1] += 1 << shift
            low += 1
        self._recorded += 1
        if self._recorded >= self.sample_size:
            self.reset()
        return low + 1

    def reset(self) -> None:
        """Halve every counter and clear the doorkeeper (TinyLFU's aging step)."""
        self._table = self._table.translate(_HALVE)
        self._door = bytearray(len(self._door))
        self._recorded = 0
        self.resets += 1
