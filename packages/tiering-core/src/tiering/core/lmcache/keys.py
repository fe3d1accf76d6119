"""LMCache objects as tiering blocks: keys, namespace and the stored row. Imports nothing from LMCache.

LMCache names an object by its ``ObjectKey`` (chunk hash, model name, KV
rank, object group id, cache salt). Every field goes into our key, a
SHA-256 over all of them behind a domain tag naming the engine, so the same
chunk hash under another model, rank, group or salt is another block, and
no vLLM or SGLang block key can ever equal an LMCache one. The namespace
adds the engine name and the row format (:data:`KV_LAYOUT`), so LMCache
blocks live apart from every other engine's even in a shared root or
bucket.

An LMCache object's size varies (a last, partial chunk is smaller); a tier
stores fixed ``block_bytes`` rows. A row is an 8-byte little-endian payload
length followed by the payload and zero padding; the tier's checksum covers
the whole row, the length included.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.fields import length_prefixed

ENGINE = "lmcache"
"""The engine name written into every key's domain tag and into the namespace."""

KV_LAYOUT = "lmcache-object/v1"
"""The namespace's ``kv_layout``: an LMCache object framed by :func:`pack_row`."""

ROW_HEADER_BYTES = 8
"""Bytes in front of the payload in a row: the payload length (uint64, little-endian)."""

_DOMAIN = b"tiering/lmcache/object-key/v1\x00"
_LENGTH = struct.Struct("<Q")


def encode_key(key: Any) -> OffloadKey:
    """Our 32-byte block key for an LMCache ``ObjectKey`` (or anything with its five fields).

    Args:
        key: has ``chunk_hash`` (bytes), ``model_name`` (str), ``kv_rank``
            (int), ``object_group_id`` (int) and ``cache_salt`` (str).

    Raises:
        TypeError: a field has the wrong type (named).
    """
    chunk_hash = key.chunk_hash
    if not isinstance(chunk_hash, (bytes, bytearray)):
        raise TypeError(f"ObjectKey.chunk_hash must be bytes, got {type(chunk_hash).__name__}")
    digest = hashlib.sha256(_DOMAIN)
    for name in ("model_name", "cache_salt"):
        value = getattr(key, name)
        if not isinstance(value, str):
            raise TypeError(f"ObjectKey.{name} must be str, got {type(value).__name__}")
        digest.update(length_prefixed(value.encode()))
    for name in ("kv_rank", "object_group_id"):
        value = getattr(key, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"ObjectKey.{name} must be int, got {type(value).__name__}")
        digest.update(struct.pack("<q", value))  # fixed width: needs no length
    digest.update(length_prefixed(bytes(chunk_hash)))
    return OffloadKey(digest.digest())


def tenant_of(keys: Sequence[Any]) -> str:
    """The tenant of a batch of LMCache ``ObjectKey`` s: their common ``cache_salt`` (``""`` when they differ).

    LMCache's ``cache_salt`` is the tenant. Isolation needs nothing more (the
    salt is in every key, :func:`encode_key`); the tenant only tells tiers
    whose blocks these are (quotas, usage). A batch mixing salts is
    attributed to the default tenant ``""``.
    """
    salts = {getattr(key, "cache_salt", "") for key in keys}
    salt = salts.pop() if len(salts) == 1 else ""
    return salt if isinstance(salt, str) else ""


def namespace_config(object_bytes: int) -> dict[str, Any]:
    """The offloading-config keys that make the namespace of an LMCache adapter.

    Args:
        object_bytes: the largest LMCache object the adapter stores (bytes).

    Returns:
        ``model`` (the engine name: the model is in every key), ``kv_dtype``
        and ``kv_layout`` (the row format) and ``block_bytes`` (the row size).
    """
    return {
        "model": ENGINE,
        "kv_dtype": "opaque",
        "kv_layout": KV_LAYOUT,
        "block_size": 1,
        "block_bytes": object_bytes + ROW_HEADER_BYTES,
    }


def pack_row(row: memoryview, payload: memoryview) -> None:
    """Write ``payload`` into ``row`` as length + payload + zero padding.

    Args:
        row: a flat writable row of ``block_bytes`` bytes.
        payload: the object's bytes (flat, format ``"B"``).

    Raises:
        ValueError: the payload does not fit the row (sizes named).
    """
    size = len(payload)
    if size > len(row) - ROW_HEADER_BYTES:
        raise ValueError(
            f"LMCache object of {size} bytes does not fit object_bytes {len(row) - ROW_HEADER_BYTES}; "
            "raise adapter_params.object_bytes"
        )
    _LENGTH.pack_into(row, 0, size)
    end = ROW_HEADER_BYTES + size
    row[ROW_HEADER_BYTES:end] = payload
    row[end:] = bytes(len(row) - end)


def row_payload(row: memoryview) -> memoryview:
    """The payload of a row written by :func:`pack_row` (a view, no copy).

    Raises:
        ValueError: the length field is larger than the row (a row not of ours).
    """
    (size,) = _LENGTH.unpack_from(row, 0)
    if size > len(row) - ROW_HEADER_BYTES:
        raise ValueError(f"row length field {size} exceeds the row's {len(row) - ROW_HEADER_BYTES} payload bytes")
    return row[ROW_HEADER_BYTES : ROW_HEADER_BYTES + size]
