"""The block payload format shared by every persistent tier.

A stored block is a fixed :data:`HEADER_SIZE`-byte header followed by the
payload (one primary slot, ``block_bytes`` bytes). Header layout,
little-endian::

    offset size field
         0    4 magic b"TKVB"
         4    2 format version (FORMAT_VERSION)
         6    2 header size (HEADER_SIZE)
         8   16 namespace digest (raw bytes of Namespace.digest)
        24    8 payload length in bytes
        32    8 payload checksum: XXH3-64 of the payload
        40    2 key length
        42   64 key, zero padded
       106    8 header checksum: XXH3-64 of bytes [0, 106)
       114   14 zero padding

A block is served only when every field matches what the reader expects
(namespace, key, length) and both checksums verify; anything else raises a
:class:`BlockFormatError` subclass and the caller treats the block as a miss.
XXH3 (https://xxhash.com) hashes at memory speed, so verifying every load
costs little next to the I/O.
"""

from __future__ import annotations

import struct
from typing import Any

import xxhash

MAGIC = b"TKVB"
FORMAT_VERSION = 1
HEADER_SIZE = 128
MAX_KEY_BYTES = 64
NAMESPACE_DIGEST_BYTES = 16

_FIELDS = struct.Struct(f"<4sHH{NAMESPACE_DIGEST_BYTES}sQQH{MAX_KEY_BYTES}s")
_HEADER_CHECKSUM = struct.Struct("<Q")
_CHECKED_END = _FIELDS.size
assert _FIELDS.size + _HEADER_CHECKSUM.size <= HEADER_SIZE


class BlockFormatError(ValueError):
    """A stored block cannot be served; the caller treats it as a miss.

    Attributes:
        reason: short machine-readable cause (``"truncated"``, ``"checksum"``,
            ``"foreign"``, ``"bad_header"``), used as a counter label.
    """

    reason = "corrupt"


class TruncatedBlockError(BlockFormatError):
    """The block is shorter (or longer) than its header and payload require."""

    reason = "truncated"


class CorruptBlockError(BlockFormatError):
    """A header or payload checksum does not match (bit flips, torn writes)."""

    reason = "checksum"


class ForeignBlockError(BlockFormatError):
    """A well-formed block of another namespace, key or format version."""

    reason = "foreign"


GIL_FREE_HASH_BYTES = 64 * 1024
"""From this size up, :func:`checksum` hashes with the GIL released (see there)."""


def checksum(payload: bytes | bytearray | memoryview) -> int:
    """XXH3-64 of ``payload`` (any C-contiguous buffer), as an unsigned int.

    python-xxhash's one-shot ``xxh3_64_intdigest`` holds the GIL while it
    hashes, while its streaming ``xxh3_64(data)`` releases it around the
    hashing (``Py_BEGIN_ALLOW_THREADS`` in ``_xxhash.c``); both give the same
    digest. Blocks (from :data:`GIL_FREE_HASH_BYTES` up) take the streaming
    form, so the other I/O threads and the scheduler keep running Python
    while a block is hashed; short inputs (keys, headers) the one-shot form,
    whose call costs less.
    """
    if memoryview(payload).nbytes >= GIL_FREE_HASH_BYTES:
        return xxhash.xxh3_64(payload).intdigest()
    return xxhash.xxh3_64_intdigest(payload)


def encode_header(namespace_digest: bytes, key: bytes, payload: bytes | bytearray | memoryview) -> bytes:
    """Build the :data:`HEADER_SIZE`-byte header for ``payload`` stored under ``key``.

    Args:
        namespace_digest: :data:`NAMESPACE_DIGEST_BYTES` raw bytes.
        key: the block's OffloadKey, at most :data:`MAX_KEY_BYTES` bytes.
        payload: the block bytes (C-contiguous buffer); hashed, not copied.

    Raises:
        ValueError: the digest has the wrong length or the key is too long.
    """
    if len(namespace_digest) != NAMESPACE_DIGEST_BYTES:
        raise ValueError(f"namespace digest must be {NAMESPACE_DIGEST_BYTES} bytes, got {len(namespace_digest)}")
    if len(key) > MAX_KEY_BYTES:
        raise ValueError(f"key is {len(key)} bytes, at most {MAX_KEY_BYTES} are supported")
    fields = _FIELDS.pack(
        MAGIC,
        FORMAT_VERSION,
        HEADER_SIZE,
        namespace_digest,
        memoryview(payload).nbytes,
        checksum(payload),
        len(key),
        key,
    )
    head = fields + _HEADER_CHECKSUM.pack(xxhash.xxh3_64_intdigest(fields))
    return head + bytes(HEADER_SIZE - len(head))


def parse_header(header: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Decode a header without expectations (for offline tools such as ``tiering verify``).

    Returns:
        ``{"version": int, "namespace_digest": bytes, "payload_len": int, "checksum": int, "key": bytes}``.

    Raises:
        TruncatedBlockError: fewer than :data:`HEADER_SIZE` bytes.
        CorruptBlockError: the header checksum or magic does not match.
    """
    header = memoryview(header)
    if header.nbytes < HEADER_SIZE:
        raise TruncatedBlockError(f"header is {header.nbytes} bytes, expected {HEADER_SIZE}")
    fields = header[:_CHECKED_END]
    (stored_header_sum,) = _HEADER_CHECKSUM.unpack_from(header, _CHECKED_END)
    if xxhash.xxh3_64_intdigest(fields) != stored_header_sum:
        raise CorruptBlockError("header checksum mismatch")
    magic, version, header_size, digest, length, payload_sum, key_len, key = _FIELDS.unpack(fields)
    if magic != MAGIC or header_size != HEADER_SIZE:
        raise CorruptBlockError(f"bad magic {magic!r} or header size {header_size}")
    return {
        "version": version,
        "namespace_digest": digest,
        "payload_len": length,
        "checksum": payload_sum,
        "key": key[:key_len],
    }


def verify_header(
    header: bytes | bytearray | memoryview,
    namespace_digest: bytes,
    key: bytes,
    payload_len: int,
) -> int:
    """Check a header against what the reader expects; return the payload checksum.

    Raises:
        TruncatedBlockError: fewer than :data:`HEADER_SIZE` bytes.
        CorruptBlockError: the header checksum or magic does not match.
        ForeignBlockError: another format version, namespace, key or length.
    """
    fields = parse_header(header)
    version, digest, length = fields["version"], fields["namespace_digest"], fields["payload_len"]
    stored_key, payload_sum = fields["key"], fields["checksum"]
    if version != FORMAT_VERSION:
        raise ForeignBlockError(f"format version {version}, this reader supports {FORMAT_VERSION}")
    if digest != namespace_digest:
        raise ForeignBlockError(f"block of namespace {bytes(digest).hex()}, expected {namespace_digest.hex()}")
    if stored_key != key:
        raise ForeignBlockError(f"block of key {bytes(stored_key).hex()}, expected {key.hex()}")
    if length != payload_len:
        raise ForeignBlockError(f"payload of {length} bytes, expected {payload_len}")
    return int(payload_sum)


def verify_block(
    header: bytes | bytearray | memoryview,
    payload: bytes | bytearray | memoryview,
    namespace_digest: bytes,
    key: bytes,
    *,
    stored_size: int | None = None,
) -> None:
    """Verify a block read back as ``header`` + ``payload``.

    Args:
        header: the first :data:`HEADER_SIZE` bytes read.
        payload: the buffer the payload was read into (its full expected length).
        namespace_digest: the reader's namespace digest (raw bytes).
        key: the key the block was looked up by.
        stored_size: total bytes actually read or the object's size, when
            known; a mismatch is reported as truncation before any hashing.

    Raises:
        BlockFormatError: (a subclass) the block must not be served.
    """
    expected_len = memoryview(payload).nbytes
    if stored_size is not None and stored_size != HEADER_SIZE + expected_len:
        raise TruncatedBlockError(f"block is {stored_size} bytes, expected {HEADER_SIZE + expected_len}")
    payload_sum = verify_header(header, namespace_digest, key, expected_len)
    if checksum(payload) != payload_sum:
        raise CorruptBlockError("payload checksum mismatch")


def encode_block(namespace_digest: bytes, key: bytes, payload: bytes | bytearray | memoryview) -> bytes:
    """Header plus a copy of the payload, for tiers that need one buffer (e.g. an S3 PUT body)."""
    return encode_header(namespace_digest, key, payload) + bytes(payload)
