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
``bytearray``s, so a record costs one BLAKE2b hash and eight byte
operations, and the halving is one ``bytearray.translate`` in C.

An estimate can only be too high (hash collisions), never too low between
two resets: a key recorded ``n`` times since the last reset reads at least
``min(n, 16)``; a reset halves the counts (a key seen often stays above one).
"""

from __future__ import annotations

import hashlib

__all__ = ["MAX_COUNT", "MIN_SKETCH_BYTES", "FrequencySketch"]

DEPTH = 4
"""Rows of the count-min sketch (and hash functions of the doorkeeper)."""

MAX_COUNT = 15
"""The largest value of a 4-bit counter; an estimate is at most ``MAX_COUNT + 1`` (the doorkeeper adds one)."""

MIN_SKETCH_BYTES = 64
"""The smallest accepted ``memory_bytes``."""

# Each byte holds two counters; halving both is a table look-up per byte.
_HALVE = bytes(((b >> 4) >> 1) << 4 | ((b & 0x0F) >> 1) for b in range(256))


def _power_of_two_at_most(n: int) -> int:
    return 1 << (n.bit_length() - 1)


class FrequencySketch:
    """Approximate counts of recent sightings of byte-string keys, in at most ``memory_bytes`` bytes.

    Args:
        memory_bytes: bytes of the counters plus the doorkeeper (>= :data:`MIN_SKETCH_BYTES`);
            the sketch uses the largest power of two not above it.
        sample_size: sightings between two resets (halvings); default: the
            number of counters per row (``memory_bytes / 4``), which keeps
            the doorkeeper at 16 bits per distinct key (a false positive
            rate near 0.2 %) even when every sighting is of a new key.

    Raises:
        ValueError: ``memory_bytes`` below :data:`MIN_SKETCH_BYTES` or ``sample_size`` below 1.
    """

    def __init__(self, memory_bytes: int, sample_size: int | None = None) -> None:
        if memory_bytes < MIN_SKETCH_BYTES:
            raise ValueError(f"sketch memory must be >= {MIN_SKETCH_BYTES} bytes, got {memory_bytes}")
        half = _power_of_two_at_most(memory_bytes) // 2
        self._table = bytearray(half)  # DEPTH rows of 4-bit counters, two counters a byte
        self._door = bytearray(half)  # doorkeeper bits
        self._row_mask = half * 2 // DEPTH - 1  # counters per row, minus one (a power of two)
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

    def _indices(self, key: bytes) -> tuple[list[int], list[int]]:
        """Counter indices (one per row, into the whole table) and doorkeeper bit indices of ``key``."""
        h = int.from_bytes(hashlib.blake2b(key, digest_size=32).digest(), "little")
        width = self._row_mask + 1
        counters = [row * width + ((h >> (32 * row)) & self._row_mask) for row in range(DEPTH)]
        bits = [(h >> (128 + 32 * i)) & self._door_mask for i in range(DEPTH)]
        return counters, bits

    def _count(self, index: int) -> int:
        return (self._table[index >> 1] >> ((index & 1) * 4)) & 0x0F

    def _in_door(self, bits: list[int]) -> bool:
        return all(self._door[b >> 3] >> (b & 7) & 1 for b in bits)

    def estimate(self, key: bytes) -> int:
        """Recent sightings of ``key`` (0 .. ``MAX_COUNT + 1``; may over-count): its smallest counter, plus one
        when the doorkeeper has it. A reset halves what the counters hold and forgets the doorkeeper's one.
        """  # noqa: D205
        counters, bits = self._indices(key)
        return min(self._count(i) for i in counters) + self._in_door(bits)

    def record(self, key: bytes) -> int:
        """Count one sighting of ``key``; returns its estimate after it.

        The first sighting sets the doorkeeper's bits; later ones increment
        the key's smallest counters (conservative update), saturating at
        :data:`MAX_COUNT`. Every ``sample_size`` sightings the sketch resets.
        """
        counters, bits = self._indices(key)
        low = min(self._count(i) for i in counters)
        if not self._in_door(bits):
            for b in bits:
                self._door[b >> 3] |= 1 << (b & 7)
        elif low < MAX_COUNT:
            for i in counters:
                if self._count(i) == low:
                    self._table[i >> 1] += 1 << ((i & 1) * 4)
            low += 1
        estimate = low + 1
        self._recorded += 1
        if self._recorded >= self.sample_size:
            self.reset()
        return estimate

    def reset(self) -> None:
        """Halve every counter and clear the doorkeeper (TinyLFU's aging step)."""
        self._table = self._table.translate(_HALVE)
        self._door = bytearray(len(self._door))
        self._recorded = 0
        self.resets += 1
