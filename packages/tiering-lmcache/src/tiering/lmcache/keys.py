"""LMCache objects as tiering blocks: keys, namespace and the stored row. Imports nothing from LMCache.

LMCache names an object by its ``ObjectKey`` (chunk hash, model name, KV
rank, object group id, cache salt). Every field goes into our key, a
SHA-256 over all of them behind a domain tag naming the engine, so the same
chunk hash under another model, rank, group or salt is another block, and
no vLLM or SGLang block key can ever equal an LMCache one. The key then
carries the cache salt's tag (:func:`salt_tag`), so that the bytes a tier
holds per salt can be counted again from the keys alone after a restart.
The namespace adds the engine name and the row format (:data:`KV_LAYOUT`), so LMCache
blocks live apart from every other engine's even in a shared root or
bucket.

An LMCache object's size varies (a last, partial chunk is smaller); a tier
stores fixed ``block_bytes`` rows (:func:`row_bytes`). A row is an 8-byte
little-endian payload length followed by the payload and zero padding up to
a whole number of :data:`ROW_ALIGN` bytes, so that a row can move with
``O_DIRECT``; the tier's checksum covers the whole row, the length included.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.fields import length_prefixed

ENGINE = "lmcache"
"""The engine name written into every key's domain tag and into the namespace."""

KV_LAYOUT = "lmcache-object/v1"
"""The namespace's ``kv_layout``: an LMCache object framed by :func:`pack_row`."""

ROW_HEADER_BYTES = 8
"""Bytes in front of the payload in a row: the payload length (uint64, little-endian)."""

DIGEST_BYTES = 32
"""Bytes of the SHA-256 at the front of every key; the salt tag follows."""

PLAIN_SALT_BYTES = 31
"""Longest cache salt (UTF-8 bytes) written into the key as it is; a longer one is hashed."""

ROW_ALIGN = 4096
"""Rows are padded to a multiple of this many bytes: the alignment ``O_DIRECT`` asks of a transfer's
size, offset and buffer on the devices in use (4 KiB logical blocks; 512-byte devices accept it
too), and the fs tier's own ``O_DIRECT`` alignment."""

_PLAIN, _HASHED = b"\x01", b"\x02"
_DOMAIN = b"tiering/lmcache/object-key/v1\x00"
_SALT_DOMAIN = b"tiering/lmcache/cache-salt/v1\x00"
_LENGTH = struct.Struct("<Q")


def salt_tag(salt: str) -> bytes:
    """The tag of a cache salt at the end of every key (1 to 32 bytes).

    A salt of at most :data:`PLAIN_SALT_BYTES` UTF-8 bytes is kept as it is
    behind ``0x01`` (LMCache's own raw-block adapter also keeps salts
    readable in its index), so :func:`salt_of` gives it back; a longer salt
    becomes ``0x02`` + 31 bytes of its SHA-256, which only names it once
    the salt is seen again.
    """
    raw = salt.encode()
    if len(raw) <= PLAIN_SALT_BYTES:
        return _PLAIN + raw
    return _HASHED + hashlib.sha256(_SALT_DOMAIN + raw).digest()[:PLAIN_SALT_BYTES]


def key_salt_tag(key: bytes) -> bytes | None:
    """The salt tag of a key made by :func:`encode_key`; None for a key of another form."""
    tag = bytes(key[DIGEST_BYTES:])
    if not tag or tag[:1] not in (_PLAIN, _HASHED) or len(tag) > PLAIN_SALT_BYTES + 1:
        return None
    return tag


def salt_of(tag: bytes) -> str | None:
    """The cache salt a tag names when it holds the salt itself; None for a hashed tag or one that is not UTF-8."""
    if tag[:1] != _PLAIN:
        return None
    try:
        return tag[1:].decode()
    except UnicodeDecodeError:
        return None


def encode_key(key: Any) -> OffloadKey:
    """Our block key for an LMCache ``ObjectKey`` (or anything with its five fields).

    The key is the 32-byte SHA-256 over every field, then the cache salt's
    :func:`salt_tag` (33 to 64 bytes in all).

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
    return OffloadKey(digest.digest() + salt_tag(key.cache_salt))


def row_bytes(object_bytes: int) -> int:
    """Bytes of the row holding an object of up to ``object_bytes`` bytes: the length, the object, zero padding.

    The smallest multiple of :data:`ROW_ALIGN` that holds :data:`ROW_HEADER_BYTES` + ``object_bytes``.
    """
    return -(-(object_bytes + ROW_HEADER_BYTES) // ROW_ALIGN) * ROW_ALIGN


def namespace_config(object_bytes: int) -> dict[str, Any]:
    """The offloading-config keys that make the namespace of an LMCache adapter.

    Args:
        object_bytes: the largest LMCache object the adapter stores (bytes).

    Returns:
        ``model`` (the engine name: the model is in every key), ``kv_dtype``
        and ``kv_layout`` (the row format) and ``block_bytes`` (the row size, :func:`row_bytes`).
    """
    return {
        "model": ENGINE,
        "kv_dtype": "opaque",
        "kv_layout": KV_LAYOUT,
        "block_size": 1,
        "block_bytes": row_bytes(object_bytes),
    }


def pack_row(row: memoryview, payload: memoryview, object_bytes: int | None = None) -> None:
    """Write ``payload`` into ``row`` as length + payload + zero padding.

    Args:
        row: a flat writable row of ``block_bytes`` bytes.
        payload: the object's bytes (flat, format ``"B"``).
        object_bytes: the largest payload accepted (the adapter's ``object_bytes``); default
            (None): all the row holds after the length.

    Raises:
        ValueError: the payload is larger than ``object_bytes`` or than the row holds (sizes named).
    """
    size = len(payload)
    limit = len(row) - ROW_HEADER_BYTES if object_bytes is None else min(object_bytes, len(row) - ROW_HEADER_BYTES)
    if size > limit:
        raise ValueError(
            f"LMCache object of {size} bytes does not fit object_bytes {limit}; raise adapter_params.object_bytes"
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
