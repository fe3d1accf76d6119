"""The redis medium: what only a Redis server knows how to do with blocks, one round trip per batch.

:class:`RedisMedium` holds the client and the primitives the tier runs on its
I/O threads: ``SET NX`` of many blocks straight from their primary views
(:meth:`~RedisMedium.put_many`), pipelined ``GET`` of many blocks verified
into their views (:meth:`~RedisMedium.get_many`), which of many blocks exist
(:meth:`~RedisMedium.present`), ``UNLINK`` of many
(:meth:`~RedisMedium.delete_many`), the namespace's blocks
(:meth:`~RedisMedium.scan`) and its record (:meth:`~RedisMedium.write_record`).
It keeps no index: what the tier knows is the tier's.

Each batch is one pipeline (``transaction=False``): a single server or a
Sentinel primary gets hand-packed RESP on a pooled connection
(:mod:`tiering.redis.wire`), a cluster redis-py's cluster pipeline (it routes
per slot and follows ``MOVED`` / ``ASK``). Before a pipeline the medium asks,
at most every :data:`RUN_ID_CHECK_S` and at once after connection trouble,
whether the primary changed (a restart or a failover); :attr:`on_change` is
told, so the tier can forget what a new, empty server lacks.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.format import HEADER_SIZE, BlockFormatError, TruncatedBlockError, encode_header, verify_block
from tiering.core.spec import Namespace
from tiering.core.toolkit import Counters
from tiering.core.toolkit.tenancy import TenantPolicy
from tiering.redis.config import RedisSettings
from tiering.redis.errors import ERROR_CLASSES, RedisStartupError, classify_error
from tiering.redis.layout import KeyLayout
from tiering.redis.presence import PresenceQuery
from tiering.redis.probe import ServerInfo, primaries, probe
from tiering.redis.wire import InSlot, get_into, run_on_connection, set_nx_parts

logger = logging.getLogger(__name__)

RUN_ID_CHECK_S = 1.0
"""Seconds between checks of the primary's ``run_id`` (one ``INFO``) while the tier sends pipelines, errors or not.

redis-py re-makes a pooled connection that the server closed without raising,
so a failover (the sentinel names the new primary) or a quick restart may
show no error at all.
"""

COUNTERS = ("pipelines", *(f"errors_{c}" for c in ERROR_CLASSES))
"""The medium's own figures (merged into the tier's stats)."""

_RECHECK_CAUSES = ("connection", "timeout", "loading", "readonly")
"""Error classes after which the primary may have changed: the next pipeline asks at once."""


class BlockMissingError(LookupError):
    """A ``GET`` found no value: the block was evicted by the server, expired or deleted."""


class RedisMedium:
    """The server's primitives for one namespace's blocks (see the module docstring).

    Args:
        settings: the validated entry.
        namespace: the stack's namespace (its digest names the keys; its record is written at start).
        block_bytes: bytes of one block's payload.
        tenants: the tier's tenant policy (a block's ``EX`` is its tenant's TTL); None: none.

    Attributes:
        object_bytes: bytes one stored block occupies on the server (header + payload).
        server: what the start-up probe learnt (``maxmemory``, policy, primaries).
        counters: ``pipelines`` and ``errors_<class>`` (:data:`~tiering.redis.errors.ERROR_CLASSES`).
        on_change: called on an I/O thread after the primary changed: ``on_change(kept)``, ``kept`` True when
            the new primary continues the old one's data set (a failover), False for a new data set (a restart).

    Raises:
        RedisStartupError: the server is unreachable, refuses the credentials or the probe failed.
    """

    def __init__(
        self, settings: RedisSettings, namespace: Namespace, block_bytes: int, tenants: TenantPolicy | None
    ) -> None:
        self.settings = settings
        self.layout = KeyLayout(settings["prefix"])
        self.digest = namespace.digest
        self._digest_bytes = namespace.digest_bytes
        self.object_bytes = HEADER_SIZE + block_bytes
        self.ttl_s: int | None = settings["ttl_s"]
        self.tenants = tenants
        self.location = settings.location()
        self.is_cluster = settings["mode"] == "cluster"
        self.counters = Counters(COUNTERS)
        self.on_change: Callable[[bool], None] = lambda kept: None
        try:
            self.client: Any = settings.make_client()
        except Exception as exc:
            raise RedisStartupError(
                f"redis tier: cannot connect to {self.location}: {settings.redact(str(exc))}", classify_error(exc)
            ) from None
        self._record = json.dumps({**namespace.to_dict(), "digest": self.digest}, indent=1, sort_keys=True).encode()
        try:
            self.server: ServerInfo = probe(
                self.client, self.layout, self.digest, self._record, self.location, settings.redact
            )
        except BaseException:
            self.client.close()
            raise
        self._primaries = self.server.identity
        self._recheck = False  # set by connection errors: was the server restarted meanwhile?
        self._check_lock = threading.Lock()
        self._next_check = 0.0  # monotonic time of the next run_id check (connection trouble asks at once)
        self._presence = PresenceQuery(
            self.client, self.layout.base(self.digest) + ":", self.object_bytes, self.is_cluster
        )

    def block_key(self, key: bytes) -> str:
        """The Redis key of block ``key``."""
        return self.layout.block_key(self.digest, key)

    # -- primitives -------------------------------------------------------------------
    def put_many(self, keys: Sequence[OffloadKey], views: Sequence[memoryview]) -> list[Any]:
        """``SET NX`` (``EX`` per :meth:`expiry`) of header + ``views[i]`` under ``keys[i]``, in one round trip.

        Returns:
            One per block, in order: a true value (stored by this call), a false one (another writer
            stored it first: its bytes are never rewritten) or the exception of that block.

        Raises:
            redis.exceptions.RedisError: the whole pipeline failed (every retry of the client's ``Retry``).
        """
        self._before_round_trip()
        digest = self._digest_bytes
        if self.is_cluster:
            pipe = self.client.pipeline(transaction=False)
            for key, view in zip(keys, views, strict=True):
                pipe.set(self.block_key(key), b"".join((encode_header(digest, key, view), view)), nx=True,
                         ex=self.expiry(key))  # fmt: skip
            return list(pipe.execute(raise_on_error=False))
        parts: list[bytes | memoryview] = []
        for key, view in zip(keys, views, strict=True):
            header = encode_header(digest, key, view)
            parts += set_nx_parts(self.block_key(key).encode(), header, view, self.expiry(key))
        return run_on_connection(self.client, parts, len(keys))

    def get_many(self, keys: Sequence[OffloadKey], views: Sequence[memoryview]) -> list[BaseException | None]:
        """``GET`` of ``keys`` in one round trip, each value verified and its payload moved into ``views[i]``.

        Returns:
            One per block, in order: None (loaded and verified), :class:`BlockMissingError` (no such key),
            a :class:`~tiering.core.format.BlockFormatError` (a value that does not verify: the view's bytes are
            not to be used) or the block's own error. A whole pipeline that failed gives its error for each.
        """
        if not keys:
            return []
        try:
            replies = self._send_loads(keys, views)
        except Exception as exc:
            self.count_error(exc, f"load of {len(keys)} blocks")
            return [exc] * len(keys)
        out: list[BaseException | None] = []
        for key, view, reply in zip(keys, views, replies, strict=True):
            if reply is None:
                out.append(BlockMissingError(self.block_key(key)))
            elif isinstance(reply, Exception):
                out.append(reply)
            else:
                out.append(self._verify_into(key, reply, view))
        return out

    def present(self, keys: Sequence[OffloadKey], touch: bool = True) -> list[bool]:
        """Whether each block exists (:class:`~tiering.redis.presence.PresenceQuery`; ``touch``: an LRU access).

        Raises:
            redis.exceptions.RedisError: a node could not be asked.
        """
        self._before_round_trip()
        return self._presence(keys, touch)

    def delete_many(self, keys: Sequence[OffloadKey]) -> list[bool]:
        """``UNLINK`` of ``keys`` in one round trip; whether each delete was answered (a key already gone counts)."""
        if not keys:
            return []
        self._before_round_trip()
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.unlink(self.block_key(key))
        try:
            results = pipe.execute(raise_on_error=False)
        except Exception as exc:
            self.count_error(exc, f"UNLINK of {len(keys)} blocks")
            return [False] * len(keys)
        return [not isinstance(r, Exception) for r in results]

    def scan(self) -> list[OffloadKey]:
        """The namespace's blocks on the server now (``SCAN`` + ``EXISTS``: not an access for the server's LRU).

        Raises:
            redis.exceptions.RedisError: the scan failed.
        """
        kwargs: dict[str, Any] = {"match": self.layout.pattern(self.digest), "count": 1000}
        if self.is_cluster:
            kwargs["target_nodes"] = "primaries"
        keys: list[OffloadKey] = []
        for name in self.client.scan_iter(**kwargs):
            parsed = self.layout.parse(name)
            if parsed is not None and parsed[1] == "block" and parsed[2] is not None:
                keys.append(OffloadKey(parsed[2]))
        found: list[OffloadKey] = []
        for start in range(0, len(keys), 4096):
            batch = keys[start : start + 4096]
            found += [key for key, flag in zip(batch, self.present(batch, touch=False), strict=True) if flag]
        return found

    def write_record(self) -> None:
        """``SET NX`` of the namespace record (again after a restart emptied the server); a failure is counted."""
        try:
            self.client.set(self.layout.namespace_key(self.digest), self._record, nx=True)
        except Exception as exc:
            self.count_error(exc, "writing the namespace record again")

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()

    # -- helpers --------------------------------------------------------------------------
    def expiry(self, key: OffloadKey) -> int | None:
        """The ``EX`` of block ``key``: its tenant's TTL (whole seconds, rounded up), at most ``ttl_s``."""
        return self.ttl_s if self.tenants is None else self.tenants.ttl_seconds(key, self.ttl_s)

    def count_error(self, exc: BaseException, what: str) -> str:
        """Count and log a failed request (no credential in the log); returns its class."""
        cause = classify_error(exc)
        if cause in _RECHECK_CAUSES:
            self._recheck = True
        self.counters.inc(f"errors_{cause}")
        text = self.settings.redact(f"{type(exc).__name__}: {exc}")
        if cause == "other":
            logger.error("redis tier: %s failed: %s", what, text)
        else:
            logger.warning("redis tier: %s failed (%s): %s", what, cause, text)
        return cause

    def pipeline(self, transaction: bool = False) -> Any:
        """A pipeline of the client (counted; the primary checked first), for the fleet's and the pins' commands."""
        self._before_round_trip()
        return self.client.pipeline(transaction=transaction)

    def _before_round_trip(self) -> None:
        self.counters.inc("pipelines")
        # Never when the start-up probe could not read INFO (an ACL): there is nothing to compare.
        if self._primaries.run_ids and (self._recheck or time.monotonic() >= self._next_check):
            self._check_primary()

    def _check_primary(self) -> None:
        """Did the primary change (new ``run_id``)? Tell :attr:`on_change`, once per change.

        A promoted replica continues the old primary's replication history
        (:meth:`~tiering.redis.probe.Primaries.continues`): ``kept``. One I/O
        thread checks at a time (the others go on with their pipelines).
        """
        if not self._check_lock.acquire(blocking=False):
            return  # another I/O thread is checking
        try:
            self._next_check = time.monotonic() + RUN_ID_CHECK_S
            try:
                now = primaries(self.client)
            except Exception:
                return  # still down (or no primary yet): the batch fails, and the next one asks again
            self._recheck = False
            if not now.run_ids or now.run_ids == self._primaries.run_ids:
                return
            kept = now.continues(self._primaries)
            self._primaries = now
            self.on_change(kept)
        finally:
            self._check_lock.release()

    def _send_loads(self, keys: Sequence[OffloadKey], views: Sequence[memoryview]) -> list[Any]:
        """``GET`` in one round trip: into the views (:func:`~tiering.redis.wire.get_into`), or a cluster pipeline."""
        self._before_round_trip()
        names = [self.block_key(key) for key in keys]
        if self.is_cluster:
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.get(name)
            return list(pipe.execute(raise_on_error=False))
        return get_into(self.client, [n.encode() for n in names], views, HEADER_SIZE)

    def _verify_into(self, key: OffloadKey, reply: bytes | InSlot, view: memoryview) -> BlockFormatError | None:
        """Verify a ``GET`` reply, its payload moved into (or already read into) ``view``; None or why not."""
        try:
            if isinstance(reply, InSlot):
                header: memoryview = memoryview(reply.header)
                payload, stored = view, self.object_bytes
            else:
                value = memoryview(reply)
                if value.nbytes != self.object_bytes:
                    raise TruncatedBlockError(f"value is {value.nbytes} bytes, expected {self.object_bytes}")
                header, payload, stored = value[:HEADER_SIZE], value[HEADER_SIZE:], value.nbytes
            verify_block(header, payload, self._digest_bytes, key, stored_size=stored)
        except BlockFormatError as exc:
            logger.warning(
                "redis tier: block %s is unusable (%s): %s; deleting it", self.block_key(key), exc.reason, exc
            )
            return exc
        if not isinstance(reply, InSlot):
            view[:] = payload
        return None
