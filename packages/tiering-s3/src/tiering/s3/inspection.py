"""Offline inspection of an s3 tier's prefix for ``tiering ls / gc / verify``.

Only objects laid out by this package are ours: ``<prefix>/<32 hex digest>/namespace.json``,
block objects ``<prefix>/<digest>/<shard>/<key hex>`` (the shard being the one the tier gives
the key), pin markers ``<prefix>/<digest>/pins/<key hex>.<ms>.pin`` (:mod:`tiering.s3.pins`;
removed with their namespace) and the startup probe ``<prefix>/<digest>/.probe-<32 hex>`` that a
starting tier writes and deletes at once. Anything else under the prefix is foreign: reported, never
deleted. Nothing outside ``<prefix>/`` is listed, read or deleted.

Removing blocks while engines use the bucket is safe: S3 serves a GET from one version of
an object, so a block being read is either read whole or not found (a miss for the engine).
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

from tiering.core.inspection import BlockInfo, ObjectStoreInspector
from tiering.core.policies.pin_records import parse_marker
from tiering.s3.client import S3Client
from tiering.s3.config import SCHEMA, ConnectionSettings
from tiering.s3.errors import S3RequestError, S3StartupError
from tiering.s3.layout import DIGEST_RE, NAMESPACE_OBJECT, PROBE_RE, parse_block_name
from tiering.s3.pins import PINS_INFIX
from tiering.s3.probe import check_bucket, startup_error

logger = logging.getLogger(__name__)


class S3Inspector(ObjectStoreInspector):
    """Walks and prunes the prefix of an s3 tier.

    Args:
        client: the S3 client of the tier's bucket.
        settings: the validated connection settings (bucket, prefix, endpoint, redaction).
    """

    def __init__(self, client: S3Client, settings: ConnectionSettings) -> None:
        self._client = client
        self._settings = settings
        self.bucket = settings.bucket_name
        self.prefix = settings.normalized_prefix
        self.root = f"{self.prefix}/" if self.prefix else ""
        self.page_size = 1000
        """Keys per ListObjectsV2 page (tests lower it to exercise pagination)."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> S3Inspector:
        """Open the prefix of an ``s3`` tier config entry (the tier's keys and defaults).

        Only the keys that say where the bucket is and how to reach it are used;
        ``capacity_bytes`` and ``head_fallback`` are accepted and ignored.

        Raises:
            TierConfigError: a wrong value or a key the tier does not accept (the message names the key).
            S3StartupError: (an ``OSError``) the endpoint, bucket, region, credentials,
                permissions or TLS are wrong; the message says which, without credentials.
        """
        entry = SCHEMA.validate(config)  # unknown keys, types, ranges; no side effect
        settings = ConnectionSettings.from_entry(entry)
        settings.validate()
        client = S3Client(settings, 2)
        inspector = cls(client, settings)
        try:
            check_bucket(client, inspector.root)
        except BaseException:
            client.close()
            raise
        return inspector

    # -- helpers -------------------------------------------------------------
    def _fail(self, what: str, exc: S3RequestError) -> S3StartupError:
        return startup_error(self._client, what, exc, self.root, action="inspection")

    def _list(self, prefix: str, delimiter: str = "") -> Iterator[dict[str, Any]]:
        """Pages of ListObjectsV2 under ``prefix`` (which is always inside the tier's prefix)."""
        if not prefix.startswith(self.root):
            raise ValueError(f"refusing to list {prefix!r}: outside s3://{self.bucket}/{self.prefix}")
        try:
            yield from self._client.list_pages(prefix, delimiter, self.page_size)
        except S3RequestError as exc:
            raise self._fail(f"ListObjectsV2 of {prefix!r}", exc) from None

    def _base(self, digest: str) -> str:
        if not isinstance(digest, str) or not DIGEST_RE.match(digest):
            raise ValueError(f"{digest!r} is not a namespace digest (32 hex characters)")
        return f"{self.root}{digest}"

    def _delete(self, names: list[str]) -> int:
        """Delete ``names`` (batched, see :meth:`S3Client.delete_many`); returns how many the server did not refuse."""
        try:
            errors = self._client.delete_many(names)
        except S3RequestError as exc:
            raise self._fail(f"delete of {len(names)} keys", exc) from None
        for name, code in list(errors.items())[:3]:
            logger.warning("s3 tier: delete of %s failed: %s", name, code)
        return len(names) - len(errors)

    # -- TierInspector -------------------------------------------------------------
    def location(self) -> str:
        where = f"s3://{self.bucket}/{self.prefix}"
        endpoint = self._settings.endpoint_url
        if endpoint:
            parts = urllib.parse.urlsplit(endpoint)
            netloc = parts.netloc.rpartition("@")[2]  # never user:password@
            where += f" at {self._settings.redact(parts._replace(netloc=netloc).geturl())}"
        return where

    def namespaces(self) -> list[str]:
        found = set()
        for page in self._list(self.root, delimiter="/"):
            for common in page.get("CommonPrefixes", ()):
                name = common["Prefix"][len(self.root) :].rstrip("/")
                if DIGEST_RE.match(name):
                    found.add(name)
        return sorted(found)

    def read_namespace_file(self, digest: str) -> bytes | None:
        name = f"{self._base(digest)}/{NAMESPACE_OBJECT}"
        try:
            return self._client.get(name)
        except S3RequestError as exc:
            raise self._fail(f"GetObject of {name!r}", exc) from None

    def blocks(self, digest: str) -> Iterator[BlockInfo]:
        base = self._base(digest)
        for page in self._list(base + "/"):
            for obj in page.get("Contents", ()):
                key = parse_block_name(base, obj["Key"])
                if key is not None:
                    yield BlockInfo(obj["Key"], key, int(obj["Size"]), obj["LastModified"].timestamp())

    def foreign(self) -> Iterator[str]:
        for page in self._list(self.root):
            for obj in page.get("Contents", ()):
                name = obj["Key"]
                top, _, rest = name[len(self.root) :].partition("/")
                ours = DIGEST_RE.match(top) and (
                    rest == NAMESPACE_OBJECT
                    or PROBE_RE.match(rest)
                    or (rest.startswith(PINS_INFIX + "/") and parse_marker(rest[len(PINS_INFIX) + 1 :]) is not None)
                    or parse_block_name(f"{self.root}{top}", name) is not None
                )
                if not ours:
                    yield name

    def check_block(self, digest: str, block: BlockInfo) -> None:
        if parse_block_name(self._base(digest), block.name) is None:
            raise ValueError(
                f"refusing to touch {block.name!r}: not a block object of namespace {digest} "
                f"under s3://{self.bucket}/{self.prefix}"
            )

    def get_object(self, name: str) -> bytes | None:
        try:
            return self._client.get(name)
        except S3RequestError as exc:
            raise self._fail(f"GetObject of {name!r}", exc) from None

    def delete_objects(self, digest: str, blocks: list[BlockInfo]) -> int:
        return self._delete([block.name for block in blocks])

    def remove_namespace(self, digest: str) -> int:
        base = self._base(digest)
        blocks, leftovers = [], []
        for page in self._list(base + "/"):
            for obj in page.get("Contents", ()):
                name = obj["Key"]
                key = parse_block_name(base, name)
                if key is not None:
                    blocks.append(BlockInfo(name, key, int(obj["Size"]), obj["LastModified"].timestamp()))
                elif PROBE_RE.match(name[len(base) + 1 :]):
                    leftovers.append(name)  # a probe left by a tier that died while starting
                elif name.startswith(f"{base}/{PINS_INFIX}/") and parse_marker(name.rsplit("/", 1)[1]) is not None:
                    leftovers.append(name)  # a pin marker goes with its namespace
        removed = self.remove_blocks(digest, blocks)
        self._delete([f"{base}/{NAMESPACE_OBJECT}", *leftovers])
        return removed
