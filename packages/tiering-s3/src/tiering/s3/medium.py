"""The medium of an s3 tier: blocks as objects in a bucket, every request through :class:`~tiering.s3.client.S3Client`.

:class:`S3Medium` implements the primitives of the indexed block store
(:class:`~tiering.core.store.Medium`), which owns the index, the cap, jobs,
lookups, deletes with retries, scans and stats. A block object is the core
block header followed by the payload, verified on every load (names:
:mod:`tiering.s3.layout`). An object shorter than a block is "not there
yet" (a server whose PUT is not atomic shows an object while its upload
runs): a miss, never indexed, never deleted for its size. A server that
refuses ``DeleteObjects`` (at start-up or any later time) gets one
``DeleteObject`` per key, sent in parallel by the store's delete pool.
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
from tiering.core.store.stats import Counters
from tiering.s3.client import DELETE_BATCH, S3Client
from tiering.s3.config import ConnectionSettings
from tiering.s3.errors import ERROR_CLASSES, S3RequestError, classify_error
from tiering.s3.layout import Layout
from tiering.s3.pins import S3Pins
from tiering.s3.probe import check_bucket, probe_features, startup_error

logger = logging.getLogger(__name__)

S3_COUNTERS = ("delete_requests", "objects_deleted", "short_objects_seen", "in_flight_loads",
               *(f"errors_{c}" for c in ERROR_CLASSES))  # fmt: skip
"""The medium's own figures (see :meth:`S3Medium.stats`)."""


class S3Medium(Medium):
    """One namespace's block objects under ``<prefix>/<namespace digest>/`` of a bucket.

    Opening it builds the client and probes the bucket and the server's features (conditional put, batch delete).

    Args:
        settings: the tier's validated connection settings.
        namespace: the stack's namespace (its digest names the folder and is in every block header).
        block_bytes: payload bytes per block.

    Attributes:
        client: the S3 client; layout: the object names; tally: :data:`S3_COUNTERS`;
        listed_blocks: complete block objects the latest scan listed.

    Raises:
        S3StartupError: the client cannot be built or the bucket cannot be used (says why, never a credential).
    """

    label = "s3 tier"
    store_causes = tuple(dict.fromkeys((*STORE_CAUSES, *ERROR_CLASSES)))
    load_causes = tuple(dict.fromkeys((*LOAD_CAUSES, *ERROR_CLASSES)))

    def __init__(self, settings: ConnectionSettings, namespace: Namespace, block_bytes: int) -> None:
        self.layout = Layout(settings.normalized_prefix, namespace.digest)
        self.location = f"s3://{settings.bucket_name}/{self.layout.base}"
        self.stored_block_bytes = HEADER_SIZE + block_bytes
        self.delete_threads = settings.max_concurrency
        self.tally = Counters(S3_COUNTERS)
        self.listed_blocks = 0
        self._digest = namespace.digest_bytes
        self.client = S3Client(settings, 2 * settings.max_concurrency + 1)  # I/O threads, delete threads, one more
        try:
            check_bucket(self.client, self.layout.listing_prefix)
            batch_delete = probe_features(self.client, self.layout.new_probe()).batch_delete
        except BaseException:
            self.client.close()
            raise
        self.delete_batch = DELETE_BATCH if batch_delete else 1

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
    def write_many(self, keys: Sequence[OffloadKey], block_ids: Sequence[int], slot: Callable[[int], memoryview],
                   stopping: Callable[[], bool]) -> list[WriteOutcome]:  # fmt: skip
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

    def read_many(self, keys: Sequence[OffloadKey], block_ids: Sequence[int],
                  slot: Callable[[int], memoryview]) -> list[BaseException | None]:  # fmt: skip
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

        Returns per key True (gone), False (failed: retried), or None when the server refused the batch just now
        (nothing deleted; :attr:`delete_batch` is 1 from now on: the store sends them again, in parallel).
        """
        names = {self.name(key): key for key in keys}
        try:
            failed = self.client.delete_or_refuse(list(names))
        except Exception as exc:
            self._failed(exc)
            raise
        if not self.client.batch_delete:
            self.delete_batch = 1
        if failed is None:
            return [None] * len(names)
        for name, code in list(failed.items())[:3]:
            logger.warning("%s: delete of %s failed: %s", self.label, name, code)
        requests = 1 if self.client.batch_delete and len(names) > 1 else len(names)
        self.tally.add({"delete_requests": requests, "objects_deleted": len(names) - len(failed)})
        return [name not in failed for name in names]

    def scan(self, stopping: Callable[[], bool]) -> ScanResult:
        """List the namespace: objects of a block's size are blocks, others not there yet; raises S3StartupError."""
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
            raise self._startup_error("ListObjectsV2 of the namespace prefix", exc) from None
        self.tally.inc("short_objects_seen", short)
        self.listed_blocks = len(blocks)
        return ScanResult(blocks, summary=f"{short} objects not whole yet" if short else "")

    # -- namespace, pins, reporting --------------------------------------------------------------
    def write_namespace_record(self, record: Mapping[str, Any]) -> None:
        """``<prefix>/<digest>/namespace.json``, written once (an existing one is kept); raises S3StartupError."""
        body = json.dumps(dict(record), indent=1, sort_keys=True).encode()
        try:
            self.client.put(self.layout.namespace_object, body, if_absent=True, content_type="application/json")
        except S3RequestError as exc:
            raise self._startup_error("PutObject of namespace.json", exc) from None

    def _startup_error(self, what: str, exc: S3RequestError) -> Exception:
        return startup_error(self.client, what, exc, self.layout.listing_prefix)

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

    def stats(self) -> dict[str, int | float]:
        """:data:`S3_COUNTERS`, ``conditional_put_supported`` and ``batch_delete_supported`` (1/0)."""
        client = self.client
        features = {"conditional_put_supported": client.conditional_put, "batch_delete_supported": client.batch_delete}
        return {**self.tally.snapshot(), **{name: int(on) for name, on in features.items()}}

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()
