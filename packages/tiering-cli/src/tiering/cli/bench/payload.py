"""Deterministic block payloads, so every loaded byte can be checked."""

from __future__ import annotations

import hashlib


def payload_for(key: bytes, block_bytes: int) -> bytes:
    """``block_bytes`` bytes derived from ``key``: SHA-256(key) repeated.

    Cheap to make and to compare; two keys never share a payload, so a
    block served under the wrong key fails the comparison.
    """
    seed = hashlib.sha256(b"tiering.bench:" + key).digest()
    reps, rest = divmod(block_bytes, len(seed))
    return seed * reps + seed[:rest]
