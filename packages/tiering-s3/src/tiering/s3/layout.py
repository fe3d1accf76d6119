"""Object names of an s3 tier: where each block, the namespace record and the probe objects live.

Object layout under ``bucket``::

    <prefix>/<namespace digest>/namespace.json         all Namespace fields, clear text
    <prefix>/<namespace digest>/<shard>/<key hex>      one block: core header + payload
    <prefix>/<namespace digest>/.probe-<32 hex>        a start-up probe, deleted at once

``<shard>`` is two hex digits of the XXH3-64 of the key (256 key prefixes,
spreading load over S3 partitions). Used by the tier and by its offline
inspector alike, so both agree on what is ours.
"""

from __future__ import annotations

import re
import uuid

from tiering.core.format import checksum

NAMESPACE_OBJECT = "namespace.json"
"""Name of the namespace record inside ``<prefix>/<digest>/``."""
PROBE_PREFIX = ".probe-"
"""Name start of a start-up probe object ``<prefix>/<digest>/.probe-<32 hex>`` (written and deleted at once)."""
DIGEST_RE = re.compile(r"^[0-9a-f]{32}$")
"""A namespace digest: 32 lowercase hex characters."""
PROBE_RE = re.compile(rf"^{re.escape(PROBE_PREFIX)}[0-9a-f]{{32}}$")
"""The name of a probe object relative to ``<prefix>/<digest>/``."""
_HEX = frozenset("0123456789abcdef")


def normalize_prefix(prefix: str) -> str:
    """``prefix`` without empty parts (no leading, trailing or doubled ``/``): ``"/kv//a/"`` -> ``"kv/a"``."""
    return "/".join(part for part in prefix.split("/") if part)


def shard_of(key: bytes) -> str:
    """The two-hex-digit shard of block ``key`` (low byte of its XXH3-64)."""
    return f"{checksum(key) & 0xFF:02x}"


def parse_block_name(base: str, name: str) -> bytes | None:
    """The key of a block object named ``name`` under ``base`` (``<prefix>/<digest>``), else None.

    Only ``<base>/<shard>/<key hex>`` whose shard is the one :func:`shard_of` gives the key is a
    block object; anything else (``namespace.json``, probe objects, foreign objects) answers None.
    """
    if not name.startswith(base + "/"):
        return None
    rest = name[len(base) + 1 :]
    shard, _, keyhex = rest.partition("/")
    if len(shard) != 2 or not keyhex or len(keyhex) % 2 or not set(keyhex) <= _HEX:
        return None
    key = bytes.fromhex(keyhex)
    return key if shard_of(key) == shard else None


class Layout:
    """The object names of one namespace under one prefix.

    Args:
        prefix: the tier's key prefix (normalized here).
        digest: the namespace digest (32 hex characters).

    Attributes:
        base: ``<prefix>/<digest>`` (``<digest>`` for an empty prefix); every name below starts with it.
    """

    __slots__ = ("base", "prefix")

    def __init__(self, prefix: str, digest: str) -> None:
        self.prefix = normalize_prefix(prefix)
        self.base = f"{self.prefix}/{digest}" if self.prefix else digest

    def block(self, key: bytes) -> str:
        """The object name of block ``key``: ``<base>/<shard>/<key hex>``."""
        return f"{self.base}/{shard_of(key)}/{key.hex()}"

    def parse(self, name: str) -> bytes | None:
        """The key of block object ``name`` of this namespace, else None (see :func:`parse_block_name`)."""
        return parse_block_name(self.base, name)

    @property
    def namespace_object(self) -> str:
        """``<base>/namespace.json``."""
        return f"{self.base}/{NAMESPACE_OBJECT}"

    @property
    def listing_prefix(self) -> str:
        """``<base>/``: the ListObjectsV2 prefix of this namespace."""
        return self.base + "/"

    def new_probe(self) -> str:
        """A fresh probe object name ``<base>/.probe-<32 random hex>``."""
        return f"{self.base}/{PROBE_PREFIX}{uuid.uuid4().hex}"
