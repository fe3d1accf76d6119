"""The medium of an s3 tier: blocks are objects in a bucket, every request through :class:`~tiering.s3.client.S3Client`.

:class:`S3Medium` implements the primitives of the indexed block store
(:class:`~tiering.core.store.Medium`); the store owns the index, the
reservations and the cap, jobs, lookups, deletes with retries, scans and
stats. A block object is :func:`tiering.core.format.encode_header` followed
by the primary slot's bytes, verified with :func:`tiering.core.format.verify_block`
on every load (object layout: :mod:`tiering.s3.layout`).

An object shorter than a block is "not there yet": a server whose PUT is not
atomic shows an object while its upload runs. A load answers it as a miss
(:class:`~tiering.core.store.BlockNotReadyError`), a listing or HEAD does not
index it, and it is never deleted for its size.

A server may refuse ``DeleteObjects`` at start-up or at any later time; from
then on :attr:`S3Medium.delete_batch` is 1 and the store's delete pool sends
one ``DeleteObject`` per key, several at once.
"""

from __future__ import annotations

import errno
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.format import HEADER_SIZE, BlockFormatError, encode_header, verify_block
from tiering.core.spec import Namespace
from tiering.core.store import (
    LOAD_CAUSES,
    PRESENT,
    STORE_CAUSES,
    BlockNotReadyError,
    Medium,
    NotStartedError,
    ScanResult,
    WriteOutcome,
)
from tiering.core.toolkit import Counters
from tiering.s3.client import DELETE_BATCH, S3Client
from tiering.s3.config import ConnectionSettings
from tiering.s3.errors import ERROR_CLASSES, S3RequestError, classify_error
from tiering.s3.layout import Layout
from tiering.s3.pins import S3Pins
from tiering.s3.probe import check_bucket, probe_credentials, probe_features, startup_error

logger = logging.getLogger(__name__)

S3_COUNTERS = (
    "delete_requests",
    "objects_deleted",
    "short_objects_seen",
    "in_flight_loads",
    *(f"errors_{c}" for c in ERROR_CLASSES),
)
"""The medium's own figures (see :meth:`S3Medium.stats`)."""


class S3Medium(Medium):
    """One namespace's block objects under ``<prefix>/<namespace digest>/`` of a bucket.

    Opening it creates the client and probes the bucket and the server's
    features (conditional put, batch delete), creating nothing but one probe
    object, removed at once.

    Args:
        settings: the tier's validated connection settings.
        namespace: the stack's namespace (its digest names the folder and is in every block header).
        block_bytes: payload bytes per block.

    Attributes:
        client: the S3 client (its ``boto.meta.events`` take botocore event handlers).
        layout: the object names of the namespace.
        tally: the medium's counters (:data:`S3_COUNTERS`).
        listed_blocks: complete block objects the latest scan listed.

    Raises:
        S3StartupError: the client cannot be built, or the bucket cannot be used (the message says why,
            never a credential).
    """

    store_causes = tuple(dict.fromkeys((*STORE_CAUSES, *ERROR_CLASSES)))
    load_causes = tuple(dict.fromkeys((*LOAD_CAUSES, *ERROR_CLASSES)))

    def __init__(self, settings: ConnectionSettings, namespace: Namespace, block_bytes: int) -> None:
        self.layout = Layout(settings.normalized_prefix, namespace.digest)
        self.label = f"s3 tier {self.layout.base}"
        self.stored_block_bytes = HEADER_SIZE + block_bytes
        self.delete_threads = settings.max_concurrency
        self.tally = Counters(S3_COUNTERS)
        self.listed_blocks = 0
        self._digest = namespace.digest_bytes
        self.client = S3Client(settings, 2 * settings.max_concurrency + 1)  # I/O threads, delete threads, one more
        try:
            check_bucket(self.client, self.layout.listing_prefix)
            features = probe_features(self.client, self.layout.new_probe())
        except BaseException:
            self.client.close()
            raise
        self.delete_batch = DELETE_BATCH if features.batch_delete else 1

    def name(self, key: bytes) -> str:
        """The object name of block ``key``: ``<prefix>/<digest>/<shard>/<key hex>``."""
        return self.layout.block(key)

    def _failed(self, exc: BaseException, what: str | None = None) -> None:
        """Count a failed request under its error class; log it when the store does not (``what``)."""
        cls = classify_error(exc)
        self.tally.inc(f"errors_{cls}")
        if what is not None:
            logger.warning("%s: %s failed (%s): %s", self.label, what, cls, self.client.redact(exc))

    # -- blocks ------------------------------------------------------------------------------------
    def write_many(
        self,
        keys: Sequence[OffloadKey],
        block_ids: Sequence[int],
        slot: Callable[[int], memoryview],
        stopping: Callable[[], bool],
    ) -> list[WriteOutcome]:
        """One conditional PUT per block (header + payload); a 412 (another writer was first) is :data:`PRESENT`."""
        out: list[WriteOutcome] = []
        for key, block_id in zip(keys, block_ids, strict=True):
            if stopping():
                out.append(NotStartedError())
                continue
            data = slot(block_id)
            try:
                written = self.client.put(self.name(key), b"".join((encode_header(self._digest, key, data), data)),
                                          if_absent=True)  # fmt: skip
                out.append(None if written else PRESENT)
            except Exception as exc:
                self._failed(exc)
                out.append(exc)
        return out

    def read_many(
        self, keys: Sequence[OffloadKey], block_ids: Sequence[int], slot: Callable[[int], memoryview]
    ) -> list[BaseException | None]:
        """One GET per block, verified before its bytes reach the slot (see the module doc for short objects)."""
        out: list[BaseException | None] = []
        self.tally.inc("in_flight_loads", len(keys))
        for key, block_id in zip(keys, block_ids, strict=True):
            try:
                out.append(self._read_one(key, slot(block_id)))
            except Exception as exc:
                self._failed(exc)
                out.append(exc)
            finally:
                self.tally.inc("in_flight_loads", -1)
        return out

    def _read_one(self, key: OffloadKey, dest: memoryview) -> BaseException | None:
        name = self.name(key)
        data = self.client.get(name)
        if data is None:
            return FileNotFoundError(errno.ENOENT, "no such object", name)
        if len(data) < self.stored_block_bytes:
            self.tally.inc("short_objects_seen")
            return BlockNotReadyError(f"{name}: {len(data)} of {self.stored_block_bytes} bytes (still being put?)")
        view = memoryview(data)
        try:
            verify_block(view[:HEADER_SIZE], view[HEADER_SIZE:], self._digest, key, stored_size=len(data))
        except BlockFormatError as exc:
            return exc
        dest[:] = view[HEADER_SIZE:]
        return None

    def size(self, key: OffloadKey) -> int | None:
        """HEAD of the block's object: its size, None when absent or the request failed (counted, logged)."""
        try:
            size = self.client.head(self.name(key))
        except Exception as exc:
            self._failed(exc, f"HEAD of block {key.hex()[:16]}")
            return None
        if size is not None and size != self.stored_block_bytes:
            self.tally.inc("short_objects_seen")  # not there yet: a miss, never deleted for its size
        return size

    def remove(self, key: OffloadKey) -> bool:
        """One ``DeleteObject``; True when the object is gone (already gone included)."""
        return bool(self.remove_many([key])[0])

    def remove_many(self, keys: Sequence[OffloadKey]) -> list[bool | None]:
        """One ``DeleteObjects`` while the server takes it, else one ``DeleteObject`` per key.

        Returns:
            Per key: True (gone), False (failed: retried by the store), None when the server refused the
            batch just now (nothing deleted; :attr:`delete_batch` is 1 from now on, the store sends them again).
        """
        names = {self.name(key): key for key in keys}
        failed: dict[str, str] | None = None
        requests = 1
        try:
            if self.client.batch_delete:
                failed = self.client.delete_batch(list(names))
                if failed is None:  # refused just now: one request per key from now on
                    self.delete_batch = 1
                    if len(names) > 1:
                        return [None] * len(names)  # the store sends them again, in parallel
            if failed is None:
                requests = len(names)
                failed = {name: code for name in names if (code := self.client.delete_one(name)) is not None}
        except Exception as exc:
            self._failed(exc)
            raise
        for name, code in list(failed.items())[:3]:
            logger.warning("%s: delete of %s failed: %s", self.label, name, code)
        self.tally.add({"delete_requests": requests, "objects_deleted": len(names) - len(failed)})
        return [name not in failed for name in names]

    def scan(self, stopping: Callable[[], bool]) -> ScanResult:
        """List the namespace: objects of a block's size are blocks; others are not there yet (counted, kept).

        Raises:
            S3StartupError: the listing failed (the message says why).
        """
        blocks: dict[bytes, tuple[int, float]] = {}
        short = 0
        try:
            for page in self.client.list_pages(self.layout.listing_prefix):
                if stopping():
                    return ScanResult({}, complete=False)
                for obj in page.get("Contents", ()):
                    key = self.layout.parse(obj["Key"])
                    if key is None:
                        continue
                    if obj["Size"] != self.stored_block_bytes:
                        short += 1
                        continue
                    blocks[key] = (int(obj["Size"]), obj["LastModified"].timestamp())
        except S3RequestError as exc:
            what = "ListObjectsV2 of the namespace prefix"
            raise startup_error(self.client, what, exc, self.layout.listing_prefix) from None
        self.tally.inc("short_objects_seen", short)
        self.listed_blocks = len(blocks)
        return ScanResult(blocks, summary=f"{short} objects not whole yet" if short else "")

    # -- namespace, pins, reporting --------------------------------------------------------------
    def write_namespace_record(self, record: Mapping[str, Any]) -> None:
        """``<prefix>/<digest>/namespace.json`` (written once; an existing one is kept).

        Raises:
            S3StartupError: the PUT failed.
        """
        body = json.dumps(dict(record), indent=1, sort_keys=True).encode()
        try:
            self.client.put(self.layout.namespace_object, body, if_absent=True, content_type="application/json")
        except S3RequestError as exc:
            what = "PutObject of namespace.json"
            raise startup_error(self.client, what, exc, self.layout.listing_prefix) from None

    def pin_records(self) -> S3Pins:
        """Pin marker objects ``<prefix>/<digest>/pins/...`` (:mod:`tiering.s3.pins`)."""
        return S3Pins(self.client, self.layout.base)

    def failure_cause(self, exc: BaseException, *, load: bool, in_index: bool = False) -> str:
        """A failed request's error class (:data:`~tiering.s3.errors.ERROR_CLASSES`); an absent object: ``missing``."""
        if isinstance(exc, S3RequestError):
            return classify_error(exc)
        if isinstance(exc, FileNotFoundError):
            return "missing"
        return super().failure_cause(exc, load=load, in_index=in_index)

    def probe_report(self, check_credentials: bool = True) -> list[str]:
        """What the probes found, one line each (``tiering check --probe``); never a credential.

        Args:
            check_credentials: also send one request signed with made-up credentials to learn whether
                the server checks them (:func:`tiering.s3.probe.probe_credentials`).
        """
        if check_credentials and self.client.checks_credentials is None:
            probe_credentials(self.client)
        endpoint = self.client.redact(self.client.settings.endpoint_url or "AWS")
        return [f"s3://{self.client.bucket}/{self.layout.base}/ at {endpoint}", *self.client.features().describe()]

    def stats(self) -> dict[str, int | float]:
        """:data:`S3_COUNTERS`, ``conditional_put_supported`` and ``batch_delete_supported`` (1/0)."""
        return {
            **self.tally.snapshot(),
            "conditional_put_supported": int(self.client.conditional_put),
            "batch_delete_supported": int(self.client.batch_delete),
        }

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()
