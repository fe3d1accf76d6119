"""The redis tier's connection to its server: the client, the start-up probe, a watch on the primary, errors counted.

:class:`ServerConnection` is an I/O helper of :class:`~tiering.redis.medium.RedisMedium`:
it opens the redis-py client (one connection per thread that uses it, so
none waits for another), runs the start-up probe
(:func:`~tiering.redis.probe.probe`), counts round trips (``pipelines``) and
failed requests by class (``errors_<class>``, logged without credentials),
and before a round trip asks whether the primary changed
(:class:`~tiering.redis.probe.PrimaryWatch`): a restart (``server_restarts``,
the namespace record is written again) or a failover (``failovers``). It
holds no index: what a change means for the blocks known is the store's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from tiering.core.store.stats import Counters
from tiering.redis.config import RedisSettings
from tiering.redis.errors import ERROR_CLASSES, RedisStartupError, classify_error
from tiering.redis.layout import KeyLayout
from tiering.redis.probe import PrimaryWatch, probe

logger = logging.getLogger(__name__)

T = TypeVar("T")

COUNTERS = ("pipelines", "failovers", "server_restarts", *(f"errors_{c}" for c in ERROR_CLASSES))
"""The connection's figures (``stats()`` keys)."""

_RECHECK = ("connection", "timeout", "loading", "readonly")
"""Error classes a change of primary explains: the next round trip asks whether it changed."""


class ServerConnection:
    """The client of one tier and what it learnt about the server (see the module doc).

    Args:
        settings: the validated entry.
        layout: the tier's key layout.
        digest: the namespace digest (hex).
        record: the namespace record (JSON), written with ``SET NX`` by the probe and after a restart.
        threads: threads besides the ``max_connections`` I/O threads that use the client (scans, deletes).
        on_change: called once per change of primary, before it is counted: ``on_change(kept)`` (see
            :class:`~tiering.redis.probe.PrimaryWatch`).

    Attributes:
        client: the redis-py client (:class:`redis.Redis` or :class:`redis.cluster.RedisCluster`).
        info: what the start-up probe learnt (``maxmemory``, policy, primaries).
        location: where the server is, for messages (no credentials).
        counters: :data:`COUNTERS`.

    Raises:
        RedisStartupError: the server is unreachable, refuses the credentials or the probe failed.
    """

    def __init__(
        self,
        settings: RedisSettings,
        layout: KeyLayout,
        digest: str,
        record: bytes,
        threads: int,
        on_change: Callable[[bool], None],
    ) -> None:
        self.settings = settings
        self.location = settings.location()
        self.counters = Counters(COUNTERS)
        self._record_key, self._record = layout.namespace_key(digest), record
        self._on_change = on_change
        try:
            n = settings["max_connections"] + threads  # a connection per thread: none waits for another
            self.client: Any = RedisSettings({**settings.values, "max_connections": n}).make_client()
        except Exception as exc:
            raise RedisStartupError(
                f"redis tier: cannot connect to {self.location}: {settings.redact(str(exc))}", classify_error(exc)
            ) from None
        try:
            self.info = probe(self.client, layout, digest, record, self.location, settings.redact)
        except BaseException:
            self.client.close()
            raise
        self.watch = PrimaryWatch(self.client, self.info.identity, self._changed)

    def round_trip(self) -> None:
        """Before a request: count it, and ask whether the primary changed when that is due."""
        self.counters.inc("pipelines")
        self.watch.check()

    def pipeline(self, transaction: bool = False) -> Any:
        """A pipeline of the client, after :meth:`round_trip`."""
        self.round_trip()
        return self.client.pipeline(transaction=transaction)

    def count_error(self, exc: BaseException, what: str) -> str:
        """Count and log a failed request (no credential in the log); returns its class."""
        cause = classify_error(exc)
        if cause in _RECHECK:
            self.watch.suspect()
        self.counters.inc(f"errors_{cause}")
        text = self.settings.redact(f"{type(exc).__name__}: {exc}")
        (logger.error if cause == "other" else logger.warning)("redis tier: %s failed (%s): %s", what, cause, text)
        return cause

    def guarded(self, what: str, call: Callable[[], T]) -> T | None:
        """``call()``; a failure is counted (:meth:`count_error`) and None returned instead."""
        try:
            return call()
        except Exception as exc:
            self.count_error(exc, what)
            return None

    def write_record(self) -> None:
        """``SET NX`` of the namespace record (again after a restart emptied the server); a failure is counted."""
        self.guarded("writing the namespace record", lambda: self.client.set(self._record_key, self._record, nx=True))

    def _changed(self, kept: bool) -> None:
        self._on_change(kept)
        self.counters.inc("failovers" if kept else "server_restarts")  # after the reaction: whoever sees it waits
        if kept:
            logger.warning("redis tier: %s failed over (new run_id) to a replica of the old primary; keeping the "
                           "known blocks", self.location)  # fmt: skip
        else:
            logger.warning("redis tier: %s restarted (new run_id, a new data set); forgetting the blocks it may no "
                           "longer hold", self.location)  # fmt: skip
            self.write_record()

    def close(self) -> None:
        """Close the client's connections."""
        self.client.close()
