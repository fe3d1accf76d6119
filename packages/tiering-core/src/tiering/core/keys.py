"""Block keys (prefix hashes) for running tiering without an engine.

An engine normally makes the keys; :func:`block_keys` makes the same kind of
key from token ids so that ``tiering bench`` and tests have real ones. The
hash is SHA-256 chained over the blocks (the scheme of vLLM's
``hash_block_tokens`` with a fixed seed instead of ``PYTHONHASHSEED``), so the
same tokens give the same keys in every process. Python's ``hash()`` is never
used (it is salted per interpreter).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from tiering.core.base import OffloadKey

ROOT_HASH = hashlib.sha256(b"tiering.prefix-hash.v1").digest()
"""The parent hash of a sequence's first block."""

KEY_BYTES = 32


def chain_hash(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """SHA-256 of ``parent`` followed by ``token_ids`` as little-endian uint32s (32 bytes).

    Raises:
        struct.error: a token id outside ``[0, 2**32)``.
    """
    return hashlib.sha256(parent + struct.pack(f"<{len(token_ids)}I", *token_ids)).digest()


def block_keys(token_ids: Sequence[int], block_size: int) -> list[OffloadKey]:
    """The prefix-hash key of every full block of ``token_ids``.

    Args:
        token_ids: the sequence's token ids.
        block_size: tokens per block (> 0); a trailing partial block gets no key.

    Returns:
        ``len(token_ids) // block_size`` keys of :data:`KEY_BYTES` bytes each.

    Raises:
        ValueError: ``block_size`` is not positive.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    keys: list[OffloadKey] = []
    parent = ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = chain_hash(parent, token_ids[start : start + block_size])
        keys.append(OffloadKey(parent))
    return keys


def trace_block_key(hash_id: int) -> OffloadKey:
    """A key for a block id of a Mooncake trace (``hash_ids`` entries).

    The trace's ids are already prefix-chain hashes remapped to integers;
    this spreads them into :data:`KEY_BYTES` bytes deterministically.
    """
    return OffloadKey(hashlib.sha256(b"mooncake:%d" % hash_id).digest())
