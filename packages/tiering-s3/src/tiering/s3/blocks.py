"""The worker side of an s3 tier: the start-up probe and rescans, HEAD probes, and each block's PUT or GET.

:class:`BlockIO` runs on the I/O pool's threads (and the lookup cache's); the
tier (:mod:`tiering.s3.tier`) owns it and calls it from the scheduler-facing
methods. Everything it knows about blocks goes through the tier toolkit's
:class:`~tiering.core.toolkit.CapacityIndex` (tickets before every read, so
a read that raced an eviction never re-indexes its key), and
every request through :class:`~tiering.s3.client.S3Client`.

A short or unreadable object is "not there yet" (a miss; another writer may
still be writing it on a server whose PUT is not atomic) and is never
deleted for its size alone: only an object read whole that fails
verification is deleted, and never while this process stores the same key
(an object being uploaded may look short on a server whose PUT is not atomic).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.format import HEADER_SIZE, BlockFormatError, encode_header, verify_block
from tiering.core.redact import Redactor
from tiering.core.spec import Namespace
from tiering.core.toolkit import (
    Admit,
    CapacityIndex,
    Counters,
    IOPool,
    JobState,
    KeyState,
    LookupCache,
    record_tasks,
)
from tiering.s3.client import S3Client
from tiering.s3.deleter import Deleter
from tiering.s3.errors import S3RequestError, classify_error
from tiering.s3.layout import Layout
from tiering.s3.probe import check_bucket, probe_credentials, probe_features, startup_error

logger = logging.getLogger(__name__)

DELETE_WAIT_S = 30.0
"""Longest a store waits for the delete of the key's old copy before it fails (cause ``deleting``)."""

ROOM_WAIT_S = 10.0
"""Longest a store waits for evicted blocks' deletes to free its room under the cap before it fails (``no_space``)."""

Task = tuple[JobState, int, OffloadKey, int, bool]
"""One block of a job on the pool: (job state, index in the job, key, primary slot, bytes reserved)."""


class BlockIO:
    """Probe, rescan, HEAD, PUT and GET of one tier instance's blocks (see the module docstring).

    Args:
        client: the tier's S3 client.
        layout: the object names of the tier's namespace.
        namespace: the namespace (written to ``namespace.json``; its digest goes in every block header).
        block_bytes: payload bytes per block.
        slot: primary slot index -> its writable ``block_bytes`` view.
        index: the tier's capacity index.
        counters: the tier's counters.
        pool: the tier's I/O pool (HEADs of a lookup batch run on it).
        redact: removes credentials from text.
    """

    def __init__(
        self,
        client: S3Client,
        layout: Layout,
        namespace: Namespace,
        block_bytes: int,
        slot: Callable[[int], memoryview],
        index: CapacityIndex,
        counters: Counters,
        pool: IOPool,
        redact: Redactor,
    ) -> None:
        self._client = client
        self.layout = layout
        self._namespace = namespace
        self._digest = namespace.digest_bytes
        self.block_bytes = block_bytes
        self.object_bytes = HEADER_SIZE + block_bytes
        self.block = slot
        self._index = index
        self._counters = counters
        self._pool = pool
        self._redact = redact
        self._deleter = Deleter(client, layout.block, index, counters, threads=pool.n_read_threads)
        self._lookups: LookupCache | None = None
        self._closed = False
        self.last_scan_s = 0.0

    def attach_lookups(self, lookups: LookupCache) -> None:
        """The lookup cache whose resolver is :meth:`resolve` (created after this object)."""
        self._lookups = lookups

    @property
    def lookups(self) -> LookupCache:
        """The attached lookup cache."""
        assert self._lookups is not None, "attach_lookups() first"
        return self._lookups

    def object_key(self, key: bytes) -> str:
        """The object name of block ``key``."""
        return self.layout.block(key)

    def close_reads(self) -> None:
        """From now on blocks not yet started fail fast (cause ``shutdown``)."""
        self._closed = True

    def close(self) -> None:
        """Stop (after the pool): queued deletes are sent."""
        self._closed = True
        self._deleter.close()

    def probe(self) -> None:
        check_bucket(self._client, self.layout.listing_prefix)
        probe_features(self._client, self.layout.new_probe())
        body = json.dumps({**self._namespace.to_dict(), "digest": self._namespace.digest}, indent=1, sort_keys=True)
        try:
            name = self.layout.namespace_object
            self._client.put(name, body.encode(), if_absent=True, content_type="application/json")
        except S3RequestError as exc:
            raise startup_error(self._client, "PutObject of namespace.json", exc, self.layout.listing_prefix) from None

    def probe_report(self, check_credentials: bool = True) -> list[str]:
        """What the probes found, one line each (for ``tiering check --probe``); never a credential.

        Args:
            check_credentials: also send one request with made-up credentials to learn whether
                the server checks them (:func:`tiering.s3.probe.probe_credentials`).
        """
        if check_credentials and self._client.checks_credentials is None:
            probe_credentials(self._client)
        endpoint = self._redact(self._client.settings.endpoint_url or "AWS")
        where = f"s3://{self._client.bucket}/{self.layout.base}/ at {endpoint}"
        return [where, *self._client.features().describe()]

    def rescan(self) -> int:
        """List the namespace and reconcile the index with it (start-up, and to settle failed deletes).

        Objects of the wrong size are not blocks yet (counted in ``short_objects_seen``; never deleted
        for that). Evicts down to the cap afterwards.

        Returns:
            The number of complete block objects listed.

        Raises:
            S3StartupError: the listing failed.
        """
        started = time.monotonic()
        found: list[tuple[float, OffloadKey, int]] = []
        short = 0
        with self._index.reading() as ticket:
            try:
                for page in self._client.list_pages(self.layout.listing_prefix):
                    for obj in page.get("Contents", ()):
                        key = self.layout.parse(obj["Key"])
                        if key is None:
                            continue
                        if obj["Size"] != self.object_bytes:
                            short += 1
                            continue
                        found.append((obj["LastModified"].timestamp(), OffloadKey(key), int(obj["Size"])))
            except S3RequestError as exc:
                raise startup_error(
                    self._client, "ListObjectsV2 of the namespace prefix", exc, self.layout.listing_prefix
                ) from None
            found.sort(key=lambda entry: entry[0])
            born = {key: modified for modified, key, _ in found}  # a tenant's TTL counts from the store
            report = self._index.reconcile({key: size for _, key, size in found}, ticket, born)
        self.lookups.invalidate(report.vanished)
        self._counters.add({"scans": 1, "short_objects_seen": short})
        self.last_scan_s = time.monotonic() - started
        self._deleter.reset_retries()
        retried = self._index.retry_deletes()  # failed deletes go again first: their bytes are still there
        self._deleter.queue((victim.key for victim in retried), "eviction")
        self.evict(self._index.evict_to_cap())
        return len(found)

    def evict(self, victims: Iterable[Any]) -> None:
        keys = [victim.key for victim in victims]
        if keys:
            self.lookups.invalidate(keys)
            self._deleter.queue(keys, "eviction")

    def count_error(self, exc: BaseException, what: str) -> str:
        cls = classify_error(exc)
        self._counters.inc(f"errors_{cls}")
        if cls == "other" and not isinstance(exc, S3RequestError):
            logger.error("s3 tier: %s failed: %s", what, self._redact(repr(exc)))
        else:
            logger.warning("s3 tier: %s failed (%s): %s", what, cls, self._redact(exc))
        return cls

    def resolve(self, keys: Sequence[OffloadKey]) -> dict[OffloadKey, bool]:
        """HEAD ``keys`` in parallel on the pool; adopt those found whole (lookup cache thread)."""
        sizes: dict[OffloadKey, int | None] = {}
        done = threading.Semaphore(0)

        def head(batch: Sequence[OffloadKey]) -> None:
            for key in batch:
                try:
                    sizes[key] = None if self._closed else self._client.head(self.object_key(key))
                except Exception as exc:
                    self.count_error(exc, f"HEAD of block {key.hex()[:16]}")
                finally:
                    done.release()

        def failed(batch: Sequence[OffloadKey], exc: BaseException) -> None:
            for _ in batch:
                done.release()

        with self._index.reading() as ticket:
            self._pool.submit("read", head, list(keys), failed)
            for _ in keys:
                done.acquire()
            whole = [(key, size) for key, size in sizes.items() if size == self.object_bytes]
            self._index.adopt_many(whole, ticket)
        short = sum(1 for size in sizes.values() if size is not None and size != self.object_bytes)
        if short:
            self._counters.inc("short_objects_seen", short)  # not there yet: a miss, never deleted for its size
        return {key: self._index.lookup(key, touch=False) is KeyState.RESIDENT for key in keys}

    def store_batch(self, tasks: Sequence[Task]) -> None:
        deadline = time.monotonic() + ROOM_WAIT_S  # one bound for the share's waits for room
        record_tasks(
            [(state, i, *self._store_one(key, slot, reserved, deadline)) for state, i, key, slot, reserved in tasks]
        )

    def _store_one(self, key: OffloadKey, slot: int, reserved: bool, deadline: float) -> tuple[bool, str]:
        try:
            if not reserved:
                admit = self._reserve_after_delete(key)
                if admit is not Admit.RESERVED:
                    return (True, "") if admit is Admit.PRESENT else (False, admit.value)
                reserved = True
            if not self._index.wait_for_room((key,), 0.0 if self._closed else deadline - time.monotonic())[0]:
                # The victims' objects are still there (deletes slow or failing): a PUT now would exceed the cap.
                self._index.commit(key, False)
                return False, "shutdown" if self._closed else Admit.NO_SPACE.value
            data = self.block(slot)
            body = b"".join((encode_header(self._digest, key, data), data))
            if self._client.put(self.object_key(key), body, if_absent=True):
                self._counters.add({"blocks_stored": 1, "bytes_stored": self.block_bytes})
            else:
                self._counters.inc("stores_already_present")
            self._index.commit(key, True)
            return True, ""
        except Exception as exc:
            if reserved:
                self._index.commit(key, False)
            return False, self.count_error(exc, f"store of block {key.hex()[:16]}")

    def _reserve_after_delete(self, key: OffloadKey) -> Admit:
        """Reserve ``key`` once the delete of its old copy ended (waits up to :data:`DELETE_WAIT_S`)."""
        deadline = time.monotonic() + DELETE_WAIT_S
        while True:
            reservation = self._index.reserve(key, self.object_bytes)
            self.evict(reservation.victims)
            if reservation.admit is not Admit.DELETING or self._closed or time.monotonic() > deadline:
                return reservation.admit
            self._index.wait_for_space(0.05)

    def tasks_failed(self, tasks: Sequence[Task], exc: BaseException) -> None:
        """The pool could not run ``tasks`` (shut down, or the batch raised): fail them, release reservations."""
        cause = "shutdown" if self._closed else classify_error(exc)
        for state, _, key, _, reserved in tasks:
            if reserved and not state.is_load:
                self._index.commit(key, False)
        if any(state.is_load for state, *_ in tasks):
            self._counters.inc("in_flight_loads", -sum(1 for state, *_ in tasks if state.is_load))
        for state, i, *_ in tasks:
            state.fail_unrecorded((i,), cause)

    def load_batch(self, tasks: Sequence[Task]) -> None:
        outcomes = []
        for state, i, key, slot, _ in tasks:
            try:
                ok, cause = self._load_one(key, slot)
            except Exception as exc:
                ok, cause = False, self.count_error(exc, f"load of block {key.hex()[:16]}")
            finally:
                self._counters.inc("in_flight_loads", -1)
            outcomes.append((state, i, ok, cause))
        record_tasks(outcomes)

    def _load_one(self, key: OffloadKey, slot: int) -> tuple[bool, str]:
        if self._closed:
            return False, "shutdown"
        name = self.object_key(key)
        with self._index.reading() as ticket:
            data = self._client.get(name)
            if data is None:
                self._index.remove(key, delete=False, cause="vanished")
                self.lookups.mark_absent((key,))
                return False, "missing"
            if len(data) < self.object_bytes:  # not there yet (a PUT in progress elsewhere): a miss, not deleted
                self._counters.inc("short_objects_seen")
                if self._index.lookup(key, touch=False) is not KeyState.WRITING:
                    self._index.remove(key, delete=False, cause="vanished")
                    self.lookups.mark_absent((key,))
                return False, "truncated"
            view = memoryview(data)
            try:
                verify_block(view[:HEADER_SIZE], view[HEADER_SIZE:], self._digest, key, stored_size=len(data))
            except BlockFormatError as exc:
                self._bad_block(key, name, exc)
                return False, exc.reason
            self.block(slot)[:] = view[HEADER_SIZE:]
            self._index.adopt(key, len(data), ticket)
        self._counters.add({"blocks_loaded": 1, "bytes_loaded": self.block_bytes})
        return True, ""

    def _bad_block(self, key: OffloadKey, name: str, exc: BlockFormatError) -> None:
        """An object read whole failed verification: delete it, unless this process is storing the key."""
        if self._index.lookup(key, touch=False) is KeyState.WRITING:
            self._counters.inc("bad_blocks_kept_store_in_flight")
            logger.warning("s3 tier: block %s is unusable (%s) but a store of it is in flight; kept", name, exc.reason)
            return
        logger.warning("s3 tier: block %s is unusable (%s): %s; deleting it", name, exc.reason, exc)
        # A victim if it was indexed: counted until its delete succeeds.
        self._index.remove(key, delete=True, cause="corrupt")
        self.lookups.invalidate((key,))
        self.lookups.mark_absent((key,))  # absent for the negative-lookup TTL
        self._deleter.queue((key,), "bad")
